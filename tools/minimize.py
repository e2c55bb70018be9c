"""Shrink a user's training script to the smallest program that still shows the bug's signature.

    nox -s minimize -- SCRIPT --signature REGEX [--cell ID | --python PATH] [--trials N|auto]
                       [--budget MINUTES] [--out DIR] [-- SCRIPT ARGS]

The reducer is pysource-minimize: it works on the syntax tree (whole statements, then
expressions, arguments, values), so every candidate parses and compiles and no DDP launch is spent
on a syntax error; its test is a plain function, so the verdict cache, the progress line and the
budget live here. The *interestingness test* is the harness verdict (``contract.judge``): a
candidate is interesting only when it is **bad with the same signature** (the ``--signature``
regex, or the verdict line of a script that prints one) and, when the original's signature was
a Python exception, raised at the same place (exception type, file and function of the innermost
frame). Good, cannot-test, timeouts and any other error are not interesting, so the reduction
cannot drift to another bug ("backward through the graph a second time" is not #20706).

Two checks run before a launch and reject a candidate without running it: a name used but
bound nowhere in its files (a removed import or definition: a NameError), and a statement marked
``# minimize: keep`` that is gone or changed. Markers are required when the script could print
the signature itself (a string literal in it matches the regex, or it prints the verdict line):
without them the smallest "interesting" program is the print statement alone.

Sibling modules of the script's folder that it imports (directly or through each other) are
reduced with it. Each candidate runs in a fresh folder holding the candidate's files and links
to everything else in the script's folder.

Outputs in ``--out`` (default ``results/minimize/<script>``): ``best/`` (the smallest
interesting files so far, written after every improvement: Ctrl-C or the end of the budget leave
a usable result), ``state.json`` (verdicts by content hash: a re-run resumes from ``best/`` and
answers known candidates from it), ``minimized.py`` (formatted), ``minimized.diff``,
``report.md`` (sizes, tests, time, the verdict of the result in fresh runs, the versions).

With a control (``--control-cell``, ``--control-python``, ``--control-env``, ``--control-patch``:
where the bug is fixed) a candidate is interesting only if it is also *good* there: a check that
tests a symptom of the bug, which a reduction can produce without the bug, cannot be faked.

Exit codes: 0 the minimized script shows the signature in every confirmation run (and is good on
the control); 1 it showed it in fewer (or is not good on the control); 2 bad input, or the script
is not bad to begin with (or not good on the control); 128 the harness failed;
130 interrupted (``best/`` stays).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import difflib
import errno
import fcntl
import functools
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tokenize
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from tools import contract, envs, harness, index, matrix, patches, results
from tools.bisect import State, trials_for
from tools.contract import BadInput, HarnessFailure
from tools.launcher import How, Launcher, Run
from tools.minimize_passes import (
    bind_constant_args,
    datamodules,
    drop_noops,
    drop_unused,
    drop_unused_params,
    flatten_submodule,
    flattenable,
    fold,
    fold_literals,
    functions_with_constant_args,
    functions_with_unused_params,
    inlinable,
    inline,
    inline_all,
    inline_variables,
    instrument,
    loaders_for_datamodule,
    read_records,
    single_use_variables,
    unwrap_module,
    wrappers,
)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CELL = "pl2_6_6_torch2_13_0"
MARK = re.compile(r"#\s*minimize:\s*keep\b")
AUTO_RUNS = 5  # runs of the original that measure the bug's rate with --trials auto
VALUE_SITES = "subscripts+attributes"  # what a recorded run's ids count: a resume must match it
MAX_PASS_ROUNDS = 4  # rounds of the simplifying passes in a row
RESTART_AFTER = 25  # improvements of the reducer between two runs of the whole-program passes
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
    p = contract.Parser(prog="nox -s minimize --", description=__doc__.split("\n\n")[0])
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
    budget.add_argument("--timeout", type=contract.seconds, default=300.0,
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
    output.add_argument("--out", help="output folder (default results/minimize/<script name>)")
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


# -- the project: the script and the sibling modules it imports ----------------------------

def project_files(script: Path) -> dict[str, str]:
    """The script and, transitively, the ``.py`` files of its folder that it imports, by name
    relative to that folder (the script first)."""
    folder, found, todo = script.parent, {}, [script.name]
    while todo:
        name = todo.pop(0)
        if name in found:
            continue
        try:
            source = (folder / name).read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise BadInput(f"{name}: cannot read it ({err})") from None
        try:
            tree = ast.parse(source, filename=name)
        except SyntaxError as err:
            raise BadInput(f"{name}: not valid Python ({err.msg}, line {err.lineno})") from None
        found[name] = source
        for node in ast.walk(tree):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                       else [])
            for module in modules:
                candidate = module.split(".")[0] + ".py"
                if (folder / candidate).is_file():
                    todo.append(candidate)
    return found


def size(files: dict[str, str | None]) -> tuple[int, int]:
    """Non-blank lines and tokens (no comments, newlines or indentation) of the files."""
    lines = tokens = 0
    for source in files.values():
        if not source:
            continue
        lines += sum(1 for line in source.splitlines() if line.strip())
        skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                tokenize.ENDMARKER}
        try:
            tokens += sum(1 for t in tokenize.generate_tokens(io.StringIO(source).readline)
                          if t.type not in skip)
        except (tokenize.TokenError, SyntaxError):
            pass
    return lines, tokens


# -- checks made without a launch ----------------------------------------------------------

def kept_statements(source: str) -> list[str]:
    """``ast.dump`` of every statement whose first line carries ``# minimize: keep``, and of every
    module-level function or class such a statement calls by name (and of what those call, in
    turn): a marked check stays whole, not only its marked lines. (A reduction once emptied the
    function a marked line called, and the marked ``raise`` then fired without the bug.)"""
    tree = ast.parse(source)
    marked = {i for i, line in enumerate(source.splitlines(), 1) if MARK.search(line)}
    kept = [node for node in ast.walk(tree) if isinstance(node, ast.stmt) and node.lineno in marked]
    defs = {n.name: n for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    called: set[str] = set()
    todo = list(kept)
    while todo:
        for node in ast.walk(todo.pop()):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in defs and node.func.id not in called:
                called.add(node.func.id)
                todo.append(defs[node.func.id])
    return [ast.dump(node) for node in kept] + [ast.dump(defs[n]) for n in sorted(called)
                                                 if defs[n] not in kept]


def missing_kept(files: dict[str, str | None], kept: dict[str, list[str]]) -> str | None:
    for name, dumps in kept.items():
        source = files.get(name)
        present = ({ast.dump(n) for n in ast.walk(ast.parse(source)) if isinstance(n, ast.stmt)}
                   if source else set())
        for dump in dumps:
            if dump not in present:
                return f"a statement marked '# minimize: keep' in {name} is gone or changed"
    return None


MODULE_NAMES = {"__file__", "__name__", "__doc__", "__spec__", "__loader__", "__package__",
                "__builtins__", "__annotations__", "__dict__", "__path__"}


def unbound_names(source: str) -> set[str]:
    """Names read somewhere in ``source`` but bound nowhere in it (by any import, definition,
    assignment, argument, loop, ``with``, ``except`` or pattern) and not builtins: certain
    NameErrors if that code runs. Empty with a star import (anything may be bound)."""
    tree = ast.parse(source)
    bound, read = set(MODULE_NAMES) | set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return set()
        if isinstance(node, ast.Import | ast.ImportFrom):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            bound.update(node.names)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    return read - bound


def _binds(args: ast.arguments, call: ast.Call, skip_self: bool) -> bool:
    """Could ``call``'s arguments bind to the parameters ``args``? (A star in the call: yes.)"""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return True
    positional = [*args.posonlyargs, *args.args][1 if skip_self else 0:]
    named = {a.arg for a in [*args.args, *args.kwonlyargs]}
    if len(call.args) > len(positional) and not args.vararg:
        return False
    given = {k.arg for k in call.keywords}
    if not args.kwarg and not given <= named:
        return False
    required = positional[:len(positional) - len(args.defaults)]
    if any(p.arg not in given for p in required[len(call.args):]):
        return False
    return all(d is not None or k.arg in given
               for k, d in zip(args.kwonlyargs, args.kw_defaults, strict=True))


