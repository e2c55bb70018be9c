"""Sessions of the workspace. Logic lives in tools/; this file only lists sessions."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).parent))
from tools import sessions  # noqa: E402
from tools.core import results
from tools.environments import envs, matrix
from tools.launch import sandbox, slurm_cluster
from tools.stages import cells, slurm_matrix

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.download_python = "never"
nox.options.reuse_existing_virtualenvs = True

PYPROJECT = nox.project.load_toml("pyproject.toml")
MATRIX = matrix.load()
# plain `nox` (and the `*` of `nox -l`): the cells that run; `nox -s repro` also lists those
# that skip (outside a release's supported torch range), each with its reason
nox.options.sessions = [f"repro({c.id})" for c in MATRIX.cells if not c.skip_reason()]
PYTHON = "3.11"
TEST_TORCH = "2.13.0"


@nox.session(python=PYTHON)
@nox.parametrize("cell", MATRIX.cells, ids=[c.id for c in MATRIX.cells])
def repro(session: nox.Session, cell: matrix.Cell) -> None:
    """Run every repro of repro/matrix.toml in one Lightning x torch cell."""
    with sessions.one_line_errors():
        _repro(session, cell)


def _repro(session: nox.Session, cell: matrix.Cell) -> None:
    if sessions.asks_for_help(session.posargs):  # before anything is installed, once for all cells
        print(cells.parser().format_help())
        sys.exit(0)
    opts, repro_args = cells.parse_posargs(session.posargs)
    if opts.cell and opts.cell != cell.id:
        session.skip(f"not --cell {opts.cell}")
    out = cells.open_results()
    reason = cell.skip_reason(opts.include_unsupported)
    if reason:
        cells.record_skip(cell, reason, out)
        session.skip(reason)
    session.log(cells.progress(cell, MATRIX, opts.include_unsupported))
    cells.install(session, cell, out)
    if opts.executor == "slurm":  # the cell becomes a task of one job array, submitted after the cells
        slurm_matrix.add_cell(cell, str(Path(session.bin) / "python"), out, opts, repro_args)
        session.notify("repro_slurm", session.posargs)
        return
    cells.run_cell(cell, MATRIX, str(Path(session.bin) / "python"), out, repro_args,
                   opts.timeout, log=session.log, script=opts.script, signature=opts.signature,
                   fresh_process=opts.fresh_process, verdict_line=opts.verdict_line,
                   nodes=opts.nodes, ranks_per_node=opts.ranks_per_node,
                   check_replicas=opts.check_replicas)
    if opts.cell or cells.is_last(cell, MATRIX, opts.include_unsupported):
        print(cells.write_summary(out, MATRIX, opts.script))
    session.log(f"results: {out}")


@nox.session(python=False)
def repro_slurm(session: nox.Session) -> None:
    """The cells that `nox -s repro -- --executor slurm` prepared, as one SLURM job array.

    It runs after those cells on its own: submits the array, waits, and prints the table."""
    if sessions.asks_for_help(session.posargs):
        print(f"usage: nox -s repro_slurm -- [the repro session's options]\n\n"
              f"{inspect.cleandoc(repro_slurm.__doc__)}\nIts options: nox -s repro -- --help")
        sys.exit(0)
    opts, _ = cells.parse_posargs(session.posargs)
    out = results.this_run_dir("repro")
    sessions.run_main(session, lambda: print(slurm_matrix.run_matrix(out, opts.slurm, opts.script,
                                                                     log=session.log)))


@nox.session(python=False)
def slurm_up(session: nox.Session) -> None:
    """Install (if missing) and start a one-node SLURM cluster on this machine (.cache/slurm)."""
    try:
        slurm_cluster.install(log=session.log)
    except slurm_cluster.CannotStart as err:
        session.skip(str(err))  # the SLURM tests then skip too, saying why
    sessions.run_main(session, slurm_cluster.up)


@nox.session(python=False)
def slurm_down(session: nox.Session) -> None:
    """Stop the local SLURM cluster's daemons (idempotent)."""
    sessions.run_main(session, slurm_cluster.down)


