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

import errno
import gc
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tools.core import contract
from tools.launch.process_group import RANKS_FILE, RUN_ID, RunResult, supervise


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

    return supervise(start, timeout=timeout, log_stem=log_stem, peer_grace=peer_grace,
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

    return supervise(start, timeout=timeout, log_stem=log_stem, peer_grace=peer_grace,
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