def call_mismatches(source: str) -> set[str]:
    """Module-level functions and classes (with their own ``__init__``), each defined once, that
    are called by name with arguments their parameters cannot take: certain TypeErrors when that
    code runs."""
    tree = ast.parse(source)
    defs: dict[str, list] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            defs.setdefault(node.name, []).append((node.args, False))
        elif isinstance(node, ast.ClassDef):
            init = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
            defs.setdefault(node.name, []).append((init[0].args, True) if init and not node.keywords
                                                  else None)
    rebound = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign)
               for t in ([n.target] if not isinstance(n, ast.Assign) else n.targets)
               if isinstance(t, ast.Name)}
    signatures = {name: d[0] for name, d in defs.items() if len(d) == 1 and d[0] and name not in rebound}
    return {node.func.id for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in signatures and not _binds(signatures[node.func.id][0], node,
                                                              signatures[node.func.id][1])}


# values a removal may leave behind (a default, an empty call), by type: 1.0 == 1 == True in Python
SIMPLEST = {(type(None), None), (int, 0), (bool, True), (bool, False), (str, "")}


def constants(source: str) -> set:
    """The (type, value) of every literal, but the text pieces of f-strings (taking an expression
    out of one joins its neighbours: not a changed value)."""
    tree = ast.parse(source)
    pieces = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    return {(type(n.value), n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and id(n) not in pieces}


def static_rejection(files: dict[str, str | None], script: str, kept: dict[str, list[str]],
                     original: dict[str, tuple[set, set]]) -> str | None:
    """Why a candidate cannot be interesting, or is not worth a launch, without running it; or
    None. ``original``: per file, the names it already reads without binding them and the calls
    that already cannot bind (neither held against it), and its constants."""
    if not files.get(script):
        return "the script itself is gone"
    for name, source in files.items():
        if source is None:
            continue
        unbound, values, mismatched = original[name]
        names = unbound_names(source) - unbound
        if names:
            return f"{name} reads names bound nowhere: {', '.join(sorted(names)[:3])}"
        calls = call_mismatches(source) - mismatched
        if calls:
            return f"{name}: a call with arguments its function cannot take ({sorted(calls)[0]}())"
        if "unique_name_" in source:
            return "a renamed variable (names are kept as the user wrote them)"
        new = constants(source) - values - SIMPLEST
        if new:
            return f"a changed value ({sorted(map(repr, (v[1] for v in new)))[0][:40]}): values are kept"
    return missing_kept(files, kept)


BLOCKS = ("body", "orelse", "finalbody")


def headers(source: str) -> set[str]:
    """``ast.dump`` of every statement with its nested statement lists emptied (its "header")."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt):
            fields = {f: [] for f in BLOCKS if isinstance(getattr(node, f, None), list)}
            # except and case clauses: their own header only (their bodies hold statements)
            if isinstance(node, ast.Try | ast.TryStar):
                fields["handlers"] = [ast.ExceptHandler(h.type, h.name, []) for h in node.handlers]
            if isinstance(node, ast.Match):
                fields["cases"] = [ast.match_case(c.pattern, c.guard, []) for c in node.cases]
            found.add(ast.dump(type(node)(**{**dict(ast.iter_fields(node)), **fields})))
    return found


def only_removes_statements(files: dict[str, str | None], current: dict[str, str | None]) -> bool:
    """Is every statement of the candidate, header for header, one of the current best's (plus
    the ``pass`` a reducer leaves in an emptied block)? Then it removed or moved whole statements,
    and changed nothing inside one."""
    allowed = {ast.dump(ast.Pass())}
    for name, source in files.items():
        if source is None or source == current.get(name):
            continue
        if not headers(source) <= headers(current.get(name) or "") | allowed:
            return False
    return True


def _literal_texts(node: ast.AST, consts: dict[str, str]) -> list[str]:
    """What ``node`` prints if it is text built from literals: a str or bytes constant, an
    f-string, a ``+`` of literals, ``"..." % x`` or ``"...".format(x)``, where a name bound to a
    string constant (``consts``) counts as that string and any other part as empty."""
    def text(n) -> str | None:
        if isinstance(n, ast.Constant) and isinstance(n.value, str | bytes):
            return n.value.decode(errors="replace") if isinstance(n.value, bytes) else n.value
        if isinstance(n, ast.Name):
            return consts.get(n.id)
        if isinstance(n, ast.FormattedValue):
            return text(n.value)
        return None

    def parts(n) -> list[str | None] | None:  # None: not built from literals at all
        if isinstance(n, ast.Constant) and isinstance(n.value, str | bytes):
            return [text(n)]
        if isinstance(n, ast.JoinedStr):
            return [text(v) for v in n.values]
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
            left, right = parts(n.left), parts(n.right)
            if left is None and right is None:
                return None
            return [*(left or [text(n.left)]), *(right or [text(n.right)])]
        return None

    template = None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) \
            and isinstance(node.left.value, str):  # "... %s" % value
        template = node.left.value
        args = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
        fields = r"%[-#0 +]*\d*(?:\.\d+)?[a-zA-Z]"
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format" \
            and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str):
        template, args, fields = node.func.value.value, node.args, r"\{[^{}]*\}"
    if template is not None:
        values = iter([text(a) or "" for a in args])
        return [re.sub(fields, lambda _: next(values, ""), template)]
    found = parts(node)
    return ["".join(p or "" for p in found)] if found else []


def prints_signature_itself(files: dict[str, str], signature: str | None) -> str | None:
    """Where the project could print the signature itself: a literal that matches it, whatever
    its kind (str, bytes, an f-string, a concatenation; docstrings aside)."""
    if not signature:
        return None
    for name, source in files.items():
        tree = ast.parse(source)
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                      and n.body and isinstance(n.body[0], ast.Expr)}
        consts = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                  and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                  for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if id(node) in docstrings:
                continue
            if any(re.search(signature, text) for text in _literal_texts(node, consts)):
                return f"{name}, line {node.lineno}"
    return None


def outside_source_lines(text: str) -> str:
    """``text`` without the source lines tracebacks quote (the indented line after each
    ``File "...", line N, in f``): a program that fails on a line holding the signature's text
    has not printed the signature."""
    out, quoting = [], False
    for line in text.splitlines():
        if quoting and RANK.sub("", line).startswith((" ", "\t")) and not FRAME.match(line):
            quoting = False
            continue
        quoting = bool(FRAME.match(line))
        out.append(line)
    return "\n".join(out)


# -- where the signature was raised --------------------------------------------------------

FRAME = re.compile(r'^\s*(?:\[rank\d+\]:\s*)?File "(?P<path>[^"]+)", line \d+, in (?P<func>\S+)')
EXCEPTION = re.compile(r"^(?:\[rank\d+\]:\s*)?(?P<type>[A-Za-z_][\w.]*)(?::\s|:$|$)")
RANK = re.compile(r"^\[rank\d+\]:")


def crash_site(text: str, signature: str | None, roots: tuple[str, ...]) -> tuple[str, ...] | None:
    """(exception type, file, function of the innermost frame) of the first traceback whose
    exception line matches ``signature``; None when the signature is not an exception's.
    Files inside ``roots`` (the project, a candidate's folder) are named relative to it; others
    from ``site-packages/`` on."""
    if not signature:
        return None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        exc = EXCEPTION.match(line)
        if not (exc and re.search(signature, line)):
            continue
        for back in range(i - 1, -1, -1):  # up through this traceback's own (indented) lines only
            frame = FRAME.match(lines[back])
            if frame:
                return exc["type"], _where(frame["path"], roots), frame["func"]
            if not RANK.sub("", lines[back]).startswith((" ", "\t")):
                break  # not an exception's line after all: a later one may be
    return None


def _where(path: str, roots: tuple[str, ...]) -> str:
    for root in roots:
        if path.startswith(root.rstrip("/") + "/"):
            return os.path.relpath(path, root)
    cut = path.rfind("site-packages/")
    return path[cut + len("site-packages/"):] if cut >= 0 else path


# -- the interestingness test --------------------------------------------------------------

@dataclass
class Stats:
    tests: int = 0  # launches
    cache_hits: int = 0
    static: int = 0  # rejected without a launch
    outcomes: dict = field(default_factory=dict)  # why candidates were not interesting, counted
    improvements: int = 0


class Oracle:
    """Judges candidates (file name -> source, None for a removed file), caching verdicts by
    content hash in ``state``, and keeps the smallest interesting candidate in ``out/best``."""

    def __init__(self, cfg: Config, original: dict[str, str], state: State, log=print):
        self.cfg, self.original, self.state, self.log = cfg, original, state, log
        self.kept = {n: d for n, s in original.items() if (d := kept_statements(s))}
        self.known = {n: (unbound_names(s), constants(s), call_mismatches(s)) for n, s in original.items()}
        self.site: tuple[str, ...] | None = None
        self.trials = cfg.trials if isinstance(cfg.trials, int) else 1
        self.stats = Stats()
        self.best = dict(original)
        self.best_size = size(original)
        self.started = time.monotonic()
        self.deadline: float | None = None
        self.run_limit: int | None = None  # stats.tests at which --max-runs is spent
        self.coarse = False  # the coarse pass: whole statements only
        self.shrinks = 0  # improvements that made the best smaller
        self.round_start = 0  # shrinks when the reducer's current round began
        self.timeout = cfg.timeout  # for the original; then from its duration (check_original)
        self.slowest = self.slow = None  # the original's slowest run; the limit of an interesting one
        # the candidates' runs: forks of one preloaded runner, a fresh interpreter with --fresh-process
        self.launcher = Launcher(How(fresh=cfg.fresh_process, runner_stderr=cfg.out / "preloaded.stderr",
                                     nodes=cfg.nodes[0], ranks_per_node=cfg.nodes[1]))
        self.control = None if cfg.control_python is None else Launcher(
            How(fresh=cfg.fresh_process, runner_stderr=cfg.out / "control.stderr", nodes=cfg.nodes[0],
                ranks_per_node=cfg.nodes[1]))
        (cfg.out / "runs").mkdir(parents=True, exist_ok=True)

    def key(self, files: dict[str, str | None]) -> str:
        payload = json.dumps([sorted(files.items()), self.cfg.signature, self.cfg.verdict_line,
                              str(self.cfg.python), list(self.cfg.args), self.trials, self.site,
                              self.cfg.fresh_process, self.timeout, self.cfg.check_replicas,
                              *([list(self.cfg.nodes)] if self.cfg.nodes[0] > 1 else []),
                              *([str(self.cfg.control_python), list(self.cfg.control_env)]
                                if self.control else [])])
        return hashlib.sha256(payload.encode()).hexdigest()

    # one launch
    def launch(self, files: dict[str, str | None], stem: str, fresh: bool,
               control: bool = False) -> tuple[harness.RunResult, str]:
        """Run the candidate once in a new folder (on the control with ``control``); its result
        and its output."""
        work = self.cfg.out / "work" / stem
        argv = [str(work / self.cfg.script.name), *self.cfg.args]
        log_stem = self.cfg.out / "runs" / stem
        signature = None if self.cfg.verdict_line else self.cfg.signature
        launcher, python = (self.control, self.cfg.control_python) if control else (self.launcher,
                                                                                     self.cfg.python)
        # the candidates' limit comes from the original's runs as forks: a fresh run also starts
        # its interpreters (seconds per rank on a busy machine), so it gets the original's limit
        timeout = self.cfg.timeout if fresh and not self.cfg.fresh_process else self.timeout
        try:  # the folder goes whenever an interrupt comes, while it is made included
            shutil.rmtree(work, ignore_errors=True)
            self.populate(work, files)
            # a fresh run is never a fork (the confirmations, a candidate's own import)
            r = launcher.run(Run(tuple(argv), python, cwd=work, timeout=timeout,
                                 env=dict(self.cfg.control_env) if control else {},
                                 signature=signature, log_stem=log_stem, own=not fresh,
                                 check_replicas=self.cfg.check_replicas, sandbox=self.cfg.sandbox))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        output = "".join(Path(p).read_text(errors="replace")
                         for p in (r.stdout_path, r.stderr_path) if p and Path(p).exists())
        if r.code >= contract.FAIL and r.returncode is None:  # the runner itself failed, not the candidate
            raise HarnessFailure(f"run {stem}: {r.reason or f'exit {r.code}'}")
        return r, output

    def populate(self, work: Path, files: dict[str, str | None]) -> None:
        """``work`` made: links to what sits beside the script, and the candidate's files."""
        work.mkdir(parents=True)
        for entry in self.cfg.script.parent.iterdir():
            if entry.name in self.original or entry.name == "__pycache__" \
                    or self.cfg.out.is_relative_to(entry.absolute()):
                continue
            if entry.is_dir():  # a real folder of links: what a candidate writes stays in its own
                shutil.copytree(entry, work / entry.name, symlinks=True, copy_function=os.symlink,
                                ignore=shutil.ignore_patterns("__pycache__"))
            else:
                (work / entry.name).symlink_to(entry.absolute())
        for name, source in files.items():
            if source is not None:
                (work / name).write_text(source)

    def judge(self, r: harness.RunResult, output: str, work_root: str) -> tuple[bool, str, bool]:
        """Interesting? why (the verdict's reason), and is that final (else not cached: a
        timeout or a kill may go the other way next time)."""
        if r.code != contract.BAD:
            # an exit of its own (another error included) comes again; a timeout or kill may not
            own_exit = r.returncode is not None and r.returncode >= 0
            return False, f"{r.verdict}: {r.reason or 'clean'}", own_exit
        if self.site is not None:
            here = crash_site(output, self.cfg.signature, (work_root, str(self.cfg.script.parent)))
            if here != self.site:
                return False, f"the signature raised elsewhere: {here or 'not as an exception'}", True
        elif self.cfg.signature and not re.search(self.cfg.signature, outside_source_lines(output)):
            return False, "the signature only in a traceback's quoted source line", True
        return True, r.reason or "bad", True

    def run_trials(self, files: dict[str, str | None], trials: int, fresh: bool = False,
                   stop_at_bad: bool = True) -> list[tuple[bool, str, bool]]:
        answers = []
        for _ in range(trials):
            stem = f"{self.key(files)[:12]}-{self.stats.tests}"
            r, output = self.launch(files, stem, fresh)
            self.stats.tests += 1
            answers.append(self.judge(r, output, str(self.cfg.out / "work" / stem)))
            if answers[-1][0] and stop_at_bad:
                break
        return answers

    def on_control(self, files: dict[str, str | None], fresh: bool = False) -> tuple[bool, str, bool]:
        """One run on the control: good there? why not, and is that final (as ``judge`` says)."""
        stem = f"control-{self.key(files)[:12]}-{self.stats.tests}"
        r, _ = self.launch(files, stem, fresh or self.cfg.fresh_process, control=True)
        self.stats.tests += 1
        own_exit = r.returncode is not None and r.returncode >= 0
        return r.code == contract.GOOD, f"{r.verdict}: {r.reason or 'clean'}", own_exit

    def record_values(self, files: dict[str, str | None]) -> dict[str, dict[int, str]]:
        """One launch of ``files`` with their config reads recorded (``minimize_passes``): per
        file, the reads that gave one plain value every time (by site id). Kept in
        ``values.json`` by the files' key: a resumed reduction does not launch it again."""
        key = f"{self.key(files)}|{VALUE_SITES}"
        path = self.cfg.out / "values.json"
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):
            known = {}
        if not isinstance(known, dict):
            known = {}
        if key in known:
            return {n: {int(i): t for i, t in r.items()} for n, r in known[key].items()}
        sinks = {n: self.cfg.out / "work" / f"values-{n}.jsonl" for n, s in files.items() if s}
        for sink in sinks.values():
            sink.parent.mkdir(parents=True, exist_ok=True)
            sink.unlink(missing_ok=True)
        self.check_budget()
        instrumented = {n: instrument(s, sinks[n]) if s else None for n, s in files.items()}
        try:
            r, _ = self.launch(instrumented, f"values-{key[:12]}", fresh=self.cfg.fresh_process)
            self.stats.tests += 1
            records = {n: read_records(sink) for n, sink in sinks.items()}
        finally:
            for sink in sinks.values():
                sink.unlink(missing_ok=True)
        if r.returncode is not None and r.returncode >= 0:  # ran to its own end: it comes again
            results.write_json(path, {**known, key: {n: {str(i): t for i, t in rec.items()}
                                                     for n, rec in records.items()}})
        return records

    def check_budget(self) -> None:
        """Before a launch: the time budget or --max-runs used up ends the reduction."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise BudgetSpent()
        if self.run_limit is not None and self.stats.tests >= self.run_limit:
            raise BudgetSpent()

    # the original
    def check_original(self) -> None:
        """Bad to begin with (else BadInput), the crash site, and the trials with 'auto'."""
        runs = AUTO_RUNS if self.cfg.trials == "auto" else self.trials
        self.log(f"[minimize] running the original {runs} time(s) on {self.cfg.where}")
        key = f"{self.key(self.original)}|original"
        cached = self.state.get(key)
        if cached:
            codes, site, slowest = cached["codes"], cached.get("site"), cached["seconds"]
        else:
            codes, site, slowest = [], None, 0.0
            for i in range(runs):
                stem = f"original-{i}"
                r, output = self.launch(self.original, stem, self.cfg.fresh_process)
                self.stats.tests += 1
                codes.append(r.code)
                slowest = max(slowest, r.seconds)
                self.log(f"  run {i + 1}/{runs}: {r.verdict}{f' - {r.reason}' if r.reason else ''}")
                if r.code == contract.BAD and site is None:
                    site = crash_site(output, self.cfg.signature,
                                      (str(self.cfg.out / "work" / stem), str(self.cfg.script.parent)))
            if contract.BAD in codes:
                self.state.put(key, {"verdict": "bad", "codes": codes, "seconds": slowest,
                                     "reason": None, "site": site})
        bad = codes.count(contract.BAD)
        if not bad:
            raise BadInput(f"{self.cfg.script.name} is not bad on {self.cfg.where}: the signature "
                           f"was not seen in {runs} run(s) (logs: {self.cfg.out / 'runs'})")
        self.site = tuple(site) if site else None
        if self.control:
            key = f"{self.key(self.original)}|control"
            if not self.state.get(key):
                good, why, _ = self.on_control(self.original)
                if not good:
                    raise BadInput(f"{self.cfg.script.name} is not good on the control "
                                   f"({self.cfg.control_where}): {why}; the control must be where "
                                   f"the bug is fixed (logs: {self.cfg.out / 'runs'})")
                self.state.put(key, {"verdict": "good", "codes": [contract.GOOD], "seconds": 0.0,
                                     "reason": "the original on the control"})
            self.log(f"[minimize] good on the control ({self.cfg.control_where}): a candidate must be "
                     "bad here and good there")
        # the original is the first best: known interesting (also for a run that ends at once)
        if not self.state.get(self.key(self.original)):
            self.state.put(self.key(self.original), {"verdict": "bad", "codes": [1], "seconds": slowest,
                                                     "reason": "the original"})
        if not (self.cfg.out / "best.json").exists():
            save_best(self.cfg.out, self.original)
        self.timeout = min(self.cfg.timeout, max(CANDIDATE_TIMEOUT[1], CANDIDATE_TIMEOUT[0] * slowest))
        self.slowest, self.slow = slowest, max(SLOWER[0] * slowest, slowest + SLOWER[1])
        self.rate = bad / runs
        if self.cfg.trials == "auto":
            self.trials = trials_for(self.rate)
        self.log(f"[minimize] bad in {bad}/{runs} runs; {self.trials} run(s) per candidate, each "
                 f"limited to {self.timeout:.0f} s"
                 + (f"; signature raised at {' '.join(self.site)}" if self.site else ""))

    # the reducer's test
    def __call__(self, files: dict[str, str | None]) -> bool:
        self.check_budget()
        files = {n: files.get(n) for n in self.original}  # a removed file is None
        why = static_rejection(files, self.cfg.script.name, self.kept, self.known)
        if not why and self.coarse and not only_removes_statements(files, self.best):
            why = "changes inside a statement: left to the fine pass"
        if why:
            self.stats.static += 1
            if self.stats.static % 1000 == 0:  # alive: thousands may be checked between launches
                self.progress(files, False, f"{self.stats.static} candidates checked without a launch")
            return self._count(False, f"not run ({re.sub(r' [(].*', '', why.split(':')[0])})")
        key = self.key(files)
        cached = self.state.get(key)
        if cached:
            self.stats.cache_hits += 1
            interesting = cached["verdict"] == "bad"
            if interesting:
                self.improve(files)
            return interesting
        start = time.monotonic()
        answers = self.run_trials(files, self.trials, fresh=self.cfg.fresh_process)
        interesting = any(ok for ok, *_ in answers)
        reason = next((why for ok, why, _ in answers if ok == interesting), "")
        each = (time.monotonic() - start) / max(1, len(answers))
        slower = interesting and self.slow is not None and each > self.slow
        if slower:  # not cached: a busy machine may have made it so
            interesting, reason = False, (f"slower: bad, but in {each:.0f} s, where the original took "
                                          f"{self.slowest:.0f} s")
        if interesting and self.control:
            good, why, final = self.on_control(files)
            if not good:
                interesting, reason = False, f"not good on the control: {why}"
                answers.append((False, reason, final))
        if (interesting or all(final for *_, final in answers)) and not slower:
            self.state.put(key, {"verdict": "bad" if interesting else "skip",
                                 "codes": [1 if ok else 0 for ok, *_ in answers],
                                 "seconds": round(time.monotonic() - start, 1), "reason": reason})
        if interesting:
            self.improve(files)
        return self._count(interesting, reason, files)

    def recheck(self, files: dict[str, str | None]) -> bool:
        """Run a candidate that should be interesting (the original without its comments) again,
        cache aside, as often as needed to see a bug of the measured rate with probability
        0.999; cache it as interesting when it is."""
        runs = trials_for(self.rate, miss=0.001)
        answers = self.run_trials(files, runs)
        if any(ok for ok, *_ in answers):
            self.state.put(self.key(files), {"verdict": "bad", "codes": [1], "seconds": 0.0,
                                             "reason": "seen again"})
            self.improve(files)
            return True
        return False

    def _count(self, interesting: bool, reason: str, files=None) -> bool:
        if not interesting:
            error = re.search(r"\b([A-Z]\w*(?:Error|Exception))\b", reason)
            kind = reason.split(":")[0] + (f" ({error[1]})" if error else "")
            self.stats.outcomes[kind] = self.stats.outcomes.get(kind, 0) + 1
        if files is not None:
            self.progress(files, interesting, reason)
        return interesting

    def improve(self, files: dict[str, str | None]) -> None:
        """The reducer goes on from each interesting candidate: that is the best so far."""
        shown = shown_size(files)  # counted as the report counts them: formatted
        if shown[1] < self.best_size[1]:
            self.shrinks += 1  # not a known candidate accepted again
        self.best, self.best_size = dict(files), shown
        self.stats.improvements += 1
        save_best(self.cfg.out, files)

    @functools.cached_property
    def original_size(self) -> tuple[int, int]:
        return shown_size(self.original)  # formatted, as the best is counted

    def progress(self, files, interesting: bool, reason: str) -> None:
        elapsed = time.monotonic() - self.started
        left = ("" if self.deadline is None else
                f", budget left {clock(max(0.0, self.deadline - time.monotonic()))}")
        lines, tokens = self.best_size
        o_lines, o_tokens = self.original_size
        self.log(f"[minimize] test {self.stats.tests} ({self.stats.cache_hits} cached, "
                 f"{self.stats.static} not run) {clock(elapsed)}{left} | best {lines} lines, "
                 f"{tokens} tokens (of {o_lines}, {o_tokens}) | candidate {shown_size(files)[0]} lines: "
                 f"{'interesting' if interesting else 'not interesting'}"
                 f"{'' if interesting else f' ({reason[:120]})'}")

    def close(self) -> None:
        self.launcher.close()
        if self.control:
            self.control.close()


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def save_best(out: Path, files: dict[str, str | None]) -> None:
    """The best candidate: ``best.json`` (written atomically in one piece: what a resume reads),
    and its files in ``best/`` to look at. Ctrl-C and SIGTERM wait until both are written: the
    interrupt's message says the best so far is in ``best/``."""
    with contract.signals_held():
        results.write_json(out / "best.json", files)
        write_files(out / "best", files)