@nox.session(python=False)
def sandbox_up(session: nox.Session) -> None:
    """Install bubblewrap, the sandbox of untrusted code (nox -s triage), if missing (root)."""
    try:
        sandbox.up(log=session.log)
    except sandbox.Unavailable as err:
        session.skip(str(err))  # the sandbox tests then skip too, saying why


@nox.session(python=False)
def summary(session: nox.Session) -> None:
    """Print the summary table of the latest `nox -s repro` run."""
    sessions.run_main(session, lambda: sessions.no_options(session, "summary", summary.__doc__))
    latest = results.latest_dir("repro")
    if not latest.exists():
        session.error("no results yet: run `nox -s repro` first")
    print(cells.write_summary(latest, MATRIX))


def install(session: nox.Session, *args: str) -> None:
    """``session.install`` with bytecode compiled at install (see tools/environments/envs.py)."""
    session.install(*args, env=envs.COMPILED)


def _tool(session: nox.Session, module: str) -> None:
    """Run one of the tools/ programs with the session's options; nox exits with its code."""
    sessions.help_first(session, module)
    install(session, *nox.project.dependency_groups(PYPROJECT, "bisect"))
    sessions.run_tool(session, module, session.posargs)


@nox.session(python=PYTHON)
def bisect(session: nox.Session) -> None:
    """Bisect releases, then Lightning commits: `nox -s bisect -- --help`."""
    _tool(session, "tools.bisect_cli")


@nox.session(python=PYTHON)
def fingerprint(session: nox.Session) -> None:
    """Which Lightning and torch releases match a pasted traceback: `-- traceback.txt`."""
    _tool(session, "tools.fingerprint")


@nox.session(python=PYTHON)
def triage(session: nox.Session) -> None:
    """From an issue (URL or saved file) to a triage comment backed by runs: `-- ISSUE`."""
    sessions.help_first(session, "tools.triage")
    install(session, *nox.project.dependency_groups(PYPROJECT, "minimize"))
    sessions.run_tool(session, "tools.triage", session.posargs)


@nox.session(python=PYTHON)
def minimize(session: nox.Session) -> None:
    """Shrink a script to the smallest one still showing the bug: `-- SCRIPT --signature REGEX`."""
    sessions.help_first(session, "tools.minimize")
    install(session, *nox.project.dependency_groups(PYPROJECT, "minimize"))
    sessions.run_tool(session, "tools.minimize", session.posargs)


@nox.session(python=PYTHON)
def patches(session: nox.Session) -> None:
    """Validate the patch series: applies, bug before, fixed after: `-- --patch NAME --cell ID`."""
    _tool(session, "tools.validate_patches")


@nox.session(python=PYTHON)
def pr(session: nox.Session) -> None:
    """A PR bundle for a validated patch: `-- <patch> [--bisect report.md]`."""
    _tool(session, "tools.pr_bundle")


@nox.session(python=False)
def findings(session: nox.Session) -> None:
    """FINDINGS.md from the recorded runs in findings/: `-- --record KIND[=RUN_DIR]` records a run."""
    from tools.records import findings as tool

    code = tool.main(session.posargs)
    if code:
        sys.exit(code)  # nox passes SystemExit through: its exit code is the tool's


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The workspace's own test suite, against the newest Lightning on a current torch."""
    install(session, f"torch=={TEST_TORCH}", *nox.project.dependency_groups(PYPROJECT, "test"))
    # three workers: the multi-process tests on one of them, in turn; the SLURM tests that only
    # wait on another (tests/conftest.py); the 30 slowest tests listed at the end
    session.run("pytest", "-n", "3", "--dist", "loadgroup", "--durations=30", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff over the workspace (the rules of pyproject.toml)."""
    install(session, *nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")
