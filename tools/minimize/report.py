"""``report.md`` of a minimization: sizes, launches, time, the result's fresh runs, the versions."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tools.minimize.options import Config
from tools.minimize.oracle import Oracle, clock
from tools.minimize.source import size


def versions(python: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, platform\n"
            "out = {'python': platform.python_version()}\n"
            "for p in ('torch', 'lightning', 'pytorch-lightning'):\n"
            "    try:\n        out[p] = m.version(p)\n    except m.PackageNotFoundError:\n        pass\n"
            "print(json.dumps(out))")
    try:
        proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
        return json.loads(proc.stdout)
    except (subprocess.TimeoutExpired, ValueError):
        return {"python": "?"}


def report(cfg: Config, oracle: Oracle, original: dict[str, str], final: dict[str, str | None],
           ended: str, confirmed: list[tuple[bool, str, bool]], seconds: float,
           control: tuple[bool, str, bool] | None = None) -> str:
    o_lines, o_tokens = oracle.original_size  # formatted, as the progress line counts it
    lines, tokens = size(final)
    seen = sum(ok for ok, *_ in confirmed)
    vers = versions(cfg.python)
    s = oracle.stats
    rows = "\n".join(f"| {why} | {n} |" for why, n in sorted(s.outcomes.items(), key=lambda kv: -kv[1]))
    removed = [n for n, src in final.items() if src is None]
    on_control = "" if control is None else (
        f"\n- **On the control ({cfg.control_where}), where the bug is fixed, it is "
        f"{'good' if control[0] else f'not good ({control[1]})'} in a fresh run.**")
    return f"""# Minimized: {cfg.script.name}

Signature: {f'`/{cfg.signature}/`' if cfg.signature else
             'replicas diverge (`--check-replicas`)' if cfg.check_replicas else 'the verdict line'}{
    f", raised as `{oracle.site[0]}` in `{oracle.site[1]}` (`{oracle.site[2]}`)" if oracle.site else ''}
Versions: {', '.join(f'{k} {v}' for k, v in vers.items())} ({cfg.where})

| | lines | tokens |
|---|---|---|
| original | {o_lines} | {o_tokens} |
| minimized | {lines} | {tokens} ({100 * lines / max(o_lines, 1):.0f} % of the lines) |

- Files reduced: {', '.join(n for n in original if final.get(n) is not None)}{
    f"; removed as unneeded: {', '.join(removed)}" if removed else ''}
- Bug rate of the original: {oracle.rate:.2f}; runs per candidate: {oracle.trials}
- Reduction: {s.tests} launches, {s.cache_hits} answered from the cache, {s.static} candidates
  rejected without a launch, {s.improvements} improvements, {clock(seconds)}; it ended because
  {ended}.
- **The minimized script shows the signature in {seen} of {len(confirmed)} fresh runs.**{
    ''.join(f"{chr(10)}  - not bad in a fresh run: {why}" for ok, why, _ in confirmed if not ok)}{on_control}

Why candidates were not interesting:

| reason | candidates |
|---|---|
{rows or '| (none) | 0 |'}

Run it: `python {'minimized.py' if len(original) == 1 else f'minimized/{cfg.script.name}'}{
    ' ' + ' '.join(cfg.args) if cfg.args else ''}`
"""
