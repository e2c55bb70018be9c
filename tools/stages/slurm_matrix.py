"""The matrix's cells as one SLURM job array (``nox -s repro -- --executor slurm``).

Each cell's session builds the cell's environment as usual (on the submitting machine: the
environments live on the shared filesystem) and adds the cell to ``<run>/slurm/tasks.json``
(``add_cell``); then ``nox -s repro_slurm`` (notified by the cell sessions: it runs once, after
them) submits one array task per cell, prints a line whenever a task changes state (queued,
running, done), and prints the one summary table. Each task runs the cell exactly as ``nox -s
repro`` does on a workstation (``python -m tools.stages.slurm_matrix task``, under
``slurm_jobs.guard``) and writes the cell's JSON into the run's results folder; a task that
failed, was cancelled or timed out without it becomes a failed row saying so.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shlex
import sys
import time
from pathlib import Path

from tools.core import contract, results
from tools.core.contract import BadInput
from tools.environments import matrix
from tools.launch.slurm_jobs import (
    ENDED,
    OUTAGE,
    ROOT,
    STALE,
    Options,
    Outage,
    _slurm,
    guard_command,
    heartbeat,
    states,
)
from tools.stages import cells


def add_cell(cell, python: str, out: Path, opts: argparse.Namespace, repro_args: list[str]) -> None:
    """The cell as a task of the run's job array (what ``nox -s repro`` does instead of running it)."""
    add_task(out, {"cell": cells.cell_json(cell), "python": python, "out": str(out),
                   "repro_args": repro_args, "timeout": opts.timeout, "script": opts.script,
                   "signature": opts.signature, "fresh_process": opts.fresh_process,
                   "verdict_line": opts.verdict_line, "nodes": opts.nodes,
                   "ranks_per_node": opts.ranks_per_node, "check_replicas": opts.check_replicas})



def tasks_path(out: Path) -> Path:
    return out / "slurm" / "tasks.json"


def add_task(out: Path, task: dict) -> None:
    """Add (or replace) a cell's task in ``<run>/slurm/tasks.json`` (written atomically)."""
    path = tasks_path(out)
    tasks = json.loads(path.read_text()) if path.exists() else []
    tasks = [t for t in tasks if t["cell"]["id"] != task["cell"]["id"]] + [task]
    results.write_json(path, tasks)


def submit_array(out: Path, opts: Options, log=print) -> tuple[str, list[dict]]:
    tasks = json.loads(tasks_path(out).read_text())
    logs = out / "slurm"
    script = logs / "task.sh"
    # each task runs with its own cell's interpreter (on the shared filesystem, as its environment)
    pythons, tasks_file = shlex.quote(str(logs / "pythons")), shlex.quote(str(tasks_path(out)))
    guarded = " ".join(shlex.quote(a) for a in guard_command(logs / "heartbeat"))
    results.write_atomic(script, "#!/bin/sh\n"
                         f"cd {shlex.quote(str(ROOT))}\n"
                         f'python=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {pythons})\n'
                         f'exec "$python" {guarded} "$python" -m tools.stages.slurm_matrix task {tasks_file} '
                         '"$SLURM_ARRAY_TASK_ID"\n')
    results.write_atomic(logs / "pythons", "".join(f"{t['python']}\n" for t in tasks))
    cmd = ["sbatch", "--parsable", f"--array=0-{len(tasks) - 1}", "--job-name=repro-matrix",
           f"--output={logs}/%A_%a.out", f"--error={logs}/%A_%a.err", *opts.sbatch_args(), str(script)]
    job = _slurm(cmd).stdout.strip().split(";")[0]
    results.write_json(logs / "job.json",
                       {"job": job, "sbatch": cmd, "cells": [t["cell"]["id"] for t in tasks]})
    log(f"[slurm] submitted job {job}: {len(tasks)} cell(s) as array tasks 0-{len(tasks) - 1}")
    return job, tasks


def _complete(out: Path, task: dict) -> bool:
    path = out / "cells" / f"{task['cell']['id']}.json"
    try:
        return not json.loads(path.read_text()).get("incomplete")
    except (OSError, ValueError):
        return False


def wait(job: str, tasks: list[dict], out: Path, log=print, poll: float = 2.0,
         outage: float | None = None, limit: float | None = None) -> dict[int, str]:
    """Until every task has ended; a line whenever a task changes state. A task SLURM no longer
    knows (its records expired) counts as ended once its cell's JSON is complete, or after a
    minute without news. A controller that has not answered for ``outage`` seconds (default
    ``OUTAGE``) raises ``Outage``; after ``limit`` seconds the states known so far are returned."""
    started, shown = time.monotonic(), {}
    missing_since: dict[int, float] = {}
    answered = time.monotonic()
    outage = OUTAGE if outage is None else outage
    while True:
        now = states(job)
        if now is None and time.monotonic() - answered > outage:
            raise Outage(f"the SLURM controller has not answered for {time.monotonic() - answered:.0f} s "
                         f"(squeue -j {job}): every cell keeps its row")
        if limit is not None and time.monotonic() - started > limit:
            return shown
        if now is not None:
            answered = time.monotonic()
            for i in range(len(tasks)):
                if i in now:
                    missing_since.pop(i, None)
                elif _complete(out, tasks[i]):
                    now[i] = "COMPLETED"
                elif time.monotonic() - missing_since.setdefault(i, time.monotonic()) > 60:
                    now[i] = "UNKNOWN"
            for i, state in sorted(now.items()):
                if i < len(tasks) and shown.get(i) != state:
                    shown[i] = state
                    counts = {k: sum(1 for s in shown.values() if _phase(s) == k)
                              for k in ("queued", "running", "done")}
                    log(f"[slurm] {job}_{i} {tasks[i]['cell']['id']}: {state.lower()} | "
                        f"{counts['queued']} queued, {counts['running']} running, {counts['done']} done, "
                        f"{time.monotonic() - started:.0f} s")
            if len(shown) == len(tasks) and all(_phase(s) == "done" for s in shown.values()):
                return shown
        time.sleep(poll)


