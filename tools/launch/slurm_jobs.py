"""SLURM as an executor: a run as one job (a bisect step), every job under a guard that ends it
when its submitter is gone, and what SLURM says of a job (the matrix as a job array is
``tools/stages/slurm_matrix.py``, above this floor).

Plain ``sbatch`` / ``squeue`` / ``sacct`` / ``scancel`` (see docs/cluster.md: why not submitit): the jobs
run the workspace's own code on the cluster's shared filesystem, so there is nothing to pickle
or ship, and the command lines are the ones a cluster's users already know.

- ``nox -s repro -- --executor slurm [--partition P] [--time T] [--gpus-per-node N] [--nodes M]``:
  each cell's session builds the cell's environment as usual (on the submitting machine: the
  environments live on the shared filesystem) and adds the cell to ``<run>/slurm/tasks.json``;
  then ``nox -s repro_slurm`` (notified by the cell sessions: it runs once, after them) submits
  one array task per cell, prints a line whenever a task changes state (queued, running, done),
  and prints the one summary table. Each task runs the cell exactly as ``nox -s repro`` does on
  a workstation (``python -m tools.launch.slurm_jobs task``) and writes the cell's JSON into the run's
  results folder; a task that failed, was cancelled or timed out without it becomes a failed
  row saying so. Ctrl-C or SIGTERM cancels the jobs it submitted; a nox killed outright (even
  ``kill -9``) stops touching the run's heartbeat file, and every job ends itself within
  ``STALE`` seconds (each job runs under ``guard``). A controller that stops answering for
  ``OUTAGE`` seconds ends the wait with every cell's row kept and a one-line reason (exit 128).
- ``nox -s bisect -- --executor slurm ...``: each step is one job, its output judged as a local
  run's, its end seen within a fraction of a second (``_submit_and_wait``); with ``--jobs K``
  each round of K probes is one job array (``ArrayRound``). A controller that stops answering
  for ``OUTAGE`` seconds stops the bisect (``Outage``, exit 128); the job ends itself when the
  heartbeat stops.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.core import contract, results
from tools.core.contract import BadInput
from tools.launch import harness, nodes, process_group

ROOT = Path(__file__).resolve().parents[2]
# a job ends itself when its submitter's heartbeat file is older than this (the submitter died)
STALE = float(os.environ.get("REPRO_SLURM_STALE", "60"))
BEAT = min(5.0, STALE / 4)  # how often the submitter touches it
# a controller that has not answered for this long ends the wait (rows kept, exit 128)
OUTAGE = float(os.environ.get("REPRO_SLURM_OUTAGE", "60"))
CALL_TIMEOUT = 30.0  # any one SLURM command (squeue, scancel, ...) against a controller that hangs
PROBE = 5.0  # how often a submitter waiting on its job asks the controller about it
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
         "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}


@dataclass
class Options:
    partition: str | None = None
    time: str = "60"  # sbatch --time (minutes, or [D-]HH:MM:SS)
    gpus_per_node: int = 0
    nodes: int = 1
    ranks_per_node: int = 2  # the repros' default: two ranks on one node
    extra: list[str] = field(default_factory=list)  # more sbatch options, as given

    def sbatch_args(self) -> list[str]:
        args = [f"--nodes={self.nodes}", f"--ntasks-per-node={self.ranks_per_node}",
                f"--time={self.time}"]
        if self.partition:
            args.append(f"--partition={self.partition}")
        if self.gpus_per_node:
            args.append(f"--gpus-per-node={self.gpus_per_node}")
        return [*args, *self.extra]


def add_options(p: argparse.ArgumentParser) -> None:
    """The executor's options, shared by ``nox -s repro`` and ``nox -s bisect``."""
    p.add_argument("--executor", choices=("local", "slurm"), default="local",
                   help="where runs happen: this machine, or SLURM jobs (sbatch)")
    p.add_argument("--partition", help="--executor slurm: the partition (default: the cluster's)")
    p.add_argument("--time", default="60", metavar="MINUTES",
                   help="--executor slurm: a job's time limit (sbatch --time)")
    p.add_argument("--gpus-per-node", type=int, default=0, help="--executor slurm: GPUs per node")
    p.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                   help="--executor slurm: one more sbatch option (repeatable), e.g. --sbatch=--account=A")


