"""``nox -s minimize``'s options, and the run's ``Config``; the constants the other modules share."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tools.core import contract
from tools.core.contract import BadInput
from tools.environments import envs, index, matrix
from tools.series import patches

DESCRIPTION = "Shrink a user's training script to the smallest program that still shows the bug's signature."

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CELL = "pl2_6_6_torch2_13_0"
MARK = re.compile(r"#\s*minimize:\s*keep\b")
AUTO_RUNS = 5  # runs of the original that measure the bug's rate with --trials auto
VALUE_SITES = "subscripts+attributes"  # what a recorded run's ids count: a resume must match it
CANDIDATE_TIMEOUT = (3, 30.0)  # a candidate's limit: this many times the original's slowest run, at least


# an interesting candidate slower than this many times the original's slowest run, and by more
# than these seconds, is refused: a reduction that drops ``max_epochs`` would make every later
# launch train for Lightning's default 1000 epochs (and time out), for one line less
SLOWER = (2, 5.0)


class Restart(Exception):
    """Enough improvements since the whole-program passes last ran: they run again (an
    inlined function or a dead parameter may only now be possible) before the reducer goes on."""


class BudgetSpent(Exception):
    """The time budget is used up: the reduction stops, ``best/`` is the result.

    Not pysource-minimize's ``StopMinimization``: that one makes it accept the candidate under
    test, which was never judged."""


# -- options -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    script: Path
    args: tuple[str, ...]
    signature: str | None
    verdict_line: bool
    python: Path
    where: str  # the cell id or the interpreter, for the report
    trials: int | str
    budget: float  # seconds
    out: Path
    timeout: float
    fresh_process: bool
    confirm: int
    check_replicas: str | None = None  # the replica check injected: bad when replicas diverge
    sandbox: bool | str = False  # --sandbox[=network]: every run in the sandbox (untrusted code)
    nodes: tuple[int, int] = (1, 1)  # --nodes, --ranks-per-node: every run as a job of N nodes
    max_runs: int | None = None  # --max-runs: a budget in candidate launches, for a reproducible end
    # --control-cell/--control-python/--control-env: where the bug is fixed; an interesting
    # candidate must also be good there (else its check tests something other than the bug)
    control_python: Path | None = None
    control_where: str = ""
    control_env: tuple[tuple[str, str], ...] = ()
    control_patch: str | None = None  # a Lightning patch of the series, applied to a copy for the control


def parser() -> contract.Parser:
    """The program's options (its ``--help``)."""
    p = contract.Parser(prog="nox -s minimize --", description=DESCRIPTION)
    what = p.add_argument_group("the script, and what counts as bad")
    what.add_argument("script", nargs="?", help="the program to shrink (a .py file); or --script")
    what.add_argument("--script", dest="script_option", metavar="SCRIPT",
                      help="the same, by the name every session gives the user's script")
    contract.add_judges(what, "script")
    contract.add_nodes(what)
    contract.add_sandbox(what, "every run")
    where = p.add_argument_group("where it runs (one of --cell and --python), and the control")
    env = where.add_mutually_exclusive_group()
    env.add_argument("--cell", help=f"run it in this matrix cell's environment (default {DEFAULT_CELL}; "
                                    "a cell's name as nox -s repro -k takes it)")
    env.add_argument("--python", help="run it with this interpreter (its environment as it is)")
    control = where.add_mutually_exclusive_group()
    control.add_argument("--control-cell",
                         help="a matrix cell where the bug is fixed: a candidate is interesting only if "
                              "it is also good there (a check that tests a symptom the reduction can "
                              "fake is caught); the original must be good there")
    control.add_argument("--control-python", help="the same, in this interpreter's environment")
    where.add_argument("--control-env", action="append", default=[], metavar="NAME=VALUE",
                       help="a variable of the control runs (a patched copy first on PYTHONPATH, a switch "
                            "that turns the fix on); alone, the control is the same interpreter with it")
    where.add_argument("--control-patch", metavar="NAME",
                       help="a Lightning patch of the series (patches/): the control is a copy of the "
                            "environment's pytorch_lightning with it applied, first on PYTHONPATH")
    budget = p.add_argument_group("how long, and how sure")
    budget.add_argument("--budget", type=float, default=60.0, metavar="MINUTES", help="minutes of reduction")
    budget.add_argument("--max-runs", type=int,
                        help="also stop after this many launches of candidates in this invocation (a "
                             "budget that ends at the same point on any machine; the next one resumes)")
    budget.add_argument("--timeout", type=contract.seconds, default=300.0, metavar="SECONDS",
                        help="wall-clock limit of a run of the original; a candidate gets "
                             f"{CANDIDATE_TIMEOUT[0]} x the original's slowest run, at least "
                             f"{CANDIDATE_TIMEOUT[1]:g} s")
    budget.add_argument("--trials", default="1",
                        help="runs per candidate, any bad = interesting; 'auto': from the original's rate")
    budget.add_argument("--confirm", type=int, default=3,
                        help="fresh runs of the result that must show the signature")
    budget.add_argument("--fresh-process", action="store_true",
                        help="a new interpreter for every candidate (default: forks of one process "
                             "that imported torch and Lightning; the confirmation runs are always fresh)")
    output = p.add_argument_group("results")
    output.add_argument("--out", help="output folder (default: results/minimize/<script name>)")
    return p