def load_best(out: Path, original: dict[str, str]) -> dict[str, str | None]:
    """The best candidate of an earlier run, or the original when there is none."""
    try:
        saved = json.loads((out / "best.json").read_text())
    except (OSError, ValueError):
        return dict(original)
    if not isinstance(saved, dict) or set(saved) != set(original):
        return dict(original)
    return saved


def write_files(folder: Path, files: dict[str, str | None]) -> None:
    """The candidate's files in ``folder``, each written atomically; removed files deleted."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        if source is None:
            (folder / name).unlink(missing_ok=True)
        else:
            results.write_atomic(folder / name, source)


# -- the reduction -------------------------------------------------------------------------

def reduce(oracle: Oracle, start: dict[str, str]) -> str:
    """Shrink ``start`` with pysource-minimize's structure pass until nothing more goes or the
    budget is spent; how it ended.

    Twice: a coarse pass in which only candidates that remove (or move) whole statements are
    launched, everywhere in the program, then the fine pass (expressions, call arguments,
    dictionary entries, the rest) from its result; each repeated until a round changes nothing.
    pysource-minimize's public ``minimize()`` also runs its value and renaming passes (halve
    every number, cut every string, rename every name): thousands of candidates a real program,
    each a deep copy of the tree, all refused here anyway (values and names stay as the user
    wrote them), so its structure pass is driven directly (a private class: the version is
    pinned in pyproject.toml)."""
    from pysource_minimize._minimize_structure import MinimizeStructure

    files: dict[str, str | None] = dict(start)
    for name in oracle.original:
        files.setdefault(name, None)

    def check_file(name: str):
        def check(tree) -> bool:
            if oracle.shrinks - oracle.round_start >= RESTART_AFTER:
                raise Restart()  # the tree under test is unjudged; the best so far is the last accepted
            try:
                source = ast.unparse(tree)
                with warnings.catch_warnings():  # "'int' object is not callable" and the like
                    warnings.simplefilter("ignore", SyntaxWarning)
                    compile(source, name, "exec")
            except (SyntaxError, ValueError, RecursionError, AttributeError, TypeError):
                return False  # a tree the reducer made that is no program (a None where a node must be)
            return oracle({**files, name: source})
        return check

    try:
        for oracle.coarse in (True, False):
            oracle.log(f"[minimize] {'coarse pass: whole statements' if oracle.coarse else 'fine pass'}")
            changed = True
            while changed:
                before_round = dict(files)
                files.update(whole_program(oracle, files))
                changed = files != before_round
                for name in [n for n, src in files.items() if src is not None]:
                    if name != oracle.cfg.script.name and oracle({**files, name: None}):
                        files[name], changed = None, True  # the module is not needed at all
                        continue
                    tree = ast.parse(files[name])
                    oracle.round_start = oracle.shrinks
                    if not (check_file(name)(tree) or oracle.recheck({**files, name: ast.unparse(tree)})):
                        raise BadInput(f"{name} is not bad once its comments and formatting are dropped "
                                       "(the reducer's first step): it depends on them, or the bug "
                                       "is rarer than measured (try --trials auto)")
                    before = ast.unparse(tree)
                    try:
                        files[name] = ast.unparse(MinimizeStructure(tree, check_file(name),
                                                                    lambda current, total: None)
                                                  .get_current_tree({}))
                    except Restart:  # the whole-program passes again, from the best so far
                        oracle.log(f"[minimize] {RESTART_AFTER} shrinks since the whole-program passes "
                                   "ran: running them again")
                        files = {n: oracle.best.get(n) for n in oracle.original}
                        changed = True
                        break
                    changed = changed or files[name] != before
    except BudgetSpent:
        return "the budget was spent"
    return "the reducer found nothing more to remove"


def last_clean_up(oracle: Oracle, files: dict[str, str | None]) -> dict[str, str | None]:
    """The cheap passes once more before any result is written, whatever the budget left:
    literals folded (``"train" == "train"``), dead definitions, unused imports and dead locals
    dropped, no-op statements gone, to a fixpoint; one launch (the budget no longer applies),
    and each pass alone only when all together is not interesting."""
    oracle.deadline, oracle.run_limit, oracle.coarse = None, None, False  # any change, judged as a whole
    kept = oracle.kept

    def passes(f, chosen):
        for _ in range(MAX_PASS_ROUNDS):
            before = f
            for one in chosen:
                f = one(f)
            if f == before:
                return f
        return f

    every = [lambda f: fold_literals(f, kept), lambda f: drop_unused(f, kept),
             lambda f: drop_noops(f, kept, docstrings=False), inline_variables]
    for chosen in (every, *([one] for one in every)):
        try:
            candidate = passes(files, chosen)
        except Exception:  # noqa: BLE001 - a pass's own bug must not lose the result
            continue
        if candidate == files or missing_kept(candidate, kept) is not None \
                or shown_size(candidate) >= shown_size(files):
            continue
        if oracle(candidate):
            oracle.log(f"[minimize] last clean-up: {shown_size(files)[0]} -> "
                       f"{shown_size(candidate)[0]} lines")
            files = candidate
            if chosen is every:
                break
    return files


def whole_program(oracle: Oracle, files: dict[str, str | None]) -> dict[str, str | None]:
    """``files`` after the whole-program passes (``minimize_passes``), each proposed as one
    candidate and kept only when the harness finds it interesting: the config reads folded into
    their values (when all at once is not interesting, one module-level statement at a time),
    then rounds of the simplifying passes (``_simplify``) until one changes nothing."""
    oracle.log(f"[minimize] whole-program passes from {shown_size(files)[0]} lines")
    allowed = set().union(*(constants(s) for s in oracle.original.values()))
    coarse, oracle.coarse = oracle.coarse, False  # folding changes statements: judged as a whole
    try:
        records = oracle.record_values(files)
        free = {n: {i for i, node in enumerate(ast.parse(files[n]).body)  # none marked to keep inside
                    if not any(ast.dump(x) in oracle.kept.get(n, ()) for x in ast.walk(node)
                               if isinstance(x, ast.stmt))} for n in records}
        counts = {n: fold(files[n], records[n], allowed, within=free[n])[1] for n in records}
        if sum(counts.values()):
            oracle.log(f"[minimize] value folding: {sum(counts.values())} config reads and attributes "
                       "always gave one value; trying them as literals")
            candidate = {**files, **{n: fold(files[n], records[n], allowed, within=free[n])[0]
                                     for n in records}}
            if oracle(candidate):
                files = candidate
            else:
                for name in counts:
                    chosen: set[int] = set()
                    for i in sorted(free[name]):
                        source, n = fold(files[name], records[name], allowed, within=chosen | {i})
                        if n > fold(files[name], records[name], allowed, within=chosen)[1] \
                                and oracle({**files, name: source}):
                            chosen.add(i)
                    if chosen:
                        files = {**files, name: fold(files[name], records[name], allowed, within=chosen)[0]}
        for _ in range(MAX_PASS_ROUNDS):  # until a round changes nothing: each step may enable another
            before = files
            files = _simplify(oracle, files)
            if files == before:
                break
    finally:
        oracle.coarse = coarse
    return files


def _simplify(oracle: Oracle, files: dict[str, str | None]) -> dict[str, str | None]:
    """One round of the simplifying passes, each one candidate (all its changes at once), and
    when that is not interesting, its changes one by one: no-op statements, dead definitions,
    unused parameters, constant arguments, literals, sub-module classes flattened into their
    owner, data modules replaced by their loaders, wrapper modules by what they wrap, inlined
    functions and methods, inlined variables. A pass that fails on a program it
    did not foresee is skipped (logged); a candidate that does not compile, or is not smaller as
    the report counts (formatted lines, then tokens), is not launched: a long reduction is
    never lost to a pass."""
    def usable(candidate) -> bool:
        try:
            for name, source in candidate.items():
                if source is not None:
                    compile(source, name, "exec")
        except (SyntaxError, ValueError):
            return False
        return missing_kept(candidate, oracle.kept) is None

    def smaller(candidate) -> bool:  # as the report counts: formatted lines, then tokens
        return shown_size(candidate) < shown_size(files)

    def step(label, make_all, make_singles=lambda: []):
        nonlocal files
        try:
            candidate, singles = make_all(), make_singles()
        except Exception as err:  # noqa: BLE001 - a pass's own bug must not end the reduction
            oracle.log(f"[minimize] {label}: skipped, the pass failed on this program "
                       f"({type(err).__name__}: {err})")
            return
        if candidate is None or candidate == files:
            return
        before = shown_size(files)[0]
        if usable(candidate) and smaller(candidate) and oracle(candidate):
            files = candidate
            oracle.log(f"[minimize] {label}: {before} -> {shown_size(files)[0]} lines, all at once")
            return
        taken = 0
        for make in singles:
            try:
                one = make(files)
            except Exception:  # noqa: BLE001 - as above, for this one change
                continue
            if one is not None and one != files and usable(one) and smaller(one) and oracle(one):
                files, taken = one, taken + 1
        oracle.log(f"[minimize] {label}: {before} -> {shown_size(files)[0]} lines"
                   + (f", {taken} of {len(singles)} one by one" if singles else ", not interesting"))

    def fewer_params():
        params = files
        while (fewer := drop_unused(drop_unused_params(params), oracle.kept)) != params:
            params = fewer  # a parameter passed on to another function's unused one goes with it
        return params

    def every(names, change):  # each named change in turn, on what the last one left
        def apply():
            out = files
            for name in names(files):
                out = change(out, name) or out
            return out
        return apply

    flat = every(flattenable, flatten_submodule)
    loaders = every(datamodules, loaders_for_datamodule)
    unwrapped = every(wrappers, unwrap_module)

    step("no-op statements", lambda: drop_noops(files, oracle.kept),
         lambda: [lambda f: drop_noops(f, oracle.kept, docstrings=False)])  # a program may read __doc__
    step("dead definitions", lambda: drop_unused(files, oracle.kept))
    step("unused parameters", fewer_params,
         lambda: [lambda f, q=q: drop_unused(drop_unused_params(f, only=q), oracle.kept)
                  for q in functions_with_unused_params(files)])
    step("constant arguments", lambda: bind_constant_args(files),
         lambda: [lambda f, q=q: bind_constant_args(f, only=q) for q in functions_with_constant_args(files)])
    step("literals", lambda: fold_literals(files, oracle.kept))
    step("flattened sub-modules", flat,
         lambda: [lambda f, n=n: flatten_submodule(f, n) for n in flattenable(files)])
    step("data modules as loaders", loaders,
         lambda: [lambda f, n=n: loaders_for_datamodule(f, n) for n in datamodules(files)])
    step("wrapper modules", unwrapped,
         lambda: [lambda f, n=n: unwrap_module(f, n) for n in wrappers(files)])
    step("inlined functions", lambda: drop_unused(inline_all(files, usable), oracle.kept),
         lambda: [lambda f, q=q: drop_unused(inline(f, q) or f, oracle.kept) for q in inlinable(files)])
    step("inlined variables", lambda: inline_variables(files),
         lambda: [lambda f, v=v: inline_variables(f, only=v) for v in single_use_variables(files)])
    return files


@functools.lru_cache(maxsize=4096)
def formatted(source: str) -> str:
    """``ruff format`` of ``source`` when ruff is installed; ``source`` as it is otherwise."""
    ruff = shutil.which("ruff")
    if not ruff:
        return source
    proc = subprocess.run([ruff, "format", "--quiet", "--line-length", "100", "-"], input=source,
                          capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 and proc.stdout else source


def shown_size(files: dict[str, str | None]) -> tuple[int, int]:
    """``size`` of the files as ``minimized.py`` shows them (formatted): an inlined call that
    makes one line too long for the formatter is three lines there, not one fewer."""
    return size({n: formatted(s) if s else s for n, s in files.items()})


def versions(python: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, platform\n"
            "out = {'python': platform.python_version()}\n"
            "for p in ('torch', 'lightning', 'pytorch-lightning'):\n"
            "    try:\n        out[p] = m.version(p)\n    except m.PackageNotFoundError:\n        pass\n"
            "print(json.dumps(out))")
    try:
        proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
        return json.loads(proc.stdout)
    except (subprocess.TimeoutExpired, ValueError):
        return {"python": "?"}


def report(cfg: Config, oracle: Oracle, original: dict[str, str], final: dict[str, str | None],
           ended: str, confirmed: list[tuple[bool, str, bool]], seconds: float,
           control: tuple[bool, str, bool] | None = None) -> str:
    o_lines, o_tokens = oracle.original_size  # formatted, as the progress line counts it
    lines, tokens = size(final)
    seen = sum(ok for ok, *_ in confirmed)
    vers = versions(cfg.python)
    s = oracle.stats
    rows = "\n".join(f"| {why} | {n} |" for why, n in sorted(s.outcomes.items(), key=lambda kv: -kv[1]))
    removed = [n for n, src in final.items() if src is None]
    on_control = "" if control is None else (
        f"\n- **On the control ({cfg.control_where}), where the bug is fixed, it is "
        f"{'good' if control[0] else f'not good ({control[1]})'} in a fresh run.**")
    return f"""# Minimized: {cfg.script.name}

