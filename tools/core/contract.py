"""The verdict contract, in one place: exit codes, the verdict line, the judgement of a run, and
the errors every program maps onto its exit code.

The codes are defined once, in ``repro/_contract.py`` (the repro scripts stay runnable with plain
``python``, without this package); everything here takes them from there.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_repro_contract", Path(__file__).resolve().parents[2] / "repro" / "_contract.py")
_repro = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_repro)

GOOD, BAD, SKIP, FAIL = _repro.GOOD, _repro.BAD, _repro.SKIP, _repro.FAIL
NAMES = {code: name for code, name in _repro.VERDICTS.items() if code != FAIL}
USAGE, INTERRUPTED = 2, 130  # the programs' own codes: bad input; Ctrl-C / SIGTERM


def name(code: int) -> str:
    """good / bad / skip, or error for anything that must stop a bisect (>= 128 and the rest)."""
    return NAMES.get(code, "error")


def parse_verdict_line(stdout: str) -> dict | None:
    """The last non-empty stdout line as a verdict record, or None when it is not one."""
    for line in reversed(stdout.splitlines()):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            return None
        return record if _well_formed(record) else None
    return None


def _well_formed(record) -> bool:
    """A verdict record whose fields have the contract's types (a line printed by any code may
    look like one: a malformed one is no verdict, never a crash of the judge)."""
    if not isinstance(record, dict) or not isinstance(record.get("verdict"), str) \
            or type(record.get("exit_code")) is not int:
        return False
    details = record.get("details", {})
    return isinstance(details, dict) and isinstance(details.get("reason"), str | None) \
        and isinstance(record.get("signature"), str | None)


@dataclass(frozen=True)
class Judgement:
    code: int
    reason: str | None
    record: dict | None
    final: bool  # a verdict of the repro itself (good, bad, a skip it declared): fine to cache


KILLED = "killed by "  # the start of the reason judge gives a run that died of a signal on its own


def judge(rc: int, stdout: str, stderr: str, *, signature: str | None = None,
          stopped: str | None = None, timeout: float | None = None, seen: bool = False) -> Judgement:
    """The verdict of one run: its exit status ``rc`` (negative: killed by that signal), its
    output (or its end), the user's ``signature`` regex, and why the supervisor stopped it (``stopped``:
    ``"timeout"``, ``"peer"``, ``"aborted"`` or None).

    "bad" only when the bug's signature was seen: a verdict line saying bad, or ``signature``
    found in the output. Exit 1 without either is an uncaught exception: cannot test. A verdict
    line that disagrees with itself or with the exit code is an error (the repro is broken).
    Timeouts, kills and unrelated exit codes are skips that are not final: try again later.
    """
    record = parse_verdict_line(stdout)

    def verdict(code, reason=None, final=False):
        return Judgement(code, reason, record, final)

    # ``seen``: the caller already found it in the output (the harness matches every line as it
    # streams, keeping only the end of a long output)
    seen = seen or bool(signature) and re.search(signature, stdout + stderr) is not None
    if stopped == "timeout":
        return verdict(SKIP, f"timed out after {timeout:g} s; process group killed")
    if stopped == "peer":
        return verdict(SKIP, "a rank died and its peer did not exit; process group killed")
    if stopped == "aborted":
        return verdict(SKIP, "stopped: the run it belonged to was interrupted; process group killed")
    if rc < 0:
        try:
            died = signal.Signals(-rc).name
        except ValueError:  # a real-time signal has no name
            died = f"signal {-rc}"
        if seen and record is None:
            # the signature was printed, then the process died of a signal on its own (torch 2.13
            # + gloo sometimes aborts at interpreter exit: "terminate called without an active
            # exception"): what was seen stands
            return verdict(BAD, f"signature /{signature}/ seen; then the process died of {died}", True)
        return verdict(SKIP, f"{KILLED}{died}")
    if record is not None:
        said_code, said = record.get("exit_code"), record.get("verdict")
        if said_code != rc:
            return verdict(FAIL, f"verdict line says exit {said_code}, exit code {rc}")
        if said != _repro.VERDICTS.get(rc, "error"):
            return verdict(FAIL, f"verdict line says {said!r} with exit code {rc}")
    if rc == BAD:
        if signature:
            return (verdict(BAD, f"signature /{signature}/ seen", True) if seen else
                    verdict(SKIP, f"exit 1 without the signature /{signature}/: {_tail(stderr)}"))
        if record is None:
            return verdict(SKIP, f"exit 1 without a verdict line: {_tail(stderr)}")
        return verdict(BAD, record.get("signature") or "bug signature seen", True)
    if rc == GOOD:
        return verdict(GOOD, None, True)
    if rc == SKIP:  # declared: its reason, or what it said last
        return verdict(SKIP, (record or {}).get("details", {}).get("reason") or _tail(stderr) or None,
                       True)
    if rc >= FAIL:
        return verdict(rc, f"the repro reported a harness failure (exit {rc})")
    return verdict(SKIP, f"unrelated exit code {rc}: {_tail(stderr)}")


# -- the replica check (tools/inject/workspace_replicas.py prints it, --check-replicas) ---------

REPLICAS_SIGNATURE = r"replicas diverged at step \d+"
NEVER_CHECKED = ("the replica check never ran: no DistributedDataParallel model of several ranks "
                 "reached a check (it needs Lightning >= 1.7 or torch >= 2.0)")


def merge_replica_reports(reports: list[dict]) -> dict | None:
    """The check's reports of one run (one per process that checked) as one: a divergence any
    rank saw, the checks of the processes that compared ranks, a reason why none could."""
    reports = [r for r in reports if _report_well_formed(r)]
    if not reports:
        return None
    compared = [r for r in reports if r.get("checks")]
    main = min(compared or reports, key=lambda r: (r.get("rank") is None, r.get("rank") or 0))
    diverged = next((r["diverged"] for r in sorted(reports, key=lambda r: r.get("rank") or 0)
                     if r.get("diverged")), None)
    why = next((r["why"] for r in reports if r.get("why")), None)
    return {**main, "diverged": diverged, "why": None if compared else why}


_REPORT_FIELDS = {"rank": int, "checks": int, "step": int, "steps": int, "epoch": int, "world": int,
                  "diverged": str, "why": str, "mechanism": str}


def _report_well_formed(report) -> bool:
    """A replica report whose fields have the check's types (the code under test could write one
    in the report folder: a malformed one is no report, never a crash of the judge)."""
    return isinstance(report, dict) and all(
        report.get(k) is None or (type(report[k]) is t if t is int else isinstance(report[k], t))
        for k, t in _REPORT_FIELDS.items())


def judge_replicas(code: int, reason: str | None, report: dict | None) -> tuple[int, str | None]:
    """A run's verdict under ``--check-replicas``, from its own verdict and the check's report
    (None: the check never wrote one). Never a pass without a check that compared replicas; a
    divergence the check found is bad even if the script carried on."""
    if report and report.get("diverged"):
        return BAD, report["diverged"]
    if code != GOOD:
        return code, reason
    if not report or not report.get("checks"):
        why = (report or {}).get("why")
        return SKIP, f"the replica check never ran: {why}" if why else NEVER_CHECKED
    at = f"step {report.get('step')}"
    if report.get("epoch") is not None:
        at += f", epoch {report['epoch']}"
    tail = ""
    if report.get("steps") and report.get("step") is not None and report["steps"] > report["step"]:
        tail = f"; the last {report['steps'] - report['step']} optimizer steps were not checked"
    return GOOD, (f"replicas agree: {report['checks']} checks of {report.get('world')} ranks "
                  f"({report.get('mechanism')}), the last at {at}{tail}")


def check_every(text: str) -> str:
    """A ``--check-replicas`` value: ``epoch`` or a number of steps >= 1."""
    import argparse

    if text == "epoch" or (text.isdigit() and int(text) >= 1):
        return text
    raise argparse.ArgumentTypeError(f"takes 'epoch' or a number of steps >= 1, not {text!r}")


def add_check_replicas(parser) -> None:
    """The ``--check-replicas[=EVERY]`` option, alike in every program that runs a user's script."""
    parser.add_argument(
        "--check-replicas", nargs="?", const="epoch", default=None, type=check_every, metavar="EVERY",
        help="inject the replica check into the script (unmodified): bad when DDP replicas diverge "
             "(the line 'replicas diverged at step N ...'); EVERY: 'epoch' (default: every epoch "
             "end and the last step) or a number of training steps; a run where it never compared "
             "replicas is 'cannot test', never good")


