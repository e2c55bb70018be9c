"""A run's process group, watched to its end: its output streamed to the logs (capped for
untrusted code), the group killed when the leader exits, the limit passes, or a rank dies and its
peers do not follow; what escaped the group found and killed; the run judged (``contract.judge``)
into a ``RunResult``."""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools.core import contract
from tools.launch.leftovers import owned, proc_stat, sweep


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
RUN_ID = "HARNESS_RUN_ID"  # in every run's environment: tells its escaped processes apart


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


# set by a caller whose runs in other threads must stop now (an interrupted round of parallel
# probes): every run being waited for is ended as "aborted" (its group killed), never a verdict
ABORT = threading.Event()


def _wait(proc, timeout: float, peer_grace: float, ranks_file: str | None = None, poll: float = 0.1,
          stop=None, pump=time.sleep):
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
        if ABORT.is_set():
            return "aborted"
        pump(poll)  # the run's output, as it comes (or just the wait)
    return None


TAIL = 2 << 20  # bytes of each stream kept for the judgement (the verdict line is the last)
LINE = 64 << 10  # a line longer than this is matched in pieces


class _Sink:
    """A run's stdout and stderr, read from pipes as they come: written to the log files, the
    last ``TAIL`` bytes kept for the judgement, every line matched against the signature (so a
    run that prints 100 MB costs a few MB here, and the signature counts wherever it was). A log
    that cannot be written (a full or read-only disk) is remembered: that run has no verdict."""

    def __init__(self, paths, signature: str | None, limit: int | None = None):
        import selectors

        self.limit, self.written = limit, [0, 0]
        self.pattern = re.compile(signature) if signature else None
        self.seen = False
        self.error: OSError | None = None
        self.files, self.tails, self.partial, self.fds = [], [bytearray(), bytearray()], [b"", b""], []
        for path in paths:
            try:
                self.files.append(open(path, "wb") if path else None)  # noqa: SIM115
            except OSError as err:
                self.error = self.error or err
                self.files.append(None)
        self.selector = selectors.DefaultSelector()

    def attach(self, out_fd: int, err_fd: int) -> None:
        for i, fd in enumerate((out_fd, err_fd)):
            os.set_blocking(fd, False)
            self.selector.register(fd, 1, i)  # EVENT_READ
            self.fds.append(fd)

    def pump(self, wait: float) -> None:
        """Take what the pipes hold, waiting up to ``wait`` seconds for something to come."""
        for key, _ in self.selector.select(wait):
            self._read(key.fd, key.data)

    def drain(self) -> None:
        """After the run's group was killed: what is left in the pipes, without waiting for an
        end of file (a process that left the group on purpose may still hold a pipe)."""
        for _ in range(10000):
            ready = self.selector.select(0)
            if not ready:
                return
            for key, _ in ready:
                self._read(key.fd, key.data)

    def _read(self, fd: int, i: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            self.selector.unregister(fd)
            return
        if self.files[i] is not None and self.error is None:
            try:
                self._write(i, data)
            except OSError as err:
                self.error = err
        tail = self.tails[i]
        tail += data
        if len(tail) > TAIL:
            del tail[:len(tail) - TAIL]
        if self.pattern and not self.seen:
            lines = (self.partial[i] + data).split(b"\n")
            self.partial[i] = lines.pop()[-LINE:]
            self.seen = any(self.pattern.search(line.decode(errors="replace")) for line in lines)

    def _write(self, i: int, data: bytes) -> None:
        if self.limit is None:
            self.files[i].write(data)
            return
        before, after = self.written[i], self.written[i] + len(data)
        if before < self.limit:
            self.files[i].write(data[:self.limit - before])
        if before <= self.limit < after:  # the first byte past the limit: said once
            self.files[i].write(f"\n[the log stops here: its limit is {self.limit >> 20} MiB]\n".encode())
        self.written[i] += len(data)

    def close(self) -> tuple[str, str]:
        """The tails as text; the log files flushed (an error there is remembered too)."""
        if self.pattern and not self.seen:
            self.seen = any(self.pattern.search(p.decode(errors="replace")) for p in self.partial)
        for f in self.files:
            if f is not None:
                try:
                    f.close()
                except OSError as err:
                    self.error = self.error or err
        for fd in self.fds:
            os.close(fd)
        self.selector.close()
        return tuple(bytes(t).decode(errors="replace") for t in self.tails)


def _log_failure(err: OSError, where: Path | None) -> str:

    what = {errno.ENOSPC: "the disk is full", errno.EROFS: "the file system is read-only",
            errno.EDQUOT: "the disk quota is exceeded"}.get(err.errno, err.strerror or str(err))
    return (f"harness failure: cannot write the run's logs in {where}: {what}; the run has no "
            "verdict")


def supervise(start, *, timeout, log_stem, peer_grace, signature, stop=None, log_limit=None,
               exit_is_signal=False) -> RunResult:
    sweep()
    log_stem = Path(log_stem) if log_stem else None
    out_path = err_path = None
    if log_stem:
        out_path, err_path = Path(f"{log_stem}.stdout"), Path(f"{log_stem}.stderr")
        try:
            log_stem.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return RunResult(contract.FAIL, "error", _log_failure(exc, log_stem.parent), 0.0, None)
    started = time.monotonic()
    sink = _Sink((out_path, err_path), signature, log_limit)
    if sink.error:
        sink.close()
        return RunResult(contract.FAIL, "error", _log_failure(sink.error, log_stem.parent), 0.0, None)
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    sink.attach(out_r, err_r)
    _subreaper()
    run_id = f"{os.getpid()}-{time.time_ns()}"
    ranks_file = _ranks_file()
    with ranks_file:
        with _LOCK:  # started and recorded before another thread's run looks for escaped processes
            try:
                try:
                    proc = start(out_w, err_w, ranks_file.name, (out_r, err_r), run_id)
                finally:
                    os.close(out_w)
                    os.close(err_w)
            except OSError as exc:
                sink.close()
                return RunResult(contract.FAIL, "error", f"could not start: {exc}", 0.0, None)
            watchdog = _watchdog(proc.pid)
            _STARTED.update({proc.pid, watchdog.pid})
        try:
            why = _wait(proc, timeout, peer_grace, ranks_file.name, stop=stop, pump=sink.pump)
        except BaseException:  # Ctrl-C, SIGTERM: no verdict, but never leave ranks behind
            kill_group(proc.pid)
            sink.close()
            raise
        finally:
            _end_watchdog(watchdog)
        leftovers = kill_group(proc.pid)
        proc.wait()
        with _LOCK:
            leftovers += _kill_escaped(started, run_id, {proc.pid, watchdog.pid}, proc.pid)
            _reap({proc.pid, watchdog.pid})
            _STARTED.difference_update({proc.pid, watchdog.pid})
        sink.drain()
        seconds = round(time.monotonic() - started, 2)
        stdout, stderr = sink.close()
    if sink.error is not None:
        return RunResult(contract.FAIL, "error", _log_failure(sink.error, log_stem and log_stem.parent),
                         seconds, proc.returncode, stdout_path=str(out_path), stderr_path=str(err_path),
                         leftovers=leftovers)
    if exit_is_signal and proc.returncode is not None and 128 < proc.returncode <= 128 + 64:
        proc.returncode = -(proc.returncode - 128)
    j = contract.judge(proc.returncode, stdout, stderr, signature=signature, stopped=why,
                       timeout=timeout, seen=sink.seen)
    reason = j.reason
    if why == "peer" and stop is not None and stop.is_set():
        reason = "another node of the job ended and this one did not; its process group was killed"
    result = RunResult(j.code, contract.name(j.code), reason, seconds, proc.returncode, j.record,
                       leftovers=leftovers, final=j.final)
    result.stdout_path = str(out_path) if out_path else None
    result.stderr_path = str(err_path) if err_path else None
    return result


_STARTED: set[int] = set()  # leaders and watchdogs of runs under way here (every thread's)


# held while a run starts and records its processes, and while one looks for escaped processes:
# runs in several threads (parallel probes, the nodes of a job) never take each other's for daemons
_LOCK = threading.Lock()


def _new_lock() -> None:
    """A forked run's own lock: ``run_forked`` forks while holding it, and the fork (a repro that
    launches runs of its own, as the stress repro does) would wait on that copy forever."""
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_lock)