Signature: {f'`/{cfg.signature}/`' if cfg.signature else
             'replicas diverge (`--check-replicas`)' if cfg.check_replicas else 'the verdict line'}{
    f", raised as `{oracle.site[0]}` in `{oracle.site[1]}` (`{oracle.site[2]}`)" if oracle.site else ''}
Versions: {', '.join(f'{k} {v}' for k, v in vers.items())} ({cfg.where})

| | lines | tokens |
|---|---|---|
| original | {o_lines} | {o_tokens} |
| minimized | {lines} | {tokens} ({100 * lines / max(o_lines, 1):.0f} % of the lines) |

- Files reduced: {', '.join(n for n in original if final.get(n) is not None)}{
    f"; removed as unneeded: {', '.join(removed)}" if removed else ''}
- Bug rate of the original: {oracle.rate:.2f}; runs per candidate: {oracle.trials}
- Reduction: {s.tests} launches, {s.cache_hits} answered from the cache, {s.static} candidates
  rejected without a launch, {s.improvements} improvements, {clock(seconds)}; it ended because
  {ended}.
- **The minimized script shows the signature in {seen} of {len(confirmed)} fresh runs.**{
    ''.join(f"{chr(10)}  - not bad in a fresh run: {why}" for ok, why, _ in confirmed if not ok)}{on_control}

