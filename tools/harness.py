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

import contextlib
import errno
import gc
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
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


def how_to_run(script: Path, option: str, given: str | None = None) -> str:
    """How a user's script runs, checked before anything else: ``"python"`` (a ``.py`` file or a
    ``#!`` line naming python: the environment's interpreter runs it) or ``"exec"`` (another
    ``#!`` line, executable: it runs as it is, the environment's ``bin`` first on ``PATH``). A
    folder, a missing file, a plain text file or a ``#!`` script without the executable bit is
    bad input, named after the ``option`` that gave it."""
    given = given or str(script)
    script = Path(script)
    if script.is_dir():
        raise contract.BadInput(f"{option} {given} is a directory, not a script")
    if not script.is_file():
        raise contract.BadInput(f"{option} {given}: not found")
    try:
        with open(script, "rb") as fh:
            first = fh.readline(256)
    except OSError as err:
        raise contract.BadInput(f"{option} {given}: cannot read it ({err.strerror})") from None
    if first.startswith(b"#!"):
        if b"python" in first:
            return "python"
        if not os.access(script, os.X_OK):
            raise contract.BadInput(f"{option} {given} has a #! line but is not executable (chmod +x)")
        return "exec"
    if script.suffix == ".py":
        return "python"
    raise contract.BadInput(f"{option} {given}: cannot tell how to run it (not a .py file, no #! line)")


def env_for(python: Path, env: dict | None = None) -> dict:
    """``env`` (default: this process's) with ``python``'s ``bin`` folder first on ``PATH``."""
    env = dict(os.environ if env is None else env)
    env["PATH"] = f"{Path(python).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


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


def run(cmd: list[str], *, timeout: float, log_stem: str | Path | None = None,
        env: dict | None = None, cwd: str | Path | None = None, peer_grace: float = 30.0,
        signature: str | None = None, stop=None, log_limit: int | None = None,
        exit_is_signal: bool = False) -> RunResult:
    """Run ``cmd`` (a repro) and judge it by the contract (``contract.judge``): exit 1 is bad
    only with a verdict line saying so or with ``signature``, a regex found in its output (for
    a user's own script that prints no verdict line). ``log_limit``: bytes of each stream kept
    in the log files (untrusted code must not fill the disk through them). ``exit_is_signal``:
    ``cmd`` reports a death by signal N as exit 128 + N, as a shell or a sandbox does."""
    def start(out, err, ranks_file, _readers, run_id):
        child_env = {**(os.environ if env is None else env), RANKS_FILE: ranks_file, RUN_ID: run_id}
        _take_sigint_back()
        nice = session_nice()
        # a program that cannot be started fails here as it would without the shell (exit 128)
        shell = nice is not None and _startable(cmd[0], child_env, cwd)
        argv = ["/bin/sh", "-c", NICE_SESSION, "sh", str(nice), *cmd] if shell else cmd
        return subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=child_env, cwd=cwd, start_new_session=True)

    return _supervise(start, timeout=timeout, log_stem=log_stem, peer_grace=peer_grace,
                      signature=signature, stop=stop, log_limit=log_limit, exit_is_signal=exit_is_signal)


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
    def start(out, err, ranks_file, readers, run_id):
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        # no Ctrl-C may land between fork and the child's own handlers (it would unwind the
        # child through this function, the parent's code path)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            pid = os.fork()
            if pid == 0:  # the child: never returns
                _child(target, out, err, parent, mask, ranks_file, readers, run_id)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return _Forked(pid)

    return _supervise(start, timeout=timeout, log_stem=log_stem, peer_grace=peer_grace,
                      signature=signature)


def session_nice() -> int | None:
    """The nice value a run's new session must be given, or None when there is nothing to do.

    On Linux with autogroups (``/proc/sys/kernel/sched_autogroup_enabled``) every session gets its
    own share of the CPU, weighed by the session's nice value, which starts at 0 whatever its
    processes' own: a run, which leads a session of its own, would escape ``nice nox ...`` and
    take the cores as if it were not nice. So the run's session gets this process's niceness,
    before the run's own code starts (a niced parent may not get the CPU back for a while once
    its child runs). Nothing to do at nice 0, or without autogroups."""
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    return nice if nice > 0 and os.path.exists("/proc/self/autogroup") else None


# A new program's session takes its nice value ($1), then the shell becomes the program. Without
# CAP_SYS_ADMIN the kernel refuses a second such write within 0.1 s of any other (EAGAIN): try
# again, a few times.
NICE_SESSION = ('i=0; until { echo "$1" > /proc/self/autogroup; } 2>/dev/null || [ $i -ge 6 ]; '
                'do i=$((i + 1)); sleep 0.05; done; shift; exec "$@"')