def add_judges(parser, script: str) -> None:
    """How a user's script (the option ``script`` names it) is judged, alike in every program
    that runs one: ``--signature``, ``--verdict-line`` and ``--check-replicas``."""
    parser.add_argument("--signature", help=f"regex the {script} output shows when the bug is there "
                                            "(needed for a script without a verdict line)")
    parser.add_argument("--verdict-line", action="store_true",
                        help=f"the {script} prints the contract's verdict line (then no --signature "
                             "needed)")
    add_check_replicas(parser)


REPO_HOW = "give --repo PATH|URL, or set $LIGHTNING_REPO; README: LIGHTNING_REPO"


def add_repo(parser, what: str = "the commit tier (Lightning commits between two releases)",
             without: str = "releases only", url: bool = True) -> None:
    """``--repo``, alike in every program that can use a Lightning git repository."""
    kind = "a path or a URL (cloned once into .cache)" if url else "a path"
    parser.add_argument("--repo", default=os.environ.get("LIGHTNING_REPO"),
                        help=f"a Lightning git repository, {kind}, for {what} (default: "
                             f"$LIGHTNING_REPO; without one, {without})")


def add_nodes(parser) -> None:
    """``--nodes N --ranks-per-node R``: every run as N nodes of one job on this machine
    (``tools.nodes``: a torchrun per node, c10d rendezvous), for a script written for several."""
    parser.add_argument("--nodes", type=int, default=1,
                        help="run the script as this many nodes (a torchrun each, on this machine)")
    parser.add_argument("--ranks-per-node", type=int, default=1, help="ranks of each node with --nodes")