Why candidates were not interesting:

| reason | candidates |
|---|---|
{rows or '| (none) | 0 |'}

Run it: `python {'minimized.py' if len(original) == 1 else f'minimized/{cfg.script.name}'}{
    ' ' + ' '.join(cfg.args) if cfg.args else ''}`
"""


def minimize(cfg: Config, log=print) -> int:
    started = time.monotonic()
    original = project_files(cfg.script)
    where = prints_signature_itself(original, cfg.signature) or (
        cfg.check_replicas and prints_signature_itself(original, contract.REPLICAS_SIGNATURE))
    if (where or cfg.verdict_line) and not any(kept_statements(s) for s in original.values()):
        raise BadInput(f"{cfg.script.name} could print the signature itself "
                       f"({where or 'it prints the verdict line'}): mark the code that decides it "
                       "with '# minimize: keep' (on the first line of each statement to keep), "
                       "or the smallest 'interesting' program is that print alone")
    try:
        cfg.out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BadInput(f"--out {cfg.out}: cannot make that folder ({err.strerror})") from None
    with holding(cfg.out, log):
        if cfg.control_patch:
            folder = patched_lightning(cfg.control_python, cfg.control_patch, cfg.out / "control")
            path = os.pathsep.join([str(folder), *[v for k, v in cfg.control_env if k == "PYTHONPATH"]])
            cfg = dataclasses.replace(cfg, control_env=(*[(k, v) for k, v in cfg.control_env
                                                          if k != "PYTHONPATH"], ("PYTHONPATH", path)))
        try:
            return reduce_into(cfg, original, started, log)
        except OSError as err:  # a full or read-only disk under --out: no traceback, no verdict
            if err.errno not in (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM):
                raise
            raise contract.HarnessFailure(
                f"cannot write in --out {cfg.out} ({err.strerror}): the best so far is in "
                f"{cfg.out / 'best'}; make room and run the same command to resume") from None


@contextlib.contextmanager
def holding(out: Path, log):
    """``out`` for this run alone: an exclusive lock on ``<out>/.running`` until the run ends,
    however it ends (the kernel frees it when the process dies); a second run on it is bad input."""
    try:
        busy = open(out / ".running", "a")  # noqa: SIM115  (closed by the with below)
    except OSError as err:
        raise BadInput(f"--out {out}: cannot write there ({err.strerror})") from None
    with busy:
        try:
            fcntl.flock(busy, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BadInput(f"{out} is being reduced by another run now: wait for it, or give "
                           "another --out") from None
        except OSError:
            log(f"[minimize] {out}: its file system cannot lock it; two runs on it at once would "
                "mix their results")
        yield


def reduce_into(cfg: Config, original: dict[str, str], started: float, log) -> int:
    """The reduction of ``original`` into ``cfg.out`` (held by this run), its outputs written."""
    meta_path = cfg.out / "original.json"
    digest = hashlib.sha256(json.dumps(sorted(original.items())).encode()).hexdigest()
    try:
        earlier = json.loads(meta_path.read_text()) if meta_path.exists() else {"sha256": digest}
    except (OSError, ValueError):
        earlier = {}
    if not isinstance(earlier, dict) or earlier.get("sha256") != digest:
        raise BadInput(f"{cfg.out} holds the reduction of another script (or of an earlier version "
                       "of this one): give another --out, or remove that folder")
    try:
        results.write_json(meta_path, {"script": str(cfg.script), "files": sorted(original),
                                       "sha256": digest})
    except OSError as err:  # nothing was reduced yet: bad input, as an unwritable --out is
        raise BadInput(f"--out {cfg.out}: cannot write there ({err.strerror})") from None
    state = State(cfg.out / "state.json")
    state.check_writable()
    oracle = Oracle(cfg, original, state, log)
    try:
        oracle.check_original()
        start = dict(original)
        best_dir = cfg.out / "best"
        resumed = load_best(cfg.out, original)
        known = state.get(oracle.key(resumed))
        if resumed != original and known and known["verdict"] == "bad":  # an earlier run's best
            start = {n: s for n, s in resumed.items() if s is not None}
            oracle.best, oracle.best_size = dict(resumed), shown_size(resumed)
            log(f"[minimize] resuming from {best_dir} ({oracle.best_size[0]} lines)")
        oracle.deadline = time.monotonic() + cfg.budget
        if cfg.max_runs is not None:
            oracle.run_limit = oracle.stats.tests + cfg.max_runs
        log(f"[minimize] reducing {', '.join(original)}: {shown_size(original)[0]} lines, budget "
            f"{clock(cfg.budget)}")
        ended = reduce(oracle, start)
        final = last_clean_up(oracle, {n: oracle.best.get(n) for n in original})
        log(f"[minimize] {ended}: {shown_size(final)[0]} lines; confirming with {cfg.confirm} fresh runs")
        final = {n: formatted(s) if s is not None else None for n, s in final.items()}
        write_files(cfg.out / "minimized", final)
        main = final[cfg.script.name]
        results.write_atomic(cfg.out / "minimized.py", main)
        diff = "".join(
            "".join(difflib.unified_diff(original[n].splitlines(True), (final[n] or "").splitlines(True),
                                         f"a/{n}", f"b/{n}" if final[n] is not None else "/dev/null"))
            for n in original)
        results.write_atomic(cfg.out / "minimized.diff", diff)
        confirmed = oracle.run_trials(final, cfg.confirm, fresh=True, stop_at_bad=False)
        control = oracle.on_control(final, fresh=True) if oracle.control else None
        text = report(cfg, oracle, original, final, ended, confirmed, time.monotonic() - started, control)
        results.write_atomic(cfg.out / "report.md", text)
    except KeyboardInterrupt:
        if (cfg.out / "best").exists():
            log(f"[minimize] the best so far ({oracle.best_size[0]} lines) is in {cfg.out / 'best'}; "
                "the same command resumes from it")
        raise
    finally:
        oracle.close()  # its runs have ended: nothing writes into the candidates' folders now
        for left in (cfg.out / "work").glob("*"):  # what a launch cut short by a signal left
            if left.is_dir() and not left.is_symlink():
                shutil.rmtree(left, ignore_errors=True)
            else:
                left.unlink(missing_ok=True)
    seen = sum(ok for ok, *_ in confirmed)
    log(text)
    log(f"[minimize] {cfg.out / 'minimized.py'}: the signature in {seen}/{cfg.confirm} fresh runs"
        + (f"; {'good' if control[0] else 'NOT good'} on the control" if control else ""))
    return 0 if seen == cfg.confirm and (control is None or control[0]) else 1


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return contract.run_main(lambda a: minimize(parse_args(a), log), argv)


def log(msg: str) -> None:
    print(msg, flush=True)


if __name__ == "__main__":
    sys.exit(main())
