"""The #20706 stress catalogue's orchestration: every run under the harness, its outcome per
rank, the summary table and the verdict line.

The catalogue itself (scenarios, the rank worker, the outcome classification) stays in
``repro/ddp_weakref_stress.py``, runnable with plain ``python``; that script hands its parsed
options and itself (``script``) to ``orchestrate``.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from tools.core.contract import BAD, GOOD, SKIP
from tools.launch import harness


def run_one(args, script, name: str, seed: int, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    nodes, per_node = getattr(args, "nodes", 1), getattr(args, "ranks_per_node", 2)
    world, accelerator = nodes * per_node, getattr(args, "accelerator", "cpu")
    if nodes > 1:  # each node a torchrun, as on a cluster (tools/nodes.py)
        from tools.launch import nodes as multinode

        cmd = [sys.executable, script.__file__, "--worker", name, "--seed", str(seed),
               "--out", str(folder), "--import-name", args.import_name,
               "--collective-timeout", str(args.collective_timeout), "--accelerator", accelerator]
        result = multinode.run_job(cmd, nodes=nodes, per_node=per_node,
                               timeout=args.run_timeout, log_stem=folder / "run", peer_grace=15)
    elif args.fresh_process:
        cmd = [sys.executable, script.__file__, "--worker", name, "--seed", str(seed),
               "--out", str(folder), "--import-name", args.import_name,
               "--collective-timeout", str(args.collective_timeout), "--accelerator", accelerator,
               "--ranks-per-node", str(per_node)]
        result = harness.run(cmd, timeout=args.run_timeout, log_stem=folder / "run", peer_grace=15)
    else:
        result = harness.run_forked(lambda: script.forked_worker(args, name, seed, folder),
                                    timeout=args.run_timeout, log_stem=folder / "run", peer_grace=15)
    ranks = {}
    for r in range(world):
        path = folder / f"rank{r}.json"
        ranks[r] = json.loads(path.read_text()) if path.exists() else None
    failed = any(v and v["outcome"] != "ok" for v in ranks.values())
    for r, v in ranks.items():
        if v is None:  # killed: blocked in a collective when its peer died, or hung
            ranks[r] = {"rank": r, "outcome": "peer_failure" if failed else "timeout",
                        "step": None, "error": result.reason}
    outcomes = [ranks[r]["outcome"] for r in range(world)]
    return {"scenario": name, "seed": seed, "outcomes": outcomes,
            "steps": [ranks[r]["step"] for r in range(world)],
            "errors": [ranks[r]["error"] for r in range(world)], "seconds": result.seconds,
            "harness": {"verdict": result.verdict, "reason": result.reason},
            "run": min(outcomes, key=script.OUTCOMES.index)}


def meets(expect: str, runs: list[dict]) -> bool:
    runs = [r for r in runs if set(r["outcomes"]) != {"not_applicable"}]
    if not runs:
        return True
    seen = {o for r in runs for o in r["outcomes"]}
    if expect == "signature":
        return all(set(r["outcomes"]) == {"signature"} for r in runs)
    if expect == "signature-sometimes":
        return "signature" in seen
    if expect == "no-signature":
        return "signature" not in seen and "timeout" not in seen
    return seen == {"ok"}


def summary_markdown(runs: list[dict], selected: list) -> str:
    lines = ["| scenario | kind | expect | runs | outcomes (rank 0 / rank 1 / ...) | steps | s/run | meets |",
             "|---|---|---|---|---|---|---|---|"]
    for sc in selected:
        mine = [r for r in runs if r["scenario"] == sc.name]
        if not mine:
            continue
        counts: dict[str, int] = {}
        for r in mine:
            key = " / ".join(r["outcomes"])
            counts[key] = counts.get(key, 0) + 1
        outcomes = "; ".join(f"{k} x{v}" for k, v in sorted(counts.items()))
        steps = sorted({s for r in mine for s, o in zip(r["steps"], r["outcomes"], strict=True)
                        if o in ("signature", "clear_error") and s is not None})
        secs = sum(r["seconds"] for r in mine) / len(mine)
        lines.append(f"| {sc.name} | {sc.kind} | {sc.expect} | {len(mine)} | {outcomes} | "
                     f"{', '.join(map(str, steps)) or '-'} | {secs:.1f} | "
                     f"{'yes' if meets(sc.expect, mine) else 'NO'} |")
    return "\n".join(lines) + "\n"


def _summary_line(runs, selected, unmet) -> str:
    hits = [r for r in runs if "signature" in r["outcomes"]]
    controls = [sc.name for sc in selected if sc.kind == "control"]
    dirty = [name for name in unmet if name in controls]
    line = f"signature in {len(hits)}/{len(runs)} runs"
    clear = [r for r in runs if "clear_error" in r["outcomes"]]
    if clear:
        line += f", clear error in {len(clear)}/{len(runs)}"
        line += " (on every rank)" if all(set(r["outcomes"]) == {"clear_error"} for r in clear) else ""
    by_scenario: dict[str, list[bool]] = {}
    for r in runs:
        by_scenario.setdefault(r["scenario"], []).append(set(r["outcomes"]) == {"clear_error"})
    everywhere = {name for name, flags in by_scenario.items() if all(flags)}
    if controls:
        line += "; controls clean" if not dirty else f"; controls NOT clean: {', '.join(dirty)}"
    # a scenario that ends in the clear error on every rank is what a fix should give, not a miss
    missing = [n for n in unmet if n not in controls and n not in everywhere]
    if missing:
        line += f"; expected crash missing: {', '.join(missing)}"
    return line


def orchestrate(args, script) -> None:
    # a SIGTERM from an outer harness unwinds through harness.run, which kills the current run
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    selected = script.select(args)
    if not selected:
        raise script.UsageError(f"no scenario matches --filter {args.filter!r}")
    # without --out, the runs' folders are temporary: removed before the verdict line
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ddp-weakref-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        jsonl = out / "runs.jsonl"
        jsonl.write_text("")
        if not args.fresh_process and getattr(args, "nodes", 1) == 1:  # several nodes: torchrun starts them
            why = script.preload(args.import_name)
            if why:
                args.fresh_process = True
                print(f"[stress] preloading failed ({why}): every run in a fresh process",
                      file=sys.stderr)
        start, runs = time.monotonic(), []
        plan = [(sc, i) for sc in selected for i in range(args.repeat if sc.kind == "gc" else 1)]
        for n, (sc, i) in enumerate(plan, 1):
            if args.budget and time.monotonic() - start > args.budget:
                print(f"[stress] budget of {args.budget:g} s spent: {len(plan) - n + 1} runs left out",
                      file=sys.stderr)
                break
            run = run_one(args, script, sc.name, args.seed + i, out / f"{sc.name}-{i}")
            runs.append(run)
            with jsonl.open("a") as fh:
                fh.write(json.dumps(run) + "\n")
            print(f"[stress {n}/{len(plan)}] {sc.name}: {' / '.join(run['outcomes'])} "
                  f"steps {run['steps']} ({run['seconds']:.1f} s, elapsed "
                  f"{time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
        table = summary_markdown(runs, selected)
        (out / "summary.md").write_text(table)
        print(table, file=sys.stderr)
        signature_runs = [r for r in runs if "signature" in r["outcomes"]]
        unmet = [sc.name for sc in selected
                 if [r for r in runs if r["scenario"] == sc.name]
                 and not meets(sc.expect, [r for r in runs if r["scenario"] == sc.name])]
        could_run = [r for r in runs if set(r["outcomes"]) - {"other_error", "timeout"}]
        details = {"runs": len(runs), "signature_runs": len(signature_runs),
                   "scenarios_with_signature": sorted({r["scenario"] for r in signature_runs}),
                   "unmet_expectations": unmet,
                   "results": str(out) if args.out else "not kept (give --out)",
                   "summary": _summary_line(runs, selected, unmet),
                   "launch": "fresh-process" if args.fresh_process else "fork",
                   "wall_seconds": round(time.monotonic() - start, 1)}
        if not could_run:
            details["reason"] = "no scenario could run (every run failed for other reasons)"
            code = SKIP
        elif args.strict:
            code = BAD if unmet else GOOD
        else:
            code = BAD if signature_runs else GOOD
        signature = None
        if signature_runs:
            first = signature_runs[0]
            signature = (f"AttributeError: {script.SIGNATURE} in {len(signature_runs)} of {len(runs)} runs "
                         f"(first: {first['scenario']}, step {first['steps']})")
        if args.strict and unmet:
            signature = f"expectations not met: {', '.join(unmet)}"
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    import_name = None
    try:
        import torch  # noqa: F401  (versions in the verdict line)

        _, import_name = script.import_lightning(args.import_name)
    except Exception as err:
        details.setdefault("reason", f"import failed: {err}")
    script.finish(script.REPRO, code, signature, details, import_name)
