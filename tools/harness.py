"""Run one repro in a fresh process group under a hard wall-clock limit.

The repro is started as the leader of a new session: a new interpreter (``run``), or a fork of
the calling process (``run_forked``, for a parent that has imported torch and Lightning once).
The group is killed (SIGTERM, then SIGKILL) when the leader exits, when the time limit passes,
or when another member of the group dies and the leader does not follow within ``peer_grace``
seconds: a crashed rank never leaves its peer blocked in a collective. stdout and stderr are
kept in full next to each other; the verdict line is parsed and the exit code is mapped onto the
contract (see ``tools.contract``).
"""

from __future__ import annotations

import gc
import os
import re
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


def _wait(proc, timeout: float, peer_grace: float, poll: float = 0.1):
    """Wait for the leader; return why waiting stopped: None (it exited), 'timeout', 'peer'.

    A member that lived at least 2 s and then vanished is taken for a dead rank (short-lived
    helpers such as ``uname`` started at import time do not count).
    """
    deadline = time.monotonic() + timeout
    first_seen: dict[int, float] = {}
    peer_died_at = None
    while proc.poll() is None:
        now = time.monotonic()
        if now >= deadline:
            return "timeout"
        alive = group_members(proc.pid)
        for pid in alive:
            first_seen.setdefault(pid, now)
        gone = [pid for pid, t in first_seen.items() if pid not in alive and now - t >= 2.0]
        if gone and peer_died_at is None and proc.poll() is None:
            peer_died_at = now
        if peer_died_at is not None and now - peer_died_at >= peer_grace:
            return "peer"
        time.sleep(poll)
    return None


def run(cmd: list[str], *, timeout: float, log_stem: str | Path | None = None,
        env: dict | None = None, cwd: str | Path | None = None, peer_grace: float = 30.0,
        require_record: bool = True, signature: str | None = None) -> RunResult:
    """Run ``cmd`` (a repro) and judge it by the contract.

    ``require_record``: exit 1 counts as bad only with a verdict line saying so (an uncaught
    exception also exits 1). For a user's own script without a verdict line, pass
    ``require_record=False`` and, ideally, ``signature``: a regex that must appear in its output.
    """
    def start(out, err):
        return subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)

    return _supervise(start, timeout=timeout, log_stem=log_stem, peer_grace=peer_grace,
                      require_record=require_record, signature=signature)


def run_forked(target, *, timeout: float, log_stem: str | Path | None = None,
               peer_grace: float = 30.0, require_record: bool = True,
               signature: str | None = None) -> RunResult:
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
    def start(out, err):
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        # no Ctrl-C may land between fork and the child's own handlers (it would unwind the
        # child through this function, the parent's code path)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            pid = os.fork()
            if pid == 0:  # the child: never returns
                _child(target, out, err, parent, mask)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return _Forked(pid)

    return _supervise(start, timeout=timeout, log_stem=log_stem, peer_grace=peer_grace,
                      require_record=require_record, signature=signature)


def die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this process when ``parent``, which forked it, dies (Linux only).

    If the parent died before the request was made, exit at once: nothing would ever end us.
    """
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)


def _child(target, out, err, parent: int, mask) -> None:
    code = 1
    try:
        os.setsid()
        die_with_parent(parent)
        # the signal dispositions of a fresh interpreter, whatever the parent installed
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
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


def _supervise(start, *, timeout, log_stem, peer_grace, require_record, signature) -> RunResult:
    log_stem = Path(log_stem) if log_stem else None
    if log_stem:
        log_stem.parent.mkdir(parents=True, exist_ok=True)
        out_path, err_path = Path(f"{log_stem}.stdout"), Path(f"{log_stem}.stderr")
    else:
        out_path = err_path = None
    started = time.monotonic()
    out = open(out_path, "w+") if out_path else _temp()
    err = open(err_path, "w+") if err_path else _temp()
    with out, err:
        try:
            proc = start(out, err)
        except OSError as exc:
            return RunResult(contract.FAIL, "error", f"could not start: {exc}", 0.0, None)
        try:
            why = _wait(proc, timeout, peer_grace)
        except BaseException:  # Ctrl-C: no verdict, but never leave ranks behind
            kill_group(proc.pid)
            raise
        leftovers = kill_group(proc.pid)
        proc.wait()
        seconds = round(time.monotonic() - started, 2)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    result = _judge(proc.returncode, why, timeout, stdout, stderr, require_record, signature)
    result.seconds, result.leftovers = seconds, leftovers
    result.stdout_path = str(out_path) if out_path else None
    result.stderr_path = str(err_path) if err_path else None
    return result


def _temp():
    import tempfile

    return tempfile.TemporaryFile("w+")


def _judge(rc, why, timeout, stdout, stderr, require_record, signature) -> RunResult:
    record = contract.parse_verdict_line(stdout)

    def result(code, reason=None):
        return RunResult(code, contract.name(code), reason, 0.0, rc, record)

    if why == "timeout":
        return result(contract.SKIP, f"timed out after {timeout:g} s; process group killed")
    if why == "peer":
        return result(contract.SKIP, "a rank died and its peer did not exit; process group killed")
    if rc < 0:
        died = signal.Signals(-rc).name
        if signature and record is None and re.search(signature, stdout + stderr):
            # the bug's signature was printed, then the process died of a signal on its own (torch
            # 2.13 + gloo sometimes aborts at interpreter exit: "terminate called without an
            # active exception"): what was seen stands
            return result(contract.BAD, f"signature /{signature}/ seen; then the process died of {died}")
        return result(contract.SKIP, f"killed by {died}")
    if record is not None and record.get("exit_code") != rc:
        return result(contract.FAIL, f"verdict line says {record.get('exit_code')}, exit code {rc}")
    if rc == contract.BAD:
        if signature and not re.search(signature, stdout + stderr):
            return result(contract.SKIP, f"exit 1 without the signature /{signature}/")
        if require_record and record is None and not signature:
            tail = (stderr.strip().splitlines() or [""])[-1]
            return result(contract.SKIP, f"exit 1 without a verdict line: {tail[:200]}")
        return result(contract.BAD, record and record.get("signature"))
    if rc in (contract.GOOD, contract.SKIP):
        reason = (record or {}).get("details", {}).get("reason") if rc == contract.SKIP else None
        return result(rc, reason)
    if rc >= contract.FAIL:
        return result(rc, f"the repro reported a harness failure (exit {rc})")
    return result(contract.SKIP, f"unrelated exit code {rc}")
