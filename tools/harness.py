"""Run one repro in a fresh process group under a hard wall-clock limit.

The repro is started as the leader of a new session: a new interpreter (``run``), or a fork of
the calling process (``run_forked``, for a parent that has imported torch and Lightning once).
The group is killed (SIGTERM, then SIGKILL) when the leader exits, when the time limit passes,
when another *rank* of the run dies and the leader does not follow within ``peer_grace`` seconds
(a crashed rank never leaves its peer blocked in a collective; loader workers and helpers may
come and go), and, by a watchdog, when this process dies without doing it. stdout and stderr are
kept in full next to each other; the run is judged by ``contract.judge``.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools import contract


@dataclass
class RunResult:
    code: int  # the contract's exit code
    verdict: str
    reason: str | None
    seconds: float
    returncode: int | None  # the leader's own exit status (negative: killed by that signal)
    record: dict | None = None  # the repro's verdict line
    stdout_path: str | None = None
    stderr_path: str | None = None
    leftovers: list[int] = field(default_factory=list)  # pids still alive after the kill
    final: bool = False  # a verdict of the repro itself, fine to cache (see contract.judge)

    def to_dict(self) -> dict:
        return asdict(self)


def group_members(pgid: int) -> set[int]:
    """PIDs whose process group is ``pgid`` (Linux /proc)."""
    members = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.add(int(entry))
    return members


def kill_group(pgid: int, grace: float = 3.0) -> list[int]:
    """SIGTERM the group, SIGKILL what is left after ``grace`` s; returns pids still alive."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return []
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not group_members(pgid):
                return []
            time.sleep(0.05)
    return sorted(group_members(pgid))


RANK_VARS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK")
RANKS_FILE = "HARNESS_RANKS_FILE"  # where a launcher that forks its ranks declares their pids