def options(a: argparse.Namespace, nodes: int = 1, ranks_per_node: int | None = None) -> Options:
    if a.executor == "slurm":
        _check_clients()
    if a.gpus_per_node < 0:
        raise BadInput("--gpus-per-node must be >= 0")
    return Options(a.partition, a.time, a.gpus_per_node, nodes,
                   ranks_per_node or (2 if nodes == 1 else 1), list(a.sbatch))


def _check_clients() -> None:
    import shutil

    missing = [c for c in ("sbatch", "squeue", "scancel") if not shutil.which(c)]
    if missing:
        raise BadInput(f"--executor slurm: {', '.join(missing)} not found (is this a SLURM login "
                       "node? locally: nox -s slurm_up)")


def slurm_env() -> dict[str, str]:
    """The environment for SLURM's commands: this workspace's local cluster when it is up."""
    from tools.launch import slurm_cluster

    env = dict(os.environ)
    if "SLURM_CONF" not in env and slurm_cluster.is_up():
        env.update(slurm_cluster.env())
    return env


class Outage(contract.HarnessFailure):
    """The SLURM controller stopped answering (exit 128: no verdict; the rows so far are kept)."""


def _slurm(cmd: list[str], check: bool = True, timeout: float = CALL_TIMEOUT) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=slurm_env(), timeout=timeout)
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess(cmd, 124, "", f"{cmd[0]}: no answer in {timeout:g} s")
    except OSError as err:  # the command is not there
        done = subprocess.CompletedProcess(cmd, 127, "", f"{cmd[0]}: {err.strerror}")
    if check and done.returncode:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise BadInput(f"{cmd[0]}: {last.removeprefix(f'{cmd[0]}: ').removeprefix('error: ')}")
    return done


# -- a job never outlives its submitter ----------------------------------------------------

@contextlib.contextmanager
def heartbeat(path: Path):
    """Touch ``path`` every ``BEAT`` seconds while the block runs (a thread of this process):
    the jobs submitted meanwhile watch it (``guard``), and end themselves once it goes stale."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    stop = threading.Event()

    def beat():
        while not stop.wait(BEAT):
            try:
                path.touch()
            except OSError:
                pass

    thread = threading.Thread(target=beat, name="slurm-heartbeat", daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        thread.join()


def guard_command(beat: Path) -> list[str]:
    """The prefix a job's command runs under: ``python -m tools.launch.slurm_jobs guard BEAT STALE --``."""
    return ["-m", "tools.launch.slurm_jobs", "guard", str(beat), f"{STALE:g}", "--"]


def guard(beat: Path, stale: float, cmd: list[str]) -> int:
    """Run ``cmd`` (its own process group) inside a job, and end it when the submitter's
    heartbeat file ``beat`` is older than ``stale`` seconds: a submitter killed outright (SIGKILL,
    a crash, a lost login node) cannot cancel its jobs, so they end themselves."""
    proc = subprocess.Popen(cmd, start_new_session=True)

    def forward(signum, frame):  # scancel, Ctrl-C under srun: to the command's whole group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    while True:
        try:
            code = proc.wait(timeout=min(2.0, stale / 4))
            return code if code >= 0 else 128 - code
        except subprocess.TimeoutExpired:
            pass
        try:
            age = time.time() - beat.stat().st_mtime
        except OSError:
            age = float("inf")
        if age > stale:
            print(f"[slurm guard] the submitter has not touched {beat} for {age:.0f} s: it is gone; "
                  "ending this job", file=sys.stderr, flush=True)
            for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
            return 128 + signal.SIGTERM


# -- what SLURM says of a job ---------------------------------------------------------------

def states(job: str) -> dict[int, str] | None:
    """Array index -> state, from squeue (pending, running, recently ended) then sacct; None
    when squeue itself could not answer (no information: not "gone")."""
    found, _ = _task_states(job, array=True)
    if found is None:
        return None
    acct = _slurm(["sacct", "-n", "-X", "-P", "-j", job, "-o", "JobID,State"], check=False)
    for line in acct.stdout.splitlines():
        jid, _, state = line.partition("|")
        index = jid.rpartition("_")[2]
        if index.isdigit() and int(index) not in found:
            found[int(index)] = state.split()[0] if state else "UNKNOWN"
    return found