def check_nodes(args) -> None:
    if args.nodes < 1 or args.ranks_per_node < 1:
        raise BadInput("--nodes and --ranks-per-node take numbers >= 1")
    if args.ranks_per_node > 1 and args.nodes == 1:
        raise BadInput("--ranks-per-node goes with --nodes N (N >= 2)")


def _tail(text: str) -> str:
    return (text.strip().splitlines() or [""])[-1][:200]


def check_signature(signature: str | None, option: str = "--signature") -> str | None:
    """A ``--signature`` regex, compiled once to reject a bad one before any run."""
    if signature is not None:
        try:
            re.compile(signature)
        except re.error as err:
            raise BadInput(f"{option} {signature!r} is not a valid regex: {err}") from None
    return signature


def seconds(text: str) -> float:
    """An argparse type for a duration: a finite number > 0 (a negative timeout would make every
    run "time out" at once)."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, not {text}")
    return value


def check_trials(trials: str) -> int | str:
    """A ``--trials`` value: a number >= 1, or ``"auto"``."""
    if trials == "auto":
        return trials
    try:
        number = int(trials)
    except ValueError:
        number = 0
    if number < 1:
        raise BadInput("--trials takes a number >= 1 or 'auto'")
    return number


# -- errors and the programs' exit codes ----------------------------------------------------

class Failure(Exception):
    """An error a program reports in one line and maps onto its exit code."""

    code = FAIL
    what = "error"


class BadInput(Failure, ValueError):
    """Bad options or input files: nothing was run (exit 2)."""

    code = USAGE


class DefaultsShown(argparse.HelpFormatter):
    """Help that gives each option's default, a duration's in seconds and a budget's in minutes:
    unless its text already says it, or it has none (a flag, an option absent unless given)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        absent = default is None or default is False or default in (argparse.SUPPRESS, [], ())
        if not action.option_strings or absent or "default" in text or not text:  # 0 is a default
            return text
        unit = (" s" if action.type is seconds or "timeout" in action.dest
                else " min" if action.metavar == "MINUTES" else "")
        return f"{text} (default: %(default)s{unit})"