def _subreaper() -> None:
    """Make this process the one that inherits the orphans of its runs (Linux's
    PR_SET_CHILD_SUBREAPER): a process a run started that left the run's group on purpose
    (``setsid``, a daemon) is then a child of ours when its parent exits, where it can be found."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1)
    except (OSError, AttributeError):
        pass


def _children() -> dict[int, list[str]]:
    me = os.getpid()
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = proc_stat(int(entry))
            if fields and int(fields[1]) == me:
                out[int(entry)] = fields
    return out


def _kill_escaped(since: float, run_id: str, own: set[int], run_session: int | None = None) -> list[int]:
    """Processes of the run that left its group on purpose and outlived it: a new session
    (``setsid``, a daemon) makes them our children (see ``_subreaper``): alive, in a session that
    is neither ours nor that of a run under way here, started after the run began, and carrying
    this run's id (or no run id at all: a process that cleared its environment); a group of
    their own inside the run's session ``run_session`` (``setpgid``, a shell's job control)
    keeps them alive in it after its group was killed. ``own``: the run's and its watchdog's
    sessions (what is still dying there in the run's group was killed already). Killed; their
    pids are returned, for the run's ``leftovers``."""
    session = os.getsid(0)
    busy = set(own)
    for pid in tuple(_STARTED):
        try:
            busy.add(os.getsid(pid))
        except OSError:
            pass
    ticks = os.sysconf("SC_CLK_TCK")
    boot = time.time() - float(Path("/proc/uptime").read_text().split()[0])
    began = time.time() - (time.monotonic() - since)
    escaped = []
    for pid, fields in _children().items():
        if pid in _STARTED or fields[0] == "Z" or int(fields[3]) in busy | {session}:
            continue
        if boot + int(fields[19]) / ticks < began - 0.05:  # (the clocks' resolution)
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"{RUN_ID}=".encode() in environ and f"{RUN_ID}={run_id}\0".encode() not in environ:
            continue  # another run's
        escaped.append(pid)
    if run_session is not None and run_session != session:
        for entry in os.listdir("/proc"):
            fields = proc_stat(int(entry)) if entry.isdigit() else None
            if fields and fields[0] != "Z" and int(fields[3]) == run_session != int(fields[2]):
                escaped.append(int(entry))
    for pid in escaped:
        for kill in (os.killpg, os.kill):  # its group, if it leads one; else itself
            try:
                kill(pid, signal.SIGKILL)
                break
            except (ProcessLookupError, PermissionError):
                continue
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return escaped


def _reap(sessions: set[int], wait: float = 5.0) -> None:
    """Collect the zombies the run left us (the orphans of its own group, and of the watchdog),
    until nothing of its sessions is left: a killed orphan still dying (the watchdog's ``sleep``)
    becomes our zombie only a moment later, and would stay one for as long as this process runs."""
    deadline = time.monotonic() + wait
    while True:
        left = False
        for entry in os.listdir("/proc"):
            fields = proc_stat(int(entry)) if entry.isdigit() else None
            if not fields or int(fields[3]) not in sessions:
                continue
            pid = int(entry)
            if fields[0] == "Z" and int(fields[1]) == os.getpid() and pid not in _STARTED - sessions:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
            else:
                left = True
        if not left or time.monotonic() > deadline:
            return
        time.sleep(0.01)


def _end_watchdog(watchdog: subprocess.Popen) -> None:
    try:
        os.killpg(watchdog.pid, signal.SIGKILL)  # the shell and its `sleep`
    except ProcessLookupError:
        pass
    watchdog.wait()


WATCHDOG = 'while kill -0 "$1" 2>/dev/null; do sleep 0.5; done; kill -9 "-$2" 2>/dev/null'


def _watchdog(pgid: int) -> subprocess.Popen:
    """A tiny shell that kills the run's group if this process dies without doing it (SIGKILL,
    a crash): a run never outlives its supervisor. Killed by us when the run ends normally."""
    return subprocess.Popen(["/bin/sh", "-c", WATCHDOG, "watchdog", str(os.getpid()), str(pgid)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _ranks_file():
    import tempfile

    return tempfile.NamedTemporaryFile("w", prefix=owned("ranks"), suffix=".pids")
