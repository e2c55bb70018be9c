"""#20706, torch: what each design of ``_DDPSink.backward`` for a freed DDP module does to every
stress scenario.

    python bench/torch_designs.py [--cell pl2_6_6_torch2_13_0] [--repeat 3] [--filter REGEX] [--out DIR]

Four environments of the cell: torch as released (the cached cell environment, not modified),
and three throwaway ones (uv, from its cache) with torch patched:

- **A, clear error**: the series' torch patch: a ``RuntimeError`` naming the cause;
- **B, skip**: when the DDP instance is gone, return the gradients as they are, no reducer work;
- **C, keep the reducer**: the sink's node holds the instance's reducer (and with it the
  reducer's gradient hooks) as torch did before 2.1, and when the instance is gone does what
  torch 2.0's sink did: enqueue the delayed all-reduce on a static graph's first backward.

In each: the whole catalogue of ``repro/ddp_weakref_stress.py`` (every run under the harness, the
GC-timing scenarios ``--repeat`` times) and one scenario the catalogue lacks,
``static_graph_gc_one_rank``: the first iteration of a ``static_graph=True`` wrapper (whose sink
enqueues its reducer's delayed all-reduce) kept across a re-wrap, the old wrapper in a reference
cycle and collected on rank 1 only. Prints one Markdown table (each run's outcome rank by rank,
``@step``, and the run's wall time: a rank blocked in a collective shows as ``peer_failure`` with
the seconds it took) and, per design, how the runs ended and the errors seen.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
STRESS = ROOT / "repro" / "ddp_weakref_stress.py"
EXTRA = "static_graph_gc_one_rank"

# Design B (the alternative, not in the series): pass the gradients through when the DDP instance
# that built the graph is gone.
SKIP_DIFF = """\
--- a/torch/nn/parallel/distributed.py
+++ b/torch/nn/parallel/distributed.py
@@ -397,2 +397,4 @@
         ddp_weakref = ctx.ddp_weakref()
+        if ddp_weakref is None:  # the DDP instance that built this graph is gone
+            return (None, *grad_outputs)
         reducer = ddp_weakref.reducer
"""

# Design C (not in the series either): the node keeps the reducer alive, as before torch 2.1.
KEEP_REDUCER_DIFF = """\
--- a/torch/nn/parallel/distributed.py
+++ b/torch/nn/parallel/distributed.py
@@ -385,2 +385,5 @@
         ctx.ddp_weakref = ddp_weakref
+        ddp = ddp_weakref()  # design C: the node keeps the reducer, as before torch 2.1
+        ctx.reducer = ddp.reducer
+        ctx.delay_all_reduce = ddp.static_graph and not ddp._static_graph_delay_allreduce_enqueued
         ret = inputs
@@ -397,2 +400,6 @@
         ddp_weakref = ctx.ddp_weakref()
+        if ddp_weakref is None:  # the instance is gone; its reducer is not
+            if ctx.delay_all_reduce:
+                Variable._execution_engine.queue_callback(ctx.reducer._delay_all_reduce)
+            return (None, *grad_outputs)
         reducer = ddp_weakref.reducer
"""

# ---- the extra scenario, run inside a design's environment (``--inner``) ---------------------

_SCRIPT = None  # repro/ddp_weakref_stress.py, imported in the inner process


def static_graph_gc_one_rank(ctx):
    """static_graph=True: the first iteration's output (its sink enqueues the reducer's delayed
    all-reduce) kept across a re-wrap; the old wrapper in a reference cycle, collected on rank 1
    only (automatic collection off); then three steps of the new wrapper and a check that the
    replicas' gradients agree."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    step = _SCRIPT.STEP
    gc.disable()
    dist.init_process_group("gloo", rank=ctx.rank, world_size=2,
                            timeout=timedelta(seconds=ctx.collective_timeout))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone, self.head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)

        def forward(self, x, embed_only=False):
            if embed_only:  # saves no parameter for backward: survives the re-wrap's broadcast
                return self.backbone(x)
            return self.head(torch.relu(self.backbone(x)))

    torch.manual_seed(0)
    model = Net()
    gen = torch.Generator().manual_seed(ctx.rank)
    old = DistributedDataParallel(model, static_graph=True)
    step[0] += 1
    kept = old(torch.randn(4, 8, generator=gen), embed_only=True)
    old.keep_alive = [old]  # a reference cycle: freed only by a full collection
    del old
    new = DistributedDataParallel(model, static_graph=True)
    if ctx.rank == 1:
        gc.collect()
    for _ in range(3):
        step[0] += 1
        loss = new(torch.randn(4, 8, generator=gen)).sum()
        if kept is not None:
            loss, kept = loss + kept.sum(), None
        loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    both = [torch.empty_like(grads) for _ in range(2)]
    dist.all_gather(both, grads)
    if not torch.equal(both[0], both[1]):
        raise RuntimeError("the replicas' gradients differ after the steps")


