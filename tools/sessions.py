"""What the noxfile's sessions share: running one of the tools/ programs as nox's child.

nox maps every failing command onto its own exit code 1 and sends SIGTERM 0.3 s after a Ctrl-C;
the tools' exit codes mean something (a bisect: 0 found, 3 never worked, 4 ambiguous, 2 bad input,
128 harness failure, 130 interrupted) and their cleanup takes longer. ``run_tool`` gives the
tool's own code back as nox's exit code, forwards SIGINT and SIGTERM and waits for the tool to
clean up, and makes the tool die with nox (a SIGKILLed nox leaves nothing running).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from tools.launch import harness

GRACE = 30.0  # seconds a tool gets to clean up after a forwarded signal, before SIGKILL


def asks_for_help(args: list[str]) -> bool:
    """``-h`` or ``--help`` among a session's own options (not after a ``--`` meant for a script)."""
    own = args[:args.index("--")] if "--" in args else args
    return any(a in ("-h", "--help") for a in own)


def help_first(session, module: str) -> None:
    """``nox -s X -- --help``: the program's help, printed by nox's own interpreter before the
    session installs anything (the tools' parsers import only the standard library and
    ``packaging``, which nox has); nox then ends with its exit code."""
    if asks_for_help(session.posargs):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        sys.exit(subprocess.call([sys.executable, "-m", module, "--help"], cwd=root))


def no_options(session, name: str, doc: str) -> None:
    """A session that takes no options: ``-- --help`` says what it does (exit 0), anything else
    after ``--`` is bad input."""
    from tools.core import contract

    contract.Parser(prog=f"nox -s {name} --", description=doc).parse_args(session.posargs)


def run_tool(session, module: str, args: list[str]) -> None:
    """Run ``python -m module args`` in the session's environment; exit nox with its code."""
    python = os.path.join(session.bin, "python")
    session.log(f"python -m {module} {' '.join(args)}")
    nox = os.getpid()
    # between fork and exec: SIGTERM (so the tool still cleans up) when nox dies
    proc = subprocess.Popen([python, "-m", module, *args],
                            preexec_fn=lambda: harness.die_with_parent(nox, signal.SIGTERM),
                            env={**os.environ, "PATH": f"{session.bin}{os.pathsep}{os.environ['PATH']}",
                                 "VIRTUAL_ENV": os.path.dirname(session.bin)})

    def forward(signum, frame):
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
    finally:
        try:
            proc.wait(timeout=GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        for s, handler in previous.items():
            signal.signal(s, handler)
    code = 128 - code if code < 0 else code  # killed by a signal N: 128 + N, as a shell says
    if code:
        sys.exit(code)  # nox passes SystemExit through: its exit code is the tool's


def run_main(session, fn) -> None:
    """Run ``fn()`` in nox's own process (a session without an environment) with the tools'
    conventions: bad input one line and exit 2, Ctrl-C/SIGTERM exit 130 after cleanup; exit nox
    with that code."""
    from tools.core import contract

    code = contract.run_main(lambda _argv: fn() or 0, [])
    if code:
        sys.exit(code)


@contextlib.contextmanager
def one_line_errors():
    """In a session that runs in nox's own process (``repro``): the tools' errors (bad input, a
    results folder that cannot be written, a harness failure) as one line and their exit code,
    not a traceback and nox's 1."""
    from tools.core import contract

    try:
        yield
    except contract.Failure as err:
        print(f"{err.what}: {err}", file=sys.stderr)
        sys.exit(err.code)  # nox passes SystemExit through
