"""The search: pysource-minimize's reduction, with the whole-program passes between its rounds,
the best-so-far kept on disk, and the last clean-up."""

from __future__ import annotations

import ast
import warnings

from tools.core.contract import BadInput
from tools.minimize.options import BudgetSpent, Restart
from tools.minimize.oracle import Oracle
from tools.minimize.passes.calls import (
    bind_constant_args,
    drop_unused_params,
    functions_with_constant_args,
    functions_with_unused_params,
    inlinable,
    inline,
    inline_all,
)
from tools.minimize.passes.classes import flatten_submodule, flattenable, unwrap_module, wrappers
from tools.minimize.passes.data import datamodules, loaders_for_datamodule
from tools.minimize.passes.literals import fold_literals
from tools.minimize.passes.statements import drop_noops, drop_unused
from tools.minimize.passes.values import fold
from tools.minimize.passes.variables import inline_variables, single_use_variables
from tools.minimize.source import constants, missing_kept, shown_size

MAX_PASS_ROUNDS = 4  # rounds of the simplifying passes in a row
RESTART_AFTER = 25  # improvements of the reducer between two runs of the whole-program passes


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
    """``files`` after the whole-program passes (``tools.minimize.passes``), each proposed as one
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