def inner(out: str, repeat: int) -> None:
    global _SCRIPT
    sys.path.insert(0, str(ROOT / "repro"))
    import ddp_weakref_stress as script

    _SCRIPT = script
    script.scenario("gc", "signature-sometimes")(static_graph_gc_one_rank)
    script.main(["--scenario", EXTRA, "--out", out, "--repeat", str(repeat)])


# ---- the designs, each in its environment -----------------------------------------------------

def designs() -> list[tuple[str, object, str | None]]:
    from tools.series import patches

    torch_patch = next(p for p in patches.series() if p.target == "torch")
    skip = patches.Patch(Path("design-b-skip.patch"), {"X-Target": "torch"}, SKIP_DIFF)
    keep = patches.Patch(Path("design-c-keep-reducer.patch"), {"X-Target": "torch"}, KEEP_REDUCER_DIFF)
    return [("as released", None, None),
            (f"A: clear error ({torch_patch.name})", torch_patch, torch_patch.installable_diff()),
            ("B: skip", skip, SKIP_DIFF),
            ("C: keep the reducer", keep, KEEP_REDUCER_DIFF)]


def runs_of(python: Path, out: Path, cmd: list[str], log: Path) -> list[dict]:
    with log.open("w") as fh:
        proc = subprocess.run([str(python), *cmd, "--out", str(out)], cwd=ROOT,
                              stdout=fh, stderr=subprocess.STDOUT)
    path = out / "runs.jsonl"
    if proc.returncode >= 128 or not path.exists():
        raise SystemExit(f"{' '.join(cmd[:2])} failed (exit {proc.returncode}); see {log}")
    runs = [json.loads(line) for line in path.read_text().splitlines()]
    for r in runs:  # the run's own folder (the stress orchestrator's naming, default seed 0)
        r["dir"] = str(out / f"{r['scenario']}-{r['seed']}")
    return runs


def measure(python: Path, out: Path, a) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    stress = [str(STRESS), "--repeat", str(a.repeat), *(["--filter", a.filter] if a.filter else [])]
    runs = runs_of(python, out / "catalogue", stress, out / "catalogue.log")
    if not a.filter or re.search(a.filter, EXTRA):
        runs += runs_of(python, out / "extra", [__file__, "--inner", "--repeat", "1"],
                        out / "extra.log")
    return runs


# ---- the table -------------------------------------------------------------------------------

def _rank(rank: int, outcome: str, step, error: str | None) -> str:
    if step is None and (error or "").startswith("killed by"):  # the run's leader (rank 0) died
        return f"died ({error.removeprefix('killed by ')})" if rank == 0 else "killed with the run"
    return outcome if outcome == "ok" or step is None else f"{outcome}@{step}"


def cell(runs: list[dict]) -> str:
    seen: dict[str, list[float]] = {}
    for r in runs:
        key = " / ".join(_rank(i, o, s, e) for i, (o, s, e) in
                         enumerate(zip(r["outcomes"], r["steps"], r["errors"], strict=True)))
        seen.setdefault(key, []).append(r["seconds"])
    return "; ".join(f"{k} x{len(v)} ({min(v):.1f}-{max(v):.1f} s)" if len(v) > 1 else
                     f"{k} ({v[0]:.1f} s)" for k, v in seen.items())


def _peer_end(error: str | None) -> str:
    text = error or ""
    if re.search(r"closed by peer|reset by peer|Broken pipe", text, re.I):
        return "its collective failed when the peer's process exited"
    if re.search(r"timed out|Timed out waiting", text, re.I):
        return "its collective timed out"
    return f"ended by the harness ({text[:60]})"