def _nice_own_session(nice: int) -> None:
    """In a fork that leads a new session: what NICE_SESSION does."""
    for _ in range(7):
        try:
            with open("/proc/self/autogroup", "w") as fh:
                fh.write(str(nice))
            return
        except OSError as err:
            if err.errno != errno.EAGAIN:
                return
            time.sleep(0.05)


def _startable(program: str | Path, env: dict, cwd: str | Path | None) -> bool:
    """Whether exec starts ``program`` itself (a binary or a ``#!`` script): only then may the shell
    go first. Otherwise Popen's own error stands ("could not start"): the shell would run a text
    file without ``#!`` as a shell script, and fail a folder with 126."""
    program = os.fspath(program)
    if os.sep in program:
        path = os.path.join(cwd or ".", program)
    else:
        path = shutil.which(program, path=env.get("PATH", os.defpath))
    if not path or not os.path.isfile(path) or not os.access(path, os.X_OK):
        return False
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return False
    return head[:2] == b"#!" or head == b"\x7fELF"


def _take_sigint_back() -> None:
    """A harness started in the background (``nox ... &``) inherits SIGINT ignored, and its runs
    would inherit that through exec: a repro of Ctrl-C (``os.kill(pid, SIGINT)``) would never
    see its signal, a wrong verdict. So this process takes SIGINT back (Python's own handler,
    which a new program gets as the default). Not with ``preexec_fn``: that forks with the
    at-fork handlers (logging's), and a signal landing in one of them is swallowed."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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


def _child(target, out: int, err: int, parent: int, mask, ranks_file: str, readers=(),
           run_id: str = "") -> None:
    code = 1
    try:
        for fd in readers:  # the parent's ends of the output pipes
            os.close(fd)
        os.setsid()
        nice = session_nice()
        if nice is not None:
            _nice_own_session(nice)
        die_with_parent(parent)
        # the signal dispositions of a fresh interpreter, whatever the parent installed
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.environ[RANKS_FILE] = ranks_file
        os.environ[RUN_ID] = run_id  # what the processes it starts carry (see _kill_escaped)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(out, 1)
        os.dup2(err, 2)
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


TAIL = 2 << 20  # bytes of each stream kept for the judgement (the verdict line is the last)
LINE = 64 << 10  # a line longer than this is matched in pieces


class _Sink:
    """A run's stdout and stderr, read from pipes as they come: written to the log files, the
    last ``TAIL`` bytes kept for the judgement, every line matched against the signature (so a
    run that prints 100 MB costs a few MB here, and the signature counts wherever it was). A log
    that cannot be written (a full or read-only disk) is remembered: that run has no verdict."""

    def __init__(self, paths, signature: str | None, limit: int | None = None):
        import re
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
    import errno

    what = {errno.ENOSPC: "the disk is full", errno.EROFS: "the file system is read-only",
            errno.EDQUOT: "the disk quota is exceeded"}.get(err.errno, err.strerror or str(err))
    return (f"harness failure: cannot write the run's logs in {where}: {what}; the run has no "
            "verdict")


def _supervise(start, *, timeout, log_stem, peer_grace, signature, stop=None, log_limit=None,
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


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _children() -> dict[int, list[str]]:
    me = os.getpid()
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
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
            fields = _stat(int(entry)) if entry.isdigit() else None
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
            fields = _stat(int(entry)) if entry.isdigit() else None
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


# -- what a run leaves in the temporary folder, and its owner ---------------------------------------

OWNED = re.compile(r"^(ranks|sandbox)-(\d+)\.(\d+)-")


def _start_time(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def owned(prefix: str) -> str:
    """The start of the name of a temporary file or folder this process owns: its pid and start
    time, so that once it is gone (even SIGKILLed) the next run can tell, and remove it."""
    return f"{prefix}-{os.getpid()}.{_start_time(os.getpid())}-"


def owned_tempdir(prefix: str) -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix=owned(prefix)))


def owner_alive(name: str) -> bool:
    """Is the process that made ``name`` (see ``owned``) still running? A name of another shape
    counts as alive (never removed)."""
    m = OWNED.match(name)
    return m is None or _start_time(int(m.group(2))) == int(m.group(3))


_SWEPT: list[bool] = []


def sweep(log=None) -> list[str]:
    """Remove, once per process, the pid files and sandbox folders in the temporary folder whose
    owner process is gone (a harness that was SIGKILLed), saying what was removed."""
    import tempfile

    if _SWEPT:
        return []
    _SWEPT.append(True)
    removed = []
    folder = Path(tempfile.gettempdir())
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not OWNED.match(entry.name) or owner_alive(entry.name):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
        if not entry.exists():
            removed.append(str(entry))
            m = OWNED.match(entry.name)
            (log or _say)(f"[sweep] removed {entry}: left by process {m.group(2)}, which is gone")
    return removed


def _say(message: str) -> None:
    print(message, file=sys.stderr)