def parse_args(argv: list[str]) -> Config:
    p = parser()
    argv, rest = list(argv), ()
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], tuple(argv[cut + 1:])
    a = p.parse_args(argv)
    if a.script and a.script_option:
        raise BadInput("the script is given twice: as an argument and as --script")
    a.script = a.script or a.script_option
    if not a.script:
        raise BadInput("no script: nox -s minimize -- SCRIPT (or --script SCRIPT) --signature REGEX")
    script = Path(a.script).resolve()
    if script.is_dir() or not script.is_file():
        raise BadInput(f"{a.script}: {'a directory, not a script' if script.is_dir() else 'not found'}")
    if script.suffix != ".py":
        raise BadInput(f"{a.script}: not a .py file (the reducer works on Python source)")
    if not (a.signature or a.verdict_line or a.check_replicas):
        raise BadInput(f"{a.script}: give --signature REGEX (what its output shows when the bug is "
                       "there), --check-replicas for a silent divergence, or --verdict-line if it "
                       "prints the contract's verdict line")
    contract.check_signature(a.signature)
    trials = contract.check_trials(a.trials)
    for name in ("budget", "timeout"):
        if getattr(a, name) <= 0:
            raise BadInput(f"--{name} must be > 0")
    if a.confirm < 1:
        raise BadInput("--confirm must be >= 1")
    if a.max_runs is not None and a.max_runs < 1:
        raise BadInput("--max-runs must be >= 1")
    contract.check_nodes(a)
    control_env = tuple(control_variable(v) for v in a.control_env)
    python, where_ = interpreter(a.python, a.cell)
    control_python, control_where = None, ""
    if a.control_cell or a.control_python:
        control_python, control_where = interpreter(a.control_python, a.control_cell)
    elif control_env or a.control_patch:
        control_python, control_where = python, where_
    if control_env:
        control_where += " with " + " ".join(f"{k}={v}" for k, v in control_env)
    if a.control_patch:
        (patch,) = patches.named(a.control_patch)  # not in the series: one line, exit 2
        if patch.target != "lightning":
            raise BadInput(f"--control-patch {a.control_patch}: a {patch.target} patch; the control "
                           "applies Lightning patches to a copy of pytorch_lightning")
        control_where += f" with {a.control_patch} applied"
    out = Path(a.out).resolve() if a.out else ROOT / "results" / "minimize" / script.stem
    return Config(script, rest, a.signature, a.verdict_line, python, where_, trials, a.budget * 60,
                  out, a.timeout, a.fresh_process, a.confirm, a.check_replicas, a.sandbox,
                  (a.nodes, a.ranks_per_node), a.max_runs, control_python, control_where, control_env,
                  a.control_patch)


def patched_lightning(python: Path, name: str, folder: Path) -> Path:
    """``folder`` holding a copy of ``python``'s pytorch_lightning with the series' patch ``name``
    applied (made again each time: the patch may have changed), to put first on PYTHONPATH."""
    (patch,) = patches.named(name)
    found = subprocess.run([str(python), "-c", "import importlib.metadata as m; "
                            "print(m.distribution('pytorch_lightning').locate_file('pytorch_lightning'))"],
                           capture_output=True, text=True, timeout=120)
    source = Path(found.stdout.strip())
    if found.returncode or not source.is_dir():
        raise BadInput(f"--control-patch {name}: no pytorch_lightning in the environment of {python}")
    copy = folder / "pytorch_lightning"
    shutil.rmtree(copy, ignore_errors=True)
    # with its bytecode (copies keep their times, so it stays valid; apply drops the patched
    # files'): the control runs do not import Lightning from source
    shutil.copytree(source, copy)
    patches.apply(patch, copy, 4, patches.installable_for(patch, copy))  # PatchError: exit 2
    return folder


def control_variable(text: str) -> tuple[str, str]:
    name, eq, value = text.partition("=")
    if not eq or not name.isidentifier():
        raise BadInput(f"--control-env {text!r}: give NAME=VALUE")
    return name, value


def interpreter(python: str | None, cell_id: str | None) -> tuple[Path, str]:
    if python:
        path = Path(python)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BadInput(f"--python {python}: not an executable file")
        return path.absolute(), str(python)
    cell_id = cell_id or DEFAULT_CELL
    cells = {c.id: c for c in matrix.load().cells}
    cell = cells.get(cell_id)
    if cell is None:
        raise BadInput(f"unknown cell {cell_id!r} (cells: {', '.join(sorted(cells))})")
    try:
        args = envs.install_args(cell.package, cell.lightning, cell.torch)
        return envs.ensure(f"{cell.package}-{cell.lightning}-torch{cell.torch}", args, log=print), cell_id
    except (index.UnknownRelease, envs.EnvError) as err:
        raise BadInput(f"cell {cell_id}: {err}") from None