def notes(name: str, runs: list[dict]) -> list[str]:
    ends: dict[str, int] = {}
    errors: dict[str, set[str]] = {}
    for r in runs:
        o = r["outcomes"]
        died = [e for e, s in zip(r["errors"], r["steps"], strict=True)
                if s is None and (e or "").startswith("killed by")]
        if died:
            stderr = Path(r["dir"]) / "run.stderr"
            what = [line.rsplit("] ", 1)[-1] for line in (stderr.read_text(errors="replace")
                                                          .splitlines() if stderr.exists() else [])
                    if "what():" in line]
            key = f"rank 0 {died[0]}{' (' + what[0][:150] + ')' if what else ''}"
            ends[key] = ends.get(key, 0) + 1
        elif set(o) == {"ok"}:
            ends["both ranks complete"] = ends.get("both ranks complete", 0) + 1
        elif "peer_failure" in o and len(set(o)) == 2:
            failing = next(x for x in o if x != "peer_failure")
            key = f"one rank {failing}, the peer: {_peer_end(r['errors'][o.index('peer_failure')])}"
            ends[key] = ends.get(key, 0) + 1
        else:
            key = "both ranks " + " / ".join(o) if len(set(o)) > 1 else f"both ranks {o[0]}"
            ends[key] = ends.get(key, 0) + 1
        for outcome, error in zip(o, r["errors"], strict=True):
            if outcome in ("other_error", "clear_error", "signature") and error:
                errors.setdefault(f"{outcome}: {error[:150]}", set()).add(r["scenario"])
    lines = [f"**{name}** ({len(runs)} runs): " + "; ".join(f"{k}: {n}" for k, n in ends.items())]
    lines += [f"- {e} ({', '.join(sorted(s))})" for e, s in sorted(errors.items())]
    return lines


def table(results: dict[str, list[dict]], catalogue: dict) -> str:
    names = list(results)
    order = list(dict.fromkeys(r["scenario"] for runs in results.values() for r in runs))
    lines = ["| scenario | kind | expect (as released) | " + " | ".join(names) + " |",
             "|---|---|---|" + "---|" * len(names)]
    for sc in order:
        kind, expect = catalogue.get(sc, ("gc (extra)", "-"))
        cells = [cell([r for r in results[n] if r["scenario"] == sc]) for n in names]
        lines.append(f"| {sc} | {kind} | {expect} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def catalogue_kinds(python: Path) -> dict:
    out = subprocess.run([str(python), str(STRESS), "--list"], capture_output=True, text=True,
                         cwd=ROOT).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"(\S+)\s+(\S+)\s+expect (\S+)", line)
        if m:
            found[m.group(1)] = (m.group(2), m.group(3))
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cell", default="pl2_6_6_torch2_13_0", help="matrix cell (its Lightning and torch)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each GC-timing scenario")
    p.add_argument("--filter", help="regex on scenario names (default: all, and the extra one)")
    p.add_argument("--out", help="keep every design's runs, logs and the table here")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.inner:
        inner(a.out, a.repeat)
        return
    from tools import validate_patches as vp
    from tools.environments import envs, matrix
    from tools.series import patched, patches

    cells = {c.id: c for c in matrix.load().cells}
    if a.cell not in cells:
        raise SystemExit(f"unknown cell {a.cell!r}")
    c = cells[a.cell]
    args = envs.install_args(c.package, c.lightning, c.torch)
    released = envs.ensure(f"{c.package}-{c.lightning}-torch{c.torch}", args, log=print)
    results: dict[str, list[dict]] = {}
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, vp.interrupts_unwind():
        out = Path(a.out or tmp)
        for i, (name, patch, diff) in enumerate(designs()):
            with patched.scratch("torch-design-") as env:
                python = released
                if patch is not None:
                    python = patched.throwaway(args, env / "env")
                    patches.apply(patch, *patches.installed_root(vp.site_packages(python), patch), diff)
                t = time.monotonic()
                results[name] = measure(python, out / f"design{i}", a)
            print(f"[{name}] {len(results[name])} runs in {time.monotonic() - t:.0f} s "
                  f"(elapsed {time.monotonic() - start:.0f} s)", flush=True)
        text = (f"cell {a.cell}, GC scenarios x{a.repeat}\n\n" + table(results, catalogue_kinds(released))
                + "\n" + "\n".join(line for n, runs in results.items() for line in notes(n, runs)) + "\n")
        if a.out:
            (out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