def _phase(state: str) -> str:
    if state in ENDED or state == "UNKNOWN":
        return "done"
    return "queued" if state in ("PENDING", "CONFIGURING", "REQUEUED") else "running"


def collect(out: Path, job: str, tasks: list[dict], ended: dict[int, str], why: str | None = None) -> None:
    """A failed row for every cell whose task ended without writing its complete JSON (or whose
    state is not known: ``why``); the repros a cut-off task did finish stay in its row."""
    for i, task in enumerate(tasks):
        path = out / "cells" / f"{task['cell']['id']}.json"
        data = json.loads(path.read_text()) if path.exists() else None
        if data and not data.get("incomplete"):
            continue
        state = ended.get(i, "UNKNOWN")
        err = out / "slurm" / f"{job}_{i}.err"
        tail = err.read_text(errors="replace").strip().splitlines()[-1:] if err.exists() else []
        reason = f"slurm job {job}_{i} {state}" + (f": {tail[0][:120]}" if tail else "")
        if why and i not in ended:
            reason = f"slurm job {job}_{i}: {why}"
        if data and data.get("results"):  # cut off mid-cell: keep what finished, say why the rest did not
            data["slurm"] = reason
            results.write_json(path, data)
        else:
            cells.record_skip(_cell(task), reason, out)


def _cell(task: dict) -> matrix.Cell:
    c = task["cell"]
    return matrix.Cell(c["package"], c["lightning"], c["torch"], c["declared"], c.get("included"), c["index"])


def run_task(tasks_file: Path, index: int) -> int:
    """One array task: the cell run as ``nox -s repro`` runs it on a workstation."""
    task = json.loads(tasks_file.read_text())[index]
    # the batch step's SLURM_* variables describe the job, not a launcher of ranks: the cell's
    # repros start their own ranks inside the allocation, as on a workstation (on one node), or
    # through srun with them (on several)
    job = os.environ.get("SLURM_JOB_ID")
    allocation = {v: os.environ.pop(v) for v in list(os.environ) if v.startswith(("SLURM_", "SLURMD_"))}
    print(f"[slurm task] job {job}: cell {task['cell']['id']}", flush=True)
    out = Path(task["out"])
    cells.run_cell(_cell(task), matrix.load(), task["python"], out, task["repro_args"], task["timeout"],
                   script=task.get("script"), signature=task.get("signature"),
                   fresh_process=task.get("fresh_process", False),
                   verdict_line=task.get("verdict_line", False),
                   nodes=task.get("nodes", 1), ranks_per_node=task.get("ranks_per_node", 1),
                   allocation=allocation if task.get("nodes", 1) > 1 else None,
                   check_replicas=task.get("check_replicas"))
    return 0


def run_matrix(out: Path, opts: Options, script: str | None, log=print) -> str:
    """Submit the prepared cells, wait, collect, and return the summary table. Interrupted
    (Ctrl-C, a killed nox): the job is cancelled and every cell still gets its row."""
    if not tasks_path(out).exists():
        raise BadInput(f"no cells prepared in {out} (run `nox -s repro -- --executor slurm`)")
    job, tasks, ended = None, [], {}
    with heartbeat(out / "slurm" / "heartbeat"):
        try:
            job, tasks = submit_array(out, opts, log)
            ended = wait(job, tasks, out, log)
        except BaseException as exc:
            if job is None:  # interrupted while sbatch ran: cancel what it may have submitted
                _slurm(["scancel", "--name=repro-matrix", f"--user={getpass.getuser()}"], check=False)
                raise
            outage = isinstance(exc, Outage)
            why = str(exc) if outage else "interrupted"
            cancel = None if outage else _slurm(["scancel", job], check=False)
            if cancel is not None and cancel.returncode == 0:
                log(f"[slurm] cancelled job {job}")
            else:  # no controller to ask: the guard of each task ends it once this run has gone
                log(f"[slurm] could not cancel job {job} "
                    f"({'the controller is not answering' if outage else cancel.stderr.strip()[-120:]}): "
                    f"its tasks end themselves within {STALE:g} s of this run's end")
            if not outage:
                try:  # bounded: what the controller says within half a minute
                    ended = wait(job, tasks, out, lambda _m: None, poll=1.0, outage=15, limit=30)
                except Outage:
                    pass
            collect(out, job, tasks, ended, why)
            log(cells.write_summary(out, matrix.load(), script))
            raise
    collect(out, job, tasks, ended)
    return cells.write_summary(out, matrix.load(), script)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 3 and argv[0] == "task":
        return run_task(Path(argv[1]), int(argv[2]))
    raise BadInput("usage: python -m tools.stages.slurm_matrix task TASKS_FILE INDEX")


if __name__ == "__main__":
    sys.exit(contract.run_main(main))