def add_old_name(parser, old: str, new: str, **kwargs) -> None:
    """``old``, an option's former spelling, still works for one release: it sets ``new``'s value,
    says on stderr that it is deprecated, and is left out of the help."""
    parser.add_argument(old, dest=new.lstrip("-").replace("-", "_"), action=_OldName, new=new,
                        help=argparse.SUPPRESS, **kwargs)


class _OldName(argparse.Action):
    def __init__(self, *args, new: str, **kwargs):
        self.new = new
        super().__init__(*args, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"warning: {option_string} is deprecated, use {self.new} (the old name goes in the next "
              "release)", file=sys.stderr)
        setattr(namespace, self.dest, values)


class Parser(argparse.ArgumentParser):
    """Every program's argument parser: a usage error is ``BadInput`` (one line, exit 2), and its
    help gives each option's default (``DefaultsShown``)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsShown)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise BadInput(message)


class HarnessFailure(Failure):
    """The harness itself or a repro failed: a bisect must stop (exit 128)."""

    code = FAIL
    what = "error: harness failure"


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so every ``finally`` runs as on Ctrl-C."""


def _terminate(signum, frame):
    raise Interrupted(f"signal {signal.Signals(signum).name}")


@contextlib.contextmanager
def signals_held():
    """Ctrl-C and SIGTERM that come during the block act when it is done: for writes that belong
    together. (Python runs signal handlers in the main thread only: elsewhere nothing is held.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came = []
    with contextlib.ExitStack() as stack:  # each step undone, even when another one raises
        stack.callback(lambda: came and signal.raise_signal(came[0]))  # last: the handlers are back
        for sig in (signal.SIGINT, signal.SIGTERM):
            before = signal.signal(sig, lambda signum, frame: came.append(signum))
            stack.callback(signal.signal, sig, signal.SIG_DFL if before is None else before)
        yield


def run_main(main, argv=None, interrupted: str = "interrupted") -> int:
    """Run a program's ``main(argv)``: errors of the family above as one line and their code,
    Ctrl-C and SIGTERM as exit 130 after cleanup (both unwind through the program's ``finally``
    blocks, so the harness kills the run it supervises)."""
    signal.signal(signal.SIGTERM, _terminate)
    # started in the background by a shell (``cmd &``) a program inherits SIGINT ignored: Ctrl-C
    # and ``kill -INT`` must still stop it and clean up
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return main(argv)
    except Failure as err:
        print(f"{err.what}: {err}", file=sys.stderr)
        return err.code
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        return INTERRUPTED


def add_sandbox(parser, what: str) -> None:
    """``--sandbox[=network]``: untrusted code (a triaged issue's script) in the sandbox."""
    parser.add_argument("--sandbox", nargs="?", const=True, default=False, type=_sandbox, metavar="network",
                        help=f"{what} in the sandbox (bubblewrap: nobody, loopback only, the system "
                             "read-only, a throwaway HOME, TMPDIR and folder on a size-limited tmpfs): for "
                             "untrusted code; --sandbox=network with the machine's network")


def _sandbox(value: str):
    import argparse

    if value != "network":
        raise argparse.ArgumentTypeError(f"takes no value, or network (not {value!r})")
    return value


BISECT_USAGE = 129  # bad options of a program ``git bisect run`` calls: never a verdict


def bisect_entry(program, argv=None) -> int:
    """``program(argv)`` for ``git bisect run``: every outcome that is not a verdict maps to >= 128
    (bad options 129, a crash of the harness 128, interrupted 130), so a problem of the harness
    is never read as bad (exit 1) or as "cannot test" (125). Shared by ``tools.run`` and
    ``tools.nodes``."""
    try:
        code = run_main(program, argv)
    except Exception as err:  # noqa: BLE001  (a crash of the harness: never exit 1)
        print(f"error: harness failure: {type(err).__name__}: {err}", file=sys.stderr)
        return FAIL
    return BISECT_USAGE if code == USAGE else code