def _rank_id(pid: int) -> tuple | None:
    """The rank variables a process was started with (``/proc/PID/environ``), or None."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    found = tuple(env.get(var.encode()) for var in RANK_VARS)
    return found if any(found) else None


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def is_rank(pid: int) -> bool:
    """Was ``pid`` started as a rank by a launcher (torchrun, Lightning's, SLURM, MPI)?

    A rank carries rank variables its parent does not have: a DataLoader worker, a compile
    helper or a ``git`` call started by a rank inherits the rank's variables and is not one.
    """
    own = _rank_id(pid)
    return own is not None and _rank_id(_parent(pid) or 0) != own


def _declared(path: str | None) -> set[int]:
    try:
        return {int(x) for x in Path(path).read_text().split()} if path else set()
    except (OSError, ValueError):
        return set()


def _wait(proc, timeout: float, peer_grace: float, ranks_file: str | None = None, poll: float = 0.1,
          stop=None):
    """Wait for the leader; return why waiting stopped: None (it exited), 'timeout', 'peer'
    (a rank died, or ``stop``, a ``threading.Event``, was set: another node of the job ended).

    Only ranks count as peers: processes started with rank variables (``is_rank``) and the pids
    a launcher declared in ``ranks_file`` (forked ranks keep their parent's environment). Any
    other process of the group (loader workers, helpers) may come and go.
    """
    deadline = time.monotonic() + timeout
    ranks: set[int] = set()
    peer_died_at = None
    while proc.poll() is None:
        now = time.monotonic()
        if now >= deadline:
            return "timeout"
        alive = group_members(proc.pid) - {proc.pid}
        ranks |= _declared(ranks_file)
        ranks |= {pid for pid in alive - ranks if is_rank(pid)}  # (a child may exec later)
        if ranks - alive and peer_died_at is None and proc.poll() is None:
            peer_died_at = now
        if peer_died_at is not None and now - peer_died_at >= peer_grace:
            return "peer"
        if stop is not None and stop.is_set():
            return "peer"
        time.sleep(poll)
    return None


def run(cmd: list[str], *, timeout: float, log_stem: str | Path | None = None,
        env: dict | None = None, cwd: str | Path | None = None, peer_grace: float = 30.0,
        signature: str | None = None, stop=None) -> RunResult:
    """Run ``cmd`` (a repro) and judge it by the contract (``contract.judge``): exit 1 is bad
    only with a verdict line saying so or with ``signature``, a regex found in its output (for
    a user's own script that prints no verdict line)."""
    def start(out, err, ranks_file):
        child_env = {**(os.environ if env is None else env), RANKS_FILE: ranks_file}
        return subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=child_env, cwd=cwd, start_new_session=True)

    return _supervise(start, timeout=timeout, log_stem=log_stem, peer_grace=peer_grace,
                      signature=signature, stop=stop)


def run_forked(target, *, timeout: float, log_stem: str | Path | None = None,
               peer_grace: float = 30.0, signature: str | None = None) -> RunResult:
    """Run ``target()`` in a fork of this process, with the guarantees and judgement of ``run``.

    The fork leads a new session (so the whole group is killed as with ``run``), has stdin on
    /dev/null and stdout/stderr in the run's own files, and dies with this process. Its exit code
    is what ``target`` passes to ``sys.exit`` / ``os._exit`` (an uncaught exception: 1, as
    Python's). A fresh fork for every run: nothing a run does reaches the next one.

    Fork only from a parent that has imported what it needs and done nothing else: no CUDA
    initialised (a forked child cannot use a CUDA context of its parent), no thread pool started
    (torch's intra-op threads or any other thread: a fork copies only the forking thread, so a
    lock held by another thread stays locked forever in the child), no process group initialised.
    """
    def start(out, err, ranks_file):
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        # no Ctrl-C may land between fork and the child's own handlers (it would unwind the
        # child through this function, the parent's code path)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            pid = os.fork()
            if pid == 0:  # the child: never returns
                _child(target, out, err, parent, mask, ranks_file)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return _Forked(pid)

    return _supervise(start, timeout=timeout, log_stem=log_stem, peer_grace=peer_grace,
                      signature=signature)


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when ``parent``, which forked it, dies (Linux
    only). If the parent died before the request was made, exit at once: nothing would end us.
    """
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)


def _child(target, out, err, parent: int, mask, ranks_file: str) -> None:
    code = 1
    try:
        os.setsid()
        die_with_parent(parent)
        # the signal dispositions of a fresh interpreter, whatever the parent installed
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.environ[RANKS_FILE] = ranks_file
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        # the parent's sys.stdout / sys.stderr may not write to fds 1 and 2 (pytest's capture)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)
        # a run starts from a collected heap, whatever the parent allocated before forking: the
        # moment of the next full collection (what the GC-timing scenarios of #20706 turn on)
        # then depends on the run alone
        gc.collect()
        try:
            target()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, int | None):
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: B036  (as an uncaught exception in a fresh interpreter)
            import traceback

            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class _Forked:
    """The parts of ``subprocess.Popen`` the supervision uses, for a forked child."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self):
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


def _supervise(start, *, timeout, log_stem, peer_grace, signature, stop=None) -> RunResult:
    log_stem = Path(log_stem) if log_stem else None
    if log_stem:
        log_stem.parent.mkdir(parents=True, exist_ok=True)
        out_path, err_path = Path(f"{log_stem}.stdout"), Path(f"{log_stem}.stderr")
    else:
        out_path = err_path = None
    started = time.monotonic()
    # any bytes a repro prints are read back (a non-UTF-8 byte must not crash the judgement)
    out = open(out_path, "w+", errors="replace") if out_path else _temp()
    err = open(err_path, "w+", errors="replace") if err_path else _temp()
    ranks_file = _ranks_file()
    with out, err, ranks_file:
        try:
            proc = start(out, err, ranks_file.name)
        except OSError as exc:
            return RunResult(contract.FAIL, "error", f"could not start: {exc}", 0.0, None)
        watchdog = _watchdog(proc.pid)
        try:
            why = _wait(proc, timeout, peer_grace, ranks_file.name, stop=stop)
        except BaseException:  # Ctrl-C, SIGTERM: no verdict, but never leave ranks behind
            kill_group(proc.pid)
            raise
        finally:
            watchdog.kill()
            watchdog.wait()
        leftovers = kill_group(proc.pid)
        proc.wait()
        seconds = round(time.monotonic() - started, 2)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    j = contract.judge(proc.returncode, stdout, stderr, signature=signature, stopped=why,
                       timeout=timeout)
    reason = j.reason
    if why == "peer" and stop is not None and stop.is_set():
        reason = "another node of the job ended and this one did not; its process group was killed"
    result = RunResult(j.code, contract.name(j.code), reason, seconds, proc.returncode, j.record,
                       leftovers=leftovers, final=j.final)
    result.stdout_path = str(out_path) if out_path else None
    result.stderr_path = str(err_path) if err_path else None
    return result


WATCHDOG = 'while kill -0 "$1" 2>/dev/null; do sleep 0.5; done; kill -9 "-$2" 2>/dev/null'


def _watchdog(pgid: int) -> subprocess.Popen:
    """A tiny shell that kills the run's group if this process dies without doing it (SIGKILL,
    a crash): a run never outlives its supervisor. Killed by us when the run ends normally."""
    return subprocess.Popen(["/bin/sh", "-c", WATCHDOG, "watchdog", str(os.getpid()), str(pgid)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _ranks_file():
    import tempfile

    return tempfile.NamedTemporaryFile("w", prefix="ranks-", suffix=".pids")


def _temp():
    import tempfile

    return tempfile.TemporaryFile("w+", errors="replace")
