"""The "setups kept" gate: setups that work on Lightning today must still work with a patch.

Each case of ``repro/kept_behaviour.py`` (``requires_grad`` toggled per step or per epoch, a block
frozen by hand, a module frozen in ``__init__`` across a resume, the user's hooks, ``static_graph``,
manual optimization, resuming mid-epoch and at an epoch's end) is a two-rank DDP fit that checks
what it is about, under the replica check. It runs in the patch's *before* environment (the cell
with the earlier patches of the series) and in its *after* environment (with this patch too). A
case that is good before and not good after fails the gate, by name; so do a case that could not
run at all before (the harness's error) and a gate that checked nothing. A case bad or untestable
before is not counted, and the text says so.

The *after* of one patch is the *before* of the next in the same cell: a verdict is kept per
(cell, patches applied, case) for the life of the process and not run again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tools.launch.launcher import Launcher, Run
from tools.series.upstream_tests import gate

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "repro" / "kept_behaviour.py"
SIGNATURE = r"(?:^|\n)kept: "  # the line a case prints when what it is about broke
TIMEOUT = 300.0  # seconds: one case is two fits of a tiny model; a hang must end
_VERDICTS: dict[tuple, tuple[str, str]] = {}


def cases() -> list[str]:
    """The cases, as the script lists them (it needs neither torch nor Lightning for that)."""
    out = subprocess.run([sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, check=True)
    return [line.split(":", 1)[0] for line in out.stdout.splitlines() if line.strip()]


def verdict(side: tuple[Path, dict], applied: tuple[str, ...], cell: str, case: str,
            log_stem: Path) -> tuple[str, str]:
    """(verdict, why) of one case in one environment (its Python, and variables on top of this
    process's: a patched copy on ``PYTHONPATH``, as the tests make one); ``applied`` names the
    patches in it."""
    key = (cell, applied, case)
    if key not in _VERDICTS:
        python, env = side
        r = Launcher().run(Run((str(SCRIPT), "--case", case), python, env=env, log_stem=log_stem,
                               timeout=TIMEOUT, signature=SIGNATURE, check_replicas="epoch"))
        record = r.record or {}
        # the case's own words ("kept: ...") first, else the replica check's or the harness's
        why = record.get("signature") or r.reason or (record.get("details") or {}).get("summary") or ""
        _VERDICTS[key] = (r.verdict, why)
    return _VERDICTS[key]


def kept_gate(before: Path, after: Path, earlier: tuple[str, ...], applied: tuple[str, ...], cell: str,
              logs: Path, only: list[str] | None = None, envs: tuple[dict, dict] = ({}, {}),
              log=print) -> dict:
    """Every case (or those of ``only``) in the Python ``before`` (the patches ``earlier``
    applied) and in ``after`` (the patches ``applied``: with this one, when it applied);
    ``envs``: each side's variables.

    It fails on a case good before and not good after, on a case that could not run at all before
    (the harness's error: the gate would not know), and when no case was good before (nothing
    was checked)."""
    before, after = (before, envs[0]), (after, envs[1])
    broken, uncounted, kept, unrun = [], [], [], []
    for case in only or cases():
        was, why_before = verdict(before, earlier, cell, case, logs / f"{case}-before")
        now, why = verdict(after, applied, cell, case, logs / f"{case}-after")
        log(f"    setup {case}: before {was}, after {now}")
        if was == "error":
            unrun.append(f"{case} ({why_before})")
        elif was != "good":
            uncounted.append(f"{case} ({was} before)")
        elif now != "good":
            broken.append(f"{case} ({now} after: {why})")
        else:
            kept.append(case)
    text = f"{len(kept)} of {len(kept) + len(broken)} setups that work before still work"
    if broken:
        text += "; broken: " + "; ".join(broken)
    if unrun:
        text += "; could not run before: " + "; ".join(unrun)
    if uncounted:
        text += "; not counted: " + ", ".join(uncounted)
    if not kept and not broken:
        text += " (nothing was checked)"
    return gate(kept and not broken and not unrun, text)
