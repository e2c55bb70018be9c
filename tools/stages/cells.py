"""One cell of the repro matrix: run every repro through the harness and record the results."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict
from pathlib import Path

from tools.core import contract, results
from tools.environments import envs, index
from tools.environments.matrix import ROOT, Cell, Matrix, Repro, load
from tools.launch import harness
from tools.launch.launcher import How, Launcher, Run

_DONE: list[float] = []  # seconds of each cell run by this process, for the ETA
_START = time.monotonic()


def parser() -> argparse.ArgumentParser:
    """``nox -s repro``'s own options; what it does not know goes to the repros."""
    p = argparse.ArgumentParser(
        prog="nox -s repro --", add_help=False, formatter_class=contract.DefaultsShown,
        description="Run every repro of repro/matrix.toml in each Lightning x torch cell (a cell: one "
                    "Lightning release on one torch release, its own environment; pick cells with "
                    "nox's -k, e.g. nox -s repro -k pl2_6_6_torch2_13_0). Options it does not know go to the "
                    "repros (python repro/<name>.py --help lists theirs).")
    which = p.add_argument_group("which cells, and what runs in them")
    which.add_argument("--cell", help="only this cell, by its name (e.g. pl2_6_6_torch2_13_0; the same "
                                      "as nox's -k, which also skips making the other cells' folders)")
    which.add_argument("--include-unsupported", action="store_true",
                       help="also run cells outside a release's declared torch range")
    which.add_argument("--script", help="also run this user script (any repro following the exit codes)")
    contract.add_judges(which, "--script")
    running = p.add_argument_group("how it runs")
    running.add_argument("--timeout", type=contract.seconds, default=300.0, metavar="SECONDS",
                         help="wall-clock limit per repro run")
    running.add_argument("--fresh-process", action="store_true",
                         help="a new interpreter for every repro run (default: the cell's repros are "
                              "forks of one process that imported torch and Lightning once)")
    running.add_argument("--nodes", type=int, default=1,
                         help="run every repro as this many nodes (each a torchrun with c10d rendezvous "
                              "on this machine, as a cluster launches a job); repros that run on one "
                              "node only are recorded as not run")
    running.add_argument("--ranks-per-node", type=int, default=None,
                         help="ranks of each node with --nodes (default: 1)")
    from tools.launch import slurm_jobs

    slurm_jobs.add_options(p.add_argument_group("SLURM (--executor slurm)"))
    return p