def job_state(job: str) -> str | None:
    """The state of a job that is not an array (squeue, then sacct), or None."""
    now, _ = _task_states(job, array=False)
    if now:
        return now[0]
    acct = _slurm(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"], check=False)
    return acct.stdout.split()[0] if acct.stdout.split() else None


# -- a bisect step as one job --------------------------------------------------------------

# a job's shell drops the submitter's SLURM_* variables (an srun inside must see its own job's)
SCRUB = "for v in $(env | sed -n 's/^\\(SLURM_[A-Z_]*\\)=.*/\\1/p'); do unset $v; done\n"


def _exports(env: dict | None, indent: str = "") -> str:
    """The variables of a run its job's shell sets: where its Python is, and the workspace's own."""
    return "".join(f"{indent}export {k}={shlex.quote(v)}\n" for k, v in (env or {}).items()
                   if k in ("PATH", "PYTHONPATH", "UV_FIND_LINKS") or k.startswith(("REPRO_", "WORKSPACE_")))


def _task_states(job: str, array: bool) -> tuple[dict[int, str] | None, bool]:
    """(index -> state, gone) from ``squeue``, for each task of an array or ``{0: state}`` for a
    plain job: None when the controller did not answer; ``gone`` when SLURM no longer knows the
    job (its records expired). A task the answer leaves out (a filter, a hidden partition) is
    not taken for ended."""
    form = ["-r", "-o", "%K %T"] if array else ["-o", "%T"]
    q = _slurm(["squeue", "-a", "-h", "-t", "all", "-j", job, *form], check=False)
    if q.returncode:
        return (None, False) if "Invalid job id" not in q.stderr else ({}, True)
    found: dict[int, str] = {}
    for line in q.stdout.splitlines():
        parts = line.split()
        if array and len(parts) == 2 and parts[0].isdigit():
            found[int(parts[0])] = parts[1]
        elif not array and parts:
            found[0] = parts[0]
    return found, False


SUBMIT_TIMEOUT = 120.0  # sbatch against a busy controller (the job may be queued all the same)
END_GRACE = 30.0  # after every task wrote its exit code, how long the controller may take to say so
MARK_GRACE = 3.0  # after the controller says a task ended, how long its exit code may take to show


def _submit_and_wait(sbatch: list[str], name: str, beat: Path, marks: list[Path], array: bool = False,
                     ) -> tuple[str, str, dict[int, str], list[int | None], float]:
    """Submit ``sbatch`` (``--parsable``) under a heartbeat and wait until its job (each task of
    an array) has ended: (job id, sbatch's stderr, index -> state, each task's exit code or None,
    seconds); no job id if sbatch failed. Not ``sbatch --wait``: it looks at its job after 2, 10,
    42, ... s (on the local cluster a job of 1 s took 10 s to be seen ended, and one of 12 s
    42 s). Each task writes its job's id and its exit code to its file in ``marks`` as it ends
    (``NOTE_JOB`` and ``RECORD_EXIT``, on the shared file system), watched here every 0.2 s; the
    controller is asked every ``PROBE`` s, which also finds a task that ended without writing it
    (cancelled, timed out, its node lost), and then once a second until it agrees that the tasks
    that wrote theirs have ended (``END_GRACE`` at most). A code the file system has not shown
    yet is asked of SLURM (``scontrol``). Ctrl-C, SIGTERM or ``process_group.ABORT`` (a parallel round
    stopped) cancel the job by its name, even while sbatch runs; a controller that has not
    answered for ``OUTAGE`` seconds raises ``Outage``, the heartbeat stops, and the job, which
    nobody can cancel now, ends itself (``guard``)."""
    started = time.monotonic()
    for mark in marks:
        mark.unlink(missing_ok=True)
    with heartbeat(beat):
        try:
            done = _slurm(sbatch, check=False, timeout=SUBMIT_TIMEOUT)
            job = done.stdout.strip().split(";")[0] if done.returncode == 0 else ""
            if not job:
                return "", done.stderr, {}, [], round(time.monotonic() - started, 2)
            found: dict[int, str] = {}
            answered = asked = time.monotonic()
            marked_at = None
            while True:
                if process_group.ABORT.is_set():
                    raise KeyboardInterrupt
                if marked_at is None and all(_exit_code(m, job) is not None for m in marks):
                    marked_at = time.monotonic()
                if time.monotonic() - asked >= (PROBE if marked_at is None else 1.0):
                    asked = time.monotonic()
                    now, gone = _task_states(job, array)
                    if now is None:  # no answer since `answered`, as of now (a call may hang long)
                        if marked_at is None and time.monotonic() - answered > OUTAGE:
                            raise Outage(f"the SLURM controller has not answered for "
                                         f"{time.monotonic() - answered:.0f} s (squeue -j {job}): no "
                                         f"verdict; the job ends itself within {STALE:g} s")
                    else:
                        answered, found = time.monotonic(), now
                        if gone or (len(now) >= len(marks) and all(v in ENDED for v in now.values())):
                            break
                if marked_at is not None and time.monotonic() - marked_at > END_GRACE:
                    break  # every task said it ended: the controller is slow to agree
                time.sleep(0.2)
            codes = _exit_codes(job, marks, found, array)
        except BaseException as err:  # the job goes too
            if not isinstance(err, Outage):  # nobody to ask: the guard ends it
                _slurm(["scancel", f"--name={name}", f"--user={getpass.getuser()}"], check=False)
            raise
    return job, done.stderr, found, codes, round(time.monotonic() - started, 2)


def _exit_codes(job: str, marks: list[Path], found: dict[int, str], array: bool) -> list[int | None]:
    """Each task's exit code: from its file, else (a task that ended on its own, whose file the
    shared file system does not show yet) from SLURM's record of it; None for a task that wrote
    none (cancelled, timed out)."""
    codes = [_exit_code(m, job) for m in marks]
    waiting = [i for i, c in enumerate(codes) if c is None and found.get(i) in ("COMPLETED", "FAILED")]
    deadline = time.monotonic() + MARK_GRACE
    while waiting and time.monotonic() < deadline:
        time.sleep(0.2)
        for i in list(waiting):
            os.listdir(marks[i].parent)  # a fresh look at the folder (NFS caches a missing name)
            codes[i] = _exit_code(marks[i], job)
            if codes[i] is not None:
                waiting.remove(i)
    for i in waiting:
        codes[i] = _recorded_exit_code(f"{job}_{i}" if array else job)
    return codes


def _exit_code(mark: Path, job: str) -> int | None:
    """The exit code this job's task wrote as it ended; None if it wrote none (cancelled, timed
    out) or the file is another job's (one left behind by an earlier wait, writing late)."""
    try:
        written, code = mark.read_text().split()
        return int(code) if written == job else None
    except (OSError, ValueError):
        return None


def _recorded_exit_code(ref: str) -> int | None:
    """The exit code SLURM recorded for a job (``123``) or an array task (``123_4``) that ended."""
    shown = _slurm(["scontrol", "show", "job", "-o", ref], check=False).stdout
    found = re.search(r"\bExitCode=(\d+):(\d+)", shown)
    if not found:
        return None
    code, sig = int(found.group(1)), int(found.group(2))
    return 128 + sig if sig else code


# a task's shell notes its job's id (before SCRUB drops the SLURM_* variables), runs its command,
# then writes "<job id> <exit code>" to "$rc" (atomically: the submitter watches for it) and exits
# with that code
NOTE_JOB = 'job="${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}"\n'
RECORD_EXIT = 'code=$?\necho "$job $code" >"$rc.tmp" && mv "$rc.tmp" "$rc"\nexit "$code"\n'


def run(cmd: list[str], *, timeout: float, log_stem: str | Path | None, signature: str | None,
        env: dict | None, opts: Options, log=print) -> harness.RunResult:
    """``cmd`` as one SLURM job, judged as a local run of it: the job's
    ``--time`` bounds the run (time in the queue does not count); a job that timed out, was
    cancelled or killed is "cannot test", not final (as a local timeout). Inside a round of
    parallel probes (``array_round``) it joins that round's job array."""
    if _ROUND is not None:
        return _ROUND.run(cmd, timeout=timeout, log_stem=log_stem, signature=signature, env=env)
    stem = Path(log_stem) if log_stem else results.run_dir("slurm") / f"step-{time.time_ns()}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    out_path, err_path = Path(f"{stem}.stdout"), Path(f"{stem}.stderr")
    name = f"bisect-step-{os.getpid()}-{time.time_ns()}"
    script, mark = Path(f"{stem}.sh"), Path(f"{stem}.rc")
    guarded = [sys.executable, *guard_command(Path(f"{stem}.heartbeat")), *cmd]
    results.write_atomic(script, f"#!/bin/sh\ncd {shlex.quote(str(ROOT))}\n{_exports(env)}{NOTE_JOB}{SCRUB}"
                         f"rc={shlex.quote(str(mark))}\n{' '.join(shlex.quote(c) for c in guarded)}\n"
                         f"{RECORD_EXIT}")
    sbatch = ["sbatch", "--parsable", f"--job-name={name}", f"--output={out_path}",
              f"--error={err_path}", *opts.sbatch_args(), f"--time={max(1, int(timeout // 60) + 1)}",
              str(script)]
    job, stderr, found, codes, seconds = _submit_and_wait(sbatch, name, Path(f"{stem}.heartbeat"), [mark])
    if not job:
        return harness.RunResult(contract.FAIL, "error", f"sbatch failed: {stderr.strip()[-200:]}",
                                 seconds, None)
    state = found.get(0) or job_state(job) or "UNKNOWN"
    return _judged(f"job {job}", state, codes[0], out_path, err_path, timeout, signature,
                   seconds, log)


def _judged(name: str, state: str, code: int | None, out_path: Path, err_path: Path, timeout: float,
            signature: str | None, seconds: float, log) -> harness.RunResult:
    """A job's (or array task's) end, judged as a local run of its command would be."""
    text = out_path.read_text(errors="replace") if out_path.exists() else ""
    err = err_path.read_text(errors="replace") if err_path.exists() else ""
    if state in ("TIMEOUT", "DEADLINE"):
        j = contract.judge(code, text, err, stopped="timeout", timeout=timeout)
    elif state in ENDED - {"COMPLETED", "FAILED"} or code is None:  # cancelled, out of memory, ...
        j = contract.Judgement(contract.SKIP, f"slurm {name} {state}", None, False)
    else:
        j = nodes.judge_merged(code, text, err, signature)
    log(f"[slurm] {name}: {state.lower()}, exit {code}, {contract.name(j.code)}")
    result = harness.RunResult(j.code, contract.name(j.code), j.reason, seconds, code, j.record,
                               final=j.final)
    result.stdout_path, result.stderr_path = str(out_path), str(err_path)
    return result


# -- a round of parallel probes as one job array ---------------------------------------------

_ROUND: ArrayRound | None = None  # the round in progress (``array_round``): runs join its array


@dataclass
class _Task:
    cmd: list[str]
    timeout: float
    stem: Path
    signature: str | None
    env: dict
    result: harness.RunResult | None = None
    error: BaseException | None = None


class ArrayRound:
    """The runs of one round of parallel probes (``nox -s bisect -- --jobs K --executor slurm``),
    submitted as one job array. Each probe's thread blocks in ``run``; once every probe still
    going is waiting there (the others have ended: a cached verdict, an environment that could
    not be made), the last to arrive submits them all as one ``sbatch --array`` and each gets
    its own task's result. A probe that needs a second run (``--trials``) joins the next array."""

    def __init__(self, probes: int, opts: Options, log=print):
        self.live, self.opts, self.log = probes, opts, log
        self.waiting: list[_Task] = []
        self.cond = threading.Condition()
        self.arrays: list[str] = []  # the job ids submitted, in order

    def run(self, cmd: list[str], *, timeout: float, log_stem: str | Path | None, signature: str | None,
            env: dict | None) -> harness.RunResult:
        stem = Path(log_stem) if log_stem else results.run_dir("slurm") / f"step-{time.time_ns()}"
        task = _Task(cmd, timeout, stem, signature, dict(env or {}))
        with self.cond:
            self.waiting.append(task)
            batch = self._ready()
        if batch:
            self._submit(batch)
        with self.cond:
            while task.result is None and task.error is None:
                if process_group.ABORT.is_set() and task in self.waiting:  # not submitted: never will be
                    self.waiting.remove(task)
                    return harness.RunResult(contract.SKIP, "skip", "aborted", 0.0, None, final=False)
                self.cond.wait(0.5)
        if task.error is not None:
            raise task.error
        return task.result

    def leave(self) -> None:
        """A probe's thread has ended: the others no longer wait for it."""
        with self.cond:
            self.live -= 1
            batch = self._ready()
        if batch:
            self._submit(batch)

    def _ready(self) -> list[_Task] | None:
        if self.waiting and len(self.waiting) >= self.live and not process_group.ABORT.is_set():
            batch, self.waiting = self.waiting, []
            return batch
        return None

    def _submit(self, batch: list[_Task]) -> None:
        try:
            outcomes = self._array(batch)
        except BaseException as err:  # an outage, a failed sbatch: every probe of it hears so
            aborted = process_group.ABORT.is_set() and isinstance(err, KeyboardInterrupt)
            with self.cond:
                for task in batch:  # stopped with the round: as a local run that was aborted
                    task.result = harness.RunResult(contract.SKIP, "skip", "aborted", 0.0, None,
                                                    final=False) if aborted else None
                    task.error = None if aborted else err
                self.cond.notify_all()
            return
        with self.cond:
            for task, result in zip(batch, outcomes, strict=True):
                task.result = result
            self.cond.notify_all()

    def _array(self, batch: list[_Task]) -> list[harness.RunResult]:
        first = batch[0].stem
        first.parent.mkdir(parents=True, exist_ok=True)
        base = first.parent / f"array-{os.getpid()}-{time.time_ns()}"
        beat = Path(f"{base}.heartbeat")
        cases = []
        for i, task in enumerate(batch):
            task.stem.parent.mkdir(parents=True, exist_ok=True)
            guarded = [sys.executable, *guard_command(beat), *task.cmd]
            files = " ".join(f"{var}={shlex.quote(f'{task.stem}.{ext}')}"
                             for var, ext in (("out", "stdout"), ("err", "stderr"), ("rc", "rc")))
            command = " ".join(shlex.quote(c) for c in guarded)
            cases.append(f"{i})\n{_exports(task.env, '  ')}  set -- {command}\n  {files} ;;\n")
        script = Path(f"{base}.sh")
        results.write_atomic(script, f"#!/bin/sh\ncd {shlex.quote(str(ROOT))}\n"
                             f"case \"$SLURM_ARRAY_TASK_ID\" in\n{''.join(cases)}esac\n{NOTE_JOB}{SCRUB}"
                             f'"$@" >"$out" 2>"$err"\n{RECORD_EXIT}')
        marks = [Path(f"{task.stem}.rc") for task in batch]
        name = f"bisect-round-{os.getpid()}-{time.time_ns()}"
        limit = max(task.timeout for task in batch)
        sbatch = ["sbatch", "--parsable", f"--array=0-{len(batch) - 1}", f"--job-name={name}",
                  f"--output={base}.%a.slurm", *self.opts.sbatch_args(),
                  f"--time={max(1, int(limit // 60) + 1)}", str(script)]
        job, stderr, found, codes, seconds = _submit_and_wait(sbatch, name, beat, marks, array=True)
        if not job:
            raise contract.HarnessFailure(f"sbatch --array failed: {stderr.strip()[-200:]}")
        self.arrays.append(job)
        self.log(f"[slurm] array job {job}: {len(batch)} task(s), one per probe of the round")
        outcomes = []
        for i, (task, code) in enumerate(zip(batch, codes, strict=True)):
            outcomes.append(_judged(f"job {job}_{i}", found.get(i, "UNKNOWN"), code,
                                    Path(f"{task.stem}.stdout"), Path(f"{task.stem}.stderr"), task.timeout,
                                    task.signature, seconds, self.log))
        return outcomes


@contextlib.contextmanager
def array_round(probes: int, opts: Options, log=print):
    """While the block runs, ``run`` calls (from the round's probe threads) join one job array."""
    global _ROUND
    _ROUND = ArrayRound(probes, opts, log)
    try:
        yield _ROUND
    finally:
        _ROUND = None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 5 and argv[0] == "guard" and argv[3] == "--":
        return guard(Path(argv[1]), float(argv[2]), argv[4:])
    raise BadInput("usage: python -m tools.launch.slurm_jobs guard BEAT STALE -- CMD...")


if __name__ == "__main__":
    sys.exit(contract.run_main(main))