def parse_posargs(posargs: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split ``nox -s repro -- ...`` into the workspace's own flags and the repros' options."""
    from tools.launch import slurm_jobs

    p = parser()
    opts, rest = p.parse_known_args(posargs)
    if opts.nodes < 1 or (opts.ranks_per_node is not None and opts.ranks_per_node < 1):
        p.error("--nodes and --ranks-per-node must be >= 1")
    if opts.ranks_per_node is not None and opts.nodes == 1:
        p.error("--ranks-per-node goes with --nodes N (N >= 2)")
    opts.ranks_per_node = opts.ranks_per_node or 1
    try:
        opts.slurm = slurm_jobs.options(opts, opts.nodes, opts.ranks_per_node if opts.nodes > 1 else 2)
    except contract.BadInput as err:
        p.error(str(err))
    if opts.script:
        try:
            harness.how_to_run(Path(opts.script), "--script", opts.script)
        except contract.BadInput as err:
            p.error(str(err))
        if not (opts.signature or opts.verdict_line or opts.check_replicas):
            p.error("--script needs --signature REGEX (what its output shows when the bug is there), "
                    "--check-replicas for a silent divergence, or --verdict-line if it prints the "
                    "contract's verdict line")
    elif opts.check_replicas:
        p.error("--check-replicas goes with --script (the workspace's repros check themselves)")
    if opts.cell and opts.cell not in {c.id for c in load().cells}:
        p.error(f"--cell {opts.cell}: no such cell (nox -l lists them: repro(NAME))")
    try:
        contract.check_signature(opts.signature)
    except contract.BadInput as err:
        p.error(str(err))
    return opts, rest


def open_results() -> Path:
    """This nox run's ``results/repro/<time>/``, or one line and exit 2 when it cannot be made
    (a read-only or full disk), before any cell runs."""
    where = results.kind_dir("repro")
    try:
        out = results.run_dir("repro")
        with open(out / ".writable", "w"):
            pass
        os.unlink(out / ".writable")
    except OSError as err:
        raise contract.BadInput(f"the results folder {where}: cannot write there ({err.strerror})") from None
    return out


def save(path: Path, data) -> None:
    """A cell's result file, written atomically; a disk that refuses it is a harness failure
    (what ran is kept in the files written before), never a traceback."""
    try:
        results.write_json(path, data)
    except OSError as err:
        raise contract.HarnessFailure(f"cannot write {path} ({err.strerror}): the cells written "
                                      "before it are kept") from None


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def runnable(matrix: Matrix, include_unsupported: bool) -> list[Cell]:
    return [c for c in matrix.cells if not c.skip_reason(include_unsupported)]


def is_last(cell: Cell, matrix: Matrix, include_unsupported: bool) -> bool:
    """Is this the matrix's last cell to run (the one that prints the summary table)?"""
    return runnable(matrix, include_unsupported)[-1:] == [cell]


def progress(cell: Cell, matrix: Matrix, include_unsupported: bool) -> str:
    runnable_cells = runnable(matrix, include_unsupported)
    position = next((i for i, c in enumerate(runnable_cells, 1) if c.id == cell.id), 0)
    line = f"cell {position}/{len(runnable_cells)} {cell.id}, elapsed {_clock(time.monotonic() - _START)}"
    if _DONE:
        line += f", ETA ~{_clock(sum(_DONE) / len(_DONE) * (len(runnable_cells) - position + 1))}"
    return line


def cell_json(cell: Cell) -> dict:
    return {**asdict(cell), "id": cell.id}


def install(session, cell: Cell, out: Path) -> None:
    """Install the cell's era-correct environment, or record why it could not be made and stop."""
    try:
        args = envs.install_args(cell.package, cell.lightning, cell.torch)
    except (index.UnknownRelease, envs.EnvError) as err:
        record_skip(cell, f"environment: {err}", out)
        session.error(str(err))
    try:
        session.install(*args, env=envs.COMPILED)
    except Exception:
        record_skip(cell, "environment: uv could not install it (see the session log)", out)
        raise


def record_skip(cell: Cell, reason: str, out: Path) -> None:
    save(out / "cells" / f"{cell.id}.json", {"cell": cell_json(cell), "skipped": reason})


def repros_of(matrix: Matrix, script: str | None, verdict_line: bool = False) -> list[Repro]:
    extra = [Repro(f"script:{Path(script).name}", str(Path(script).resolve()), passthrough=True,
                   verdict_line=verdict_line, preload=False)] if script else []
    return [*matrix.repros, *extra]


def run_cell(cell: Cell, matrix: Matrix, python: str, out: Path, repro_args: list[str],
             timeout: float, log=print, script: str | None = None, signature: str | None = None,
             fresh_process: bool = False, verdict_line: bool = False, nodes: int = 1,
             ranks_per_node: int = 1, allocation: dict | None = None,
             check_replicas: str | None = None) -> dict:
    """Run every repro of the matrix (and ``script``) in the cell's environment ``python``.

    The matrix's own repros share one preloaded runner (``tools/launch/preloaded.py``: torch and
    Lightning imported once, every repro a fork of it) unless ``fresh_process``; a user's script
    always gets a fresh interpreter (it may do anything at import). With ``nodes`` > 1 every
    repro runs as that many nodes (``tools/nodes.py``; a repro's ``multinode`` in the matrix says
    how: ``torchrun`` launches it on each node, ``self`` gives it ``--nodes``; without it the repro
    runs on one node only and is recorded as not run); inside a SLURM job of several nodes
    (``allocation``: the job's ``SLURM_*`` variables) ``srun`` launches the ``torchrun`` ones
    instead, and Lightning takes the ranks from its SLURM environment (``self`` ones still start
    their nodes on the job's first node). ``check_replicas`` injects the replica check into the
    script. Results are written after every repro.
    """
    started = time.monotonic()
    logs = out / "logs" / cell.id
    how = How(fresh=fresh_process, nodes=nodes, ranks_per_node=ranks_per_node, allocation=allocation,
              runner_stderr=logs / "preloaded.stderr")
    outcome: dict = {"cell": cell_json(cell), "results": {}, "repro_args": repro_args,
                     "launch": how.label, "incomplete": True, "seconds": 0.0}
    repros = repros_of(matrix, script, verdict_line)
    by_name = {r.name: r for r in repros}
    runs = []
    for repro in repros:
        args = [a.replace("{out}", str(logs))
                for a in (*repro.args, *(repro.fresh_args if fresh_process else ()))]
        yours = repro.name.startswith("script:")
        runs.append((repro.name, Run(
            (str(ROOT / repro.script), *args, *(repro_args if repro.passthrough else [])), Path(python),
            kind=harness.how_to_run(Path(script), "--script") if yours else "python",
            timeout=timeout, log_stem=logs / repro.name, signature=None if repro.preload else signature,
            own=repro.preload, multinode="torchrun" if yours else repro.multinode,
            check_replicas=check_replicas if yours else None)))
    runs.sort(key=lambda item: not item[1].own)  # the own repros first: they share one runner

    def record(name: str, res: harness.RunResult) -> None:
        outcome["results"][name] = res.to_dict()
        versions = (res.record or {}).get("versions") or {}
        outcome.setdefault("torch_installed", versions.get("torch"))
        outcome.setdefault("lightning_installed", versions.get("lightning"))
        expect = by_name[name].expect
        flag = "" if expect in (None, res.verdict) else f"  (expected {expect})"
        log(f"  {name}: {results.cell_text(res.to_dict())} [{res.seconds:.1f} s]{flag}")
        outcome["seconds"] = round(time.monotonic() - started, 1)
        save(out / "cells" / f"{cell.id}.json", outcome)  # nothing lost on Ctrl-C

    logs.mkdir(parents=True, exist_ok=True)
    with Launcher(how, log) as launcher:
        for name, run in runs:
            record(name, launcher.run(run))
            if run.own and launcher.forked is False:
                outcome["launch"] = "fresh-process (the preload failed: see preloaded.stderr)"
    outcome["seconds"] = round(time.monotonic() - started, 1)
    del outcome["incomplete"]
    _DONE.append(outcome["seconds"])
    save(out / "cells" / f"{cell.id}.json", outcome)
    write_summary(out, matrix, script)
    return outcome


def write_summary(out: Path, matrix: Matrix, script: str | None = None) -> str:
    cells = results.load_cells(out)
    table = results.summary_markdown(cells, [r.name for r in repros_of(matrix, script)])
    results.write_atomic(out / "summary.md", table)
    results.write_json(out / "summary.json", cells)
    return table
