"""Whole-program passes of ``nox -s minimize`` that one launch can check at once.

pysource-minimize removes one piece of syntax per test, and a DDP launch costs seconds, so two
kinds of change that a deletion reducer pays for piece by piece are proposed here in one
candidate each (the harness still judges each candidate: nothing is accepted unseen):

- **value folding**: a user's program reads most of its numbers and names through a config
  (``cfg["data"]["batch_size"]``, the hydra style) or its objects' attributes
  (``self.backbone.out_features``). The program is run once with every subscript by a constant
  key, and every attribute read as a value, recorded (``instrument``); a read that gave one and the same
  plain value (a number, a string, a bool, None, a short list or tuple of those) every time, in
  every process, is replaced by that value (``fold``). The config entries then become dead, and
  go with the next pass.
- **dead definitions**: module-level functions, classes, imports and assignments whose names
  nothing reads (``drop_unused``), repeated until none is left.
- **unused parameters** with the arguments of every call (``drop_unused_params``).
- **no-op statements**: docstrings, bare constants, ``pass``, conditions on a constant
  (``drop_noops``).
- **inlining**: a function or method with one caller pasted there (``inline``), and a variable
  read once moved into its read (``inline_variables``). Both refuse whenever a name could
  change meaning; what they cannot see (an evaluation order that matters) the harness judges.
- **constants**: a literal every call passes bound into the function (``bind_constant_args``),
  and what a literal makes plain written plainly (``fold_literals``).
- **Lightning's shapes**: a sub-module class flattened into its owner (``flatten_submodule``),
  a data module used once replaced by its loaders (``loaders_for_datamodule``), a module that
  only wraps another replaced by it (``unwrap_module``).
"""

from __future__ import annotations

import ast
import copy
import json
import operator
from pathlib import Path

RECORDER = "__minimize_value__"
SCALARS = (int, float, str, bool, type(None))
MAX_ITEMS = 8  # a list or tuple longer than this is not folded (it would only add lines)


def fold_sites(tree: ast.AST) -> list[ast.Subscript | ast.Attribute]:
    """Subscripts read with a constant key, and the last attribute of a chain read as a value
    (``self.backbone.out_features``; not a method called, not a module's name, not a part of a
    longer chain), in a fixed order (the record's ids)."""
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names}

    def root(node):
        while isinstance(node, ast.Attribute):
            node = node.value
        return node

    def value_read(n):
        holder = parents.get(id(n))
        base = root(n)
        return isinstance(n.ctx, ast.Load) and not isinstance(holder, ast.Attribute | ast.Subscript
                                                                 | ast.pattern) \
            and not (isinstance(holder, ast.Call) and holder.func is n) \
            and isinstance(base, ast.Name) and base.id not in imported

    return [n for n in ast.walk(tree)
            if (isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load)
                and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str | int))
            or (isinstance(n, ast.Attribute) and value_read(n))]


def _prelude(sink: Path) -> list[ast.stmt]:
    code = f"""
def {RECORDER}(i, v, _seen={{}}, _path={str(sink)!r}):
    if i in _seen and _seen[i] is None:
        return v
    import json as _json
    scalars = (int, float, str, bool, type(None))
    key = None
    if type(v) in scalars or (type(v) in (list, tuple) and len(v) <= 8
                              and all(type(x) in scalars for x in v)):
        try:
            text = repr(v)
            if i in _seen and _seen[i] == text:
                return v
            key = text if __import__('ast').literal_eval(text) == v else None
        except Exception:
            pass
    if i in _seen and _seen[i] == key:
        return v
    _seen[i] = key if i not in _seen else None
    with open(_path, 'a') as out:
        out.write(_json.dumps([i, _seen[i]]) + '\\n')
    return v
"""
    return ast.parse(code).body


def instrument(source: str, sink: Path) -> str:
    """``source`` with every fold site wrapped in a recorder that appends ``[id, repr]`` lines
    to ``sink`` (``[id, null]`` once the value is not plain or changed)."""
    tree = ast.parse(source)
    sites = {id(n): i for i, n in enumerate(fold_sites(tree))}

    class Wrap(ast.NodeTransformer):
        def visit_Subscript(self, node):
            self.generic_visit(node)
            if id(node) in sites:
                return ast.Call(ast.Name(RECORDER, ast.Load()), [ast.Constant(sites[id(node)]), node], [])
            return node

        visit_Attribute = visit_Subscript

    tree = Wrap().visit(tree)
    body = tree.body
    cut = 0  # after the docstring and ``from __future__`` imports
    while cut < len(body) and (
            (isinstance(body[cut], ast.ImportFrom) and body[cut].module == "__future__")
            or (cut == 0 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant))):
        cut += 1
    tree.body = body[:cut] + _prelude(sink) + body[cut:]
    return ast.unparse(ast.fix_missing_locations(tree))


def read_records(sink: Path) -> dict[int, str]:
    """The sites that gave one plain value in every process: id -> its repr."""
    values: dict[int, str | None] = {}
    try:
        lines = sink.read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        try:
            i, text = json.loads(line)
        except ValueError:
            continue  # a torn line of a killed process: that site is simply not folded
        values[i] = text if values.get(i, text) == text else None
    return {i: t for i, t in values.items() if t is not None}


def _constants(node: ast.AST) -> set:
    return {(type(n.value), n.value) for n in ast.walk(node) if isinstance(n, ast.Constant)}


def _is_constant(node: ast.expr) -> bool:
    negative = isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
    return isinstance(node.operand if negative else node, ast.Constant)


def fold(source: str, records: dict[int, str], allowed: set,
         within: set[int] | None = None) -> tuple[str, int]:
    """``source`` with each recorded site (outermost first) replaced by its value, when that
    value is short and made only of constants the original has (``allowed``: values stay as
    the user wrote them); only in these module-level statements (by index) if given. The new
    source, and how many sites were folded."""
    tree = ast.parse(source)
    sites = {id(n): i for i, n in enumerate(fold_sites(tree))}
    if within is not None:
        inside = {id(n) for i in within for n in ast.walk(tree.body[i])}
        sites = {k: i for k, i in sites.items() if k in inside}
    folded = 0

    class Fold(ast.NodeTransformer):
        def visit_Attribute(self, node):
            return self.visit_Subscript(node)

        def visit_Subscript(self, node):
            i = sites.get(id(node))
            if i is not None and i in records:
                value = ast.parse(records[i], mode="eval").body
                items = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
                if len(items) <= MAX_ITEMS and all(map(_is_constant, items)) \
                        and _constants(value) <= allowed:
                    nonlocal folded
                    folded += 1
                    return ast.copy_location(value, node)
            self.generic_visit(node)
            return node

    tree = Fold().visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree)), folded


# -- dead definitions ----------------------------------------------------------------------

def _read_names(files: dict[str, str | None]) -> tuple[set[str], dict[str, set[str]]]:
    """Every name any file reads, as a name, an attribute (``module.function``) or a string
    (``getattr``, ``__all__``); and by module, the names other files import from it."""
    read: set[str] = set()
    imported: dict[str, set[str]] = {}
    for source in files.values():
        if not source:
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load | ast.Del):
                read.add(node.id)
            elif isinstance(node, ast.Attribute):
                read.add(node.attr)
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.setdefault(node.module, set()).update(a.name for a in node.names)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                read.add(node.value)  # getattr(module, "name"), __all__ entries
    return read, imported


def _unused(node: ast.stmt, read: set[str]) -> ast.stmt | None:
    """The statement without the names nothing reads; None when nothing of it is left."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node if node.name in read else None
    if isinstance(node, ast.Import | ast.ImportFrom):
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            return node
        names = [a for a in node.names if a.name == "*" or (a.asname or a.name).split(".")[0] in read]
        if not names:
            return None
        if len(names) == len(node.names):
            return node
        return ast.copy_location(type(node)(**{**dict(ast.iter_fields(node)), "names": names}), node)
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        # a value computed by a call may matter for what the call does: left to the reducer
        acts = (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)
        effects = node.value is not None and any(isinstance(n, acts) for n in ast.walk(node.value))
        if not effects and all(isinstance(t, ast.Name) and t.id not in read for t in targets):
            return None
    return node


def drop_unused(files: dict[str, str | None], keep: dict[str, list[str]]) -> dict[str, str | None]:
    """The files without module-level definitions, imports and assignments that nothing reads
    (repeated until none is left); statements marked to keep stay."""
    files = dict(files)
    while True:
        read, imported = _read_names(files)
        changed = False
        for name, source in files.items():
            if not source:
                continue
            needed = read | imported.get(name.removesuffix(".py").replace("/", "."), set())
            tree = ast.parse(source)
            body = []
            for node in tree.body:
                left = node if ast.dump(node) in keep.get(name, ()) else _unused(node, needed)
                if left is not None:
                    body.append(left)
            if [id(n) for n in body] != [id(n) for n in tree.body]:
                tree.body = body or [ast.Pass()]
                files[name], changed = ast.unparse(tree), True
        if not changed:
            return files


# -- unused parameters ---------------------------------------------------------------------

def _reads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


FRAME_READERS = {"save_hyperparameters", "locals", "vars", "inspect", "currentframe", "_getframe"}


def _called_only(trees: dict[str, ast.Module], parents: dict[int, ast.AST]) -> dict[str, tuple]:
    """Module-level functions, and classes (through their ``__init__``), defined once, with
    plain parameters, whose every use is a direct call by name without ``*`` or ``**``:
    name -> (the function, how many leading parameters the calls do not pass, the calls)."""
    defs: dict[str, list] = {}
    # names that are not only this module-level function: imported elsewhere, read as an
    # attribute, or also bound as a variable or parameter somewhere
    other = {a.asname or a.name for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.ImportFrom)
             for a in n.names} | \
        {n.attr for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.Attribute)} | \
        {n.id for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.Name)
         and not isinstance(n.ctx, ast.Load)} | \
        {n.arg for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.arg)}
    for tree in trees.values():
        for node in tree.body:
            if getattr(node, "decorator_list", None):
                defs.setdefault(node.name, []).append(None)  # a decorator may call it in its own way
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                defs.setdefault(node.name, []).append((node, 0))
            elif isinstance(node, ast.ClassDef):
                init = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
                defs.setdefault(node.name, []).append((init[0], 1) if init else None)
    found = {}
    for name, defined in defs.items():
        if len(defined) != 1 or defined[0] is None or name in other:
            continue
        func, skip = defined[0]
        if func.args.vararg or func.args.kwarg or func.args.posonlyargs:
            continue
        uses = [n for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.Name) and n.id == name
                and not isinstance(n.ctx, ast.Store)]
        calls = [parents.get(id(u)) for u in uses]
        if not all(isinstance(c, ast.Call) and c.func is u for c, u in zip(calls, uses, strict=True)):
            continue  # passed around or subclassed: its parameters are not ours to change
        if any(isinstance(a, ast.Starred) for c in calls for a in c.args) or \
                any(k.arg is None for c in calls for k in c.keywords):
            continue
        if any(isinstance(n, ast.Name | ast.Attribute) and getattr(n, "id", getattr(n, "attr", None))
               in FRAME_READERS for n in ast.walk(func)):
            continue  # it reads its own arguments by name (Lightning's ``save_hyperparameters()``)
        found[name] = (func, skip, calls)
    return found


def _drop_param(func: ast.FunctionDef, skip: int, calls: list[ast.Call], i: int) -> None:
    """The ``i``-th passed parameter gone from ``func``, and its argument from every call."""
    args, param = func.args, func.args.args[skip + i]
    first_default = len(args.args) - len(args.defaults)
    if skip + i >= first_default:
        del args.defaults[skip + i - first_default]
    del args.args[skip + i]
    for call in calls:
        if len(call.args) > i:
            del call.args[i]
        call.keywords = [k for k in call.keywords if k.arg != param.arg]


def drop_unused_params(files: dict[str, str | None], only: str | None = None,
                       touched: set[str] | None = None) -> dict[str, str | None]:
    """The files without the parameters a module-level function (or a class's ``__init__``)
    never reads, and without the arguments every call passes to them (all its uses must be
    direct calls by name, none with ``*`` or ``**``). A deletion reducer cannot do this: dropping
    the parameter alone, or one argument alone, makes a call that cannot bind. ``only``: that
    function or class alone; ``touched`` gets the names of those changed."""
    trees = {n: ast.parse(s) for n, s in files.items() if s}
    parents = {id(c): p for t in trees.values() for p in ast.walk(t) for c in ast.iter_child_nodes(p)}
    changed = False
    for name, (func, skip, calls) in _called_only(trees, parents).items():
        if only and name != only:
            continue
        args = func.args
        used = _reads(ast.Module(body=func.body, type_ignores=[])) | \
            {n for d in [*args.defaults, *args.kw_defaults] if d for n in _reads(d)}
        for i in range(len(args.args) - skip - 1, -1, -1):
            if args.args[skip + i].arg not in used:
                _drop_param(func, skip, calls, i)
                changed = True
                if touched is not None:
                    touched.add(name)
    if not changed:
        return files
    return {n: ast.unparse(trees[n]) if n in trees else s for n, s in files.items()}


def functions_with_unused_params(files: dict[str, str | None]) -> list[str]:
    """The names ``drop_unused_params`` would change, one by one: those it changes all at once
    (dropping one function's arguments only removes reads from another: never fewer), each
    checked alone."""
    names: set[str] = set()
    drop_unused_params(files, touched=names)
    return sorted(n for n in names if drop_unused_params(files, only=n) != files)


# -- constant arguments and literals -------------------------------------------------------

def _literal(node: ast.expr | None) -> bool:
    """A value written out in full: a constant, or a list, tuple, set or dict of constants."""
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return node is not None


def bind_constant_args(files: dict[str, str | None], only: str | None = None,
                       touched: set[str] | None = None) -> dict[str, str | None]:
    """The files with each parameter to which every call passes the same literal (or leaves the
    same literal default) replaced by that literal in the function's body, and gone from the
    definition and the calls (``Encoder(16, [32], "gelu")`` -> ``Encoder()``, the values in
    ``__init__``): a function with one caller, the usual shape of a user's program, is then
    simplified where its values are used. Not when the body binds the name again (anywhere,
    nested scopes included), nor a list, dict or set read twice (two objects where there was
    one). ``only``: that function or class alone; ``touched`` gets the names of those changed."""
    trees = {n: ast.parse(s) for n, s in files.items() if s}
    parents = {id(c): p for t in trees.values() for p in ast.walk(t) for c in ast.iter_child_nodes(p)}
    changed = False
    for name, (func, skip, calls) in _called_only(trees, parents).items():
        if (only and name != only) or not calls:
            continue
        args = func.args
        inner = ast.Module(body=func.body, type_ignores=[])
        rebound = _bound(inner) | {g for n in ast.walk(inner) if isinstance(n, ast.Global | ast.Nonlocal)
                                   for g in n.names}
        defaults = dict(zip([a.arg for a in args.args][::-1], args.defaults[::-1], strict=False))
        for i in range(len(args.args) - skip - 1, -1, -1):
            param = args.args[skip + i].arg
            given = []
            for call in calls:
                keyword = [k.value for k in call.keywords if k.arg == param]
                given.append(call.args[i] if len(call.args) > i else keyword[0] if keyword
                             else defaults.get(param))
            if param in rebound or not all(map(_literal, given)) or len({ast.dump(g) for g in given}) != 1:
                continue
            uses = [n for n in ast.walk(inner) if isinstance(n, ast.Name) and n.id == param]
            mutable = any(isinstance(n, ast.List | ast.Dict | ast.Set) for n in ast.walk(given[0]))
            if mutable:  # one list where there was one: not a shared default, not rebuilt in a loop
                around = _ancestors(uses[0], parents) if uses else [func]
                around = around[:next(i for i, n in enumerate(around) if n is func)]
                if len(uses) > 1 or param in defaults or any(
                        _repeats(n, uses[0]) or isinstance(n, SCOPES) for n in around):
                    continue
            value = copy.deepcopy(given[0])
            func.body = [_substitute(stmt, {param: value}) for stmt in func.body]
            _drop_param(func, skip, calls, i)
            changed = True
            if touched is not None:
                touched.add(name)
    if not changed:
        return files
    return _unparsed(files, trees) or files


def functions_with_constant_args(files: dict[str, str | None]) -> list[str]:
    """The names ``bind_constant_args`` would change, one by one: those it changes all at once
    (a literal bound into one function only makes more of the calls it holds constant), each
    checked alone."""
    names: set[str] = set()
    bind_constant_args(files, touched=names)
    return sorted(n for n in names if bind_constant_args(files, only=n) != files)


class _OutsideKept(ast.NodeTransformer):
    """A transformer that leaves the statements marked to keep (by ``ast.dump``) as they are."""

    def __init__(self, kept: set[str]):
        self.kept = kept

    def visit(self, node):
        return node if isinstance(node, ast.stmt) and ast.dump(node) in self.kept else super().visit(node)


class _Literals(_OutsideKept):
    """``{"a": x, "b": y}["b"]`` -> ``y``, ``[x, y][0]`` -> ``x``, ``f(*[x, y])`` -> ``f(x, y)``,
    ``"a" == "a"`` -> ``True`` (and ``True and x`` -> ``x``); not inside the statements marked to
    keep."""

    def visit_Subscript(self, node):
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load) or not isinstance(node.slice, ast.Constant):
            return node
        key, value = node.slice.value, node.value
        if isinstance(value, ast.Dict) and None not in value.keys \
                and all(isinstance(k, ast.Constant) for k in value.keys):
            hits = [v for k, v in zip(value.keys, value.values, strict=True) if k.value == key]
            return hits[-1] if hits else node
        if isinstance(value, ast.List | ast.Tuple) and type(key) is int \
                and not any(isinstance(e, ast.Starred) for e in value.elts) \
                and -len(value.elts) <= key < len(value.elts):
            return value.elts[key]
        return node

    COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
               ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not}

    def visit_Compare(self, node):
        """``"train" == "train"`` -> ``True``: a comparison of literals (str, numbers, bool, None)."""
        self.generic_visit(node)
        parts = [node.left, *node.comparators]
        if not all(isinstance(p, ast.Constant) and isinstance(p.value, str | int | float | bool | type(None))
                   for p in parts) or not all(type(op) in self.COMPARE for op in node.ops):
            return node
        try:
            result = all(self.COMPARE[type(op)](a.value, b.value)
                         for op, a, b in zip(node.ops, parts[:-1], parts[1:], strict=True))
        except TypeError:  # "a" < 1: it raises at run time, and keeps doing so
            return node
        return ast.copy_location(ast.Constant(result), node)

    def visit_BoolOp(self, node):
        """``True and x`` -> ``x``, ``False or x`` -> ``x``, ``False and x`` -> ``False``."""
        self.generic_visit(node)
        values = list(node.values)
        neutral = isinstance(node.op, ast.And)  # And: True is neutral, False decides; Or: reversed
        while len(values) > 1 and isinstance(values[0], ast.Constant) and isinstance(values[0].value, bool):
            if values[0].value is neutral:
                values.pop(0)
            else:
                return values[0]
        return values[0] if len(values) == 1 else ast.BoolOp(node.op, values)

    @staticmethod
    def _spread(items: list[ast.expr]) -> list[ast.expr]:
        out = []
        for item in items:
            if isinstance(item, ast.Starred) and isinstance(item.value, ast.List | ast.Tuple):
                out += item.value.elts
            else:
                out.append(item)
        return out

    def visit_Call(self, node):
        self.generic_visit(node)
        node.args = self._spread(node.args)
        return node

    def visit_List(self, node):
        self.generic_visit(node)
        if isinstance(node.ctx, ast.Load):
            node.elts = self._spread(node.elts)
        return node

    visit_Tuple = visit_List


def _breaks(loop: ast.For) -> bool:
    """Does a ``break`` or ``continue`` of ``loop`` itself (not of a loop inside it) appear?"""
    todo = list(loop.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Break | ast.Continue):
            return True
        if isinstance(node, ast.For | ast.AsyncFor | ast.While):
            todo.extend(node.orelse)  # a break in an inner loop's ``else`` is the outer loop's
        elif not isinstance(node, LOOPS + SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return False


def _unroll(body: list[ast.stmt], kept: set[str]) -> list[ast.stmt]:
    """``for x in [v]: ...`` (one item, no ``else``, no ``break``) -> ``x = v`` and its body;
    not inside the statements marked to keep."""
    out = []
    for node in body:
        if ast.dump(node) in kept:
            out.append(node)
            continue
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(node, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                setattr(node, field, _unroll(inner, kept))
        for part in [*getattr(node, "handlers", ()), *getattr(node, "cases", ())]:
            part.body = _unroll(part.body, kept)
        if isinstance(node, ast.For) and isinstance(node.iter, ast.List | ast.Tuple) \
                and len(node.iter.elts) == 1 and not isinstance(node.iter.elts[0], ast.Starred) \
                and not node.orelse and not _breaks(node):
            out += [ast.Assign([node.target], node.iter.elts[0]), *node.body]
        else:
            out.append(node)
    return out


def fold_literals(files: dict[str, str | None], keep: dict[str, list[str]]) -> dict[str, str | None]:
    """The files with what a literal makes plain written plainly: a constant key or index into
    a dict, list or tuple literal replaced by the item (``{"relu": nn.ReLU(), "gelu":
    nn.GELU()}["gelu"]`` -> ``nn.GELU()``), a literal spread with ``*`` into a call or a list
    written out, and a loop over a one-item literal unrolled. The other items of a literal
    indexed this way are not built any more: the harness judges whether that matters.
    Statements marked to keep stay."""
    out = dict(files)
    for name, source in files.items():
        if not source:
            continue
        kept = set(keep.get(name, ()))
        tree = _Literals(kept).visit(ast.parse(source))
        tree.body = _unroll(tree.body, kept)
        written = _unparsed({name: source}, {name: tree})
        if written:
            out[name] = written[name]
    return out


# -- no-op statements ----------------------------------------------------------------------

def drop_noops(files: dict[str, str | None], keep: dict[str, list[str]],
               docstrings: bool = True) -> dict[str, str | None]:
    """The files without statements that do nothing: docstrings (but the module's when
    ``docstrings`` is False: a program may read ``__doc__``) and other bare constants (``0``,
    which the reducer leaves where it emptied an expression), ``pass`` in a body that has other
    statements, and conditions on a constant (``if True:``, ``a if False else b``: the branch
    that runs).
    Statements marked to keep, and what is inside them, stay."""
    out = dict(files)
    for name, source in files.items():
        if not source:
            continue
        tree = ast.parse(source)
        kept = set(keep.get(name, ()))
        doc = tree.body[:1] if not docstrings and tree.body and isinstance(tree.body[0], ast.Expr) \
            and isinstance(tree.body[0].value, ast.Constant) else []
        tree.body = doc + _clean(tree.body[len(doc):], kept)
        tree = _Choose(kept).visit(tree)
        out[name] = ast.unparse(tree) if tree.body else "pass"
    return out


def _clean(body: list[ast.stmt], kept: set[str]) -> list[ast.stmt]:
    left = []
    for node in body:
        if ast.dump(node) in kept:
            left.append(node)
            continue
        bare = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if bare or isinstance(node, ast.Pass):
            continue
        if isinstance(node, ast.If) and isinstance(node.test, ast.Constant):
            left += _clean(node.body if node.test.value else node.orelse, kept)
            continue
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(node, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                empty = [ast.Pass()] if field == "body" else []
                setattr(node, field, _clean(inner, kept) or empty)
        for handler in getattr(node, "handlers", ()):
            handler.body = _clean(handler.body, kept) or [ast.Pass()]
        if isinstance(node, ast.Try | ast.TryStar) and not node.handlers and not node.finalbody:
            node.finalbody = [ast.Pass()]  # ``try:`` needs an ``except`` or a ``finally``
        for case in getattr(node, "cases", ()):
            case.body = _clean(case.body, kept) or [ast.Pass()]
        left.append(node)
    return left


class _Choose(_OutsideKept):
    """``a if True else b`` -> ``a``, outside the statements marked to keep."""

    def visit_IfExp(self, node):
        self.generic_visit(node)
        if isinstance(node.test, ast.Constant):
            return node.body if node.test.value else node.orelse
        return node


# -- inlining functions and methods with one caller ----------------------------------------

def _names(node: ast.AST) -> set[str]:
    """Every name that appears in ``node``, read or bound."""
    declared = {name for n in ast.walk(node) if isinstance(n, ast.Global | ast.Nonlocal) for name in n.names}
    return _bound(node) | _reads(node) | declared


def _bound(node: ast.AST) -> set[str]:
    """The names ``node`` binds anywhere inside it (nested scopes included: conservative)."""
    found = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            found.add(n.id)
        elif isinstance(n, ast.arg):
            found.add(n.arg)
        elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(n.name)
        elif isinstance(n, ast.Import | ast.ImportFrom):
            found.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            found.add(n.name)
        elif isinstance(n, ast.MatchAs | ast.MatchStar) and n.name:
            found.add(n.name)  # a name a ``case`` pattern captures
        elif isinstance(n, ast.MatchMapping) and n.rest:
            found.add(n.rest)
    return found


def _captured(nodes) -> set[str]:
    """The names the ``case`` patterns among ``nodes`` capture."""
    return {x for n in nodes if isinstance(n, ast.MatchAs | ast.MatchStar | ast.MatchMapping)
            for x in [getattr(n, "name", None), getattr(n, "rest", None)] if x}


def _free_reads(node: ast.AST) -> set[str]:
    """The names a definition's functions read without binding them: module names it uses."""
    found = set()
    for n in ast.walk(node):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            found |= _reads(n) - _bound(n)
        elif isinstance(n, ast.ClassDef):
            found |= {r for s in n.body if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)
                      for r in _reads(s)} | {r for b in n.bases for r in _reads(b)}
    return found


def _rename(node: ast.AST, old: str, new: str) -> ast.AST:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id == old:
            n.id = new
    return node


def _substitute(expr: ast.expr, values: dict[str, ast.expr]) -> ast.expr:
    class Sub(ast.NodeTransformer):
        def visit_Name(self, node):
            if isinstance(node.ctx, ast.Load) and node.id in values:
                return ast.copy_location(copy.deepcopy(values[node.id]), node)
            return node
    return Sub().visit(expr)


def _plain_body(func: ast.FunctionDef) -> list[ast.stmt] | None:
    """The function's statements without its docstring, when it can be pasted at its call:
    no decorator, only plain parameters, no generator, ``global``, ``nonlocal`` or nested
    definition, and a ``return`` only as its last statement."""
    if func.decorator_list or func.args.vararg or func.args.kwarg or func.args.posonlyargs \
            or func.args.kwonlyargs:
        return None
    body = func.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if not body:
        return None
    inner = [n for s in body for n in ast.walk(s)]
    if any(isinstance(n, ast.Yield | ast.YieldFrom | ast.Await | ast.Global | ast.Nonlocal
                      | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) for n in inner):
        return None
    returns = [n for n in inner if isinstance(n, ast.Return)]
    if returns and (len(returns) > 1 or returns[0] is not body[-1]):
        return None
    return body


def _definitions(trees: dict[str, ast.Module]) -> dict[str, tuple[str, ast.ClassDef | None, ast.FunctionDef]]:
    """Module-level functions and methods, by ``name`` or ``Class.name``; a name defined twice
    (in two files, or as a method of two classes) is left out."""
    found: dict[str, list] = {}
    methods: dict[str, int] = {}
    for file, tree in trees.items():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                found.setdefault(node.name, []).append((file, None, node))
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and not item.name.startswith("__"):
                        found.setdefault(f"{node.name}.{item.name}", []).append((file, node, item))
                        methods[item.name] = methods.get(item.name, 0) + 1
    return {q: f[0] for q, f in found.items()
            if len(f) == 1 and ("." not in q or methods[q.split(".")[1]] == 1)}


def inline(files: dict[str, str | None], qualname: str) -> dict[str, str | None] | None:
    """The files with the function (``name``) or method (``Class.name``) pasted at its only
    call and its definition gone; None when that cannot be done safely here.

    A function whose body is one ``return EXPR`` becomes ``EXPR`` at the call, its parameters
    replaced by the arguments (an argument used twice must be a name or a constant). Any
    other, called once in a simple statement (an expression, an assignment, a ``return``; not
    under a condition, a lambda or a comprehension), becomes statements before it: the body,
    each parameter replaced by its argument when that is a name or a constant, else assigned
    first (``param = argument``), then the statement with the returned value in place of the
    call. Refused when a name would change meaning: the function's own names appear in the
    caller, or the caller binds a name the function reads from its module.
    A method is inlined at a ``self.name(...)`` call in another method of its class, or at
    ``obj.name(...)`` anywhere when it needs no class cell (``super()``, private names)."""
    trees = {n: ast.parse(s) for n, s in files.items() if s}
    found = _definitions(trees).get(qualname)
    if not found:
        return None
    file, cls, func = found
    body = _plain_body(func)
    if body is None:
        return None
    tree = trees[file]
    parents = {id(c): p for t in trees.values() for p in ast.walk(t) for c in ast.iter_child_nodes(p)}
    short = func.name
    if cls is None:
        if any(isinstance(n, ast.ImportFrom) and any(a.name == short for a in n.names)
               for t in trees.values() for n in ast.walk(t)):
            return None
        module = file.removesuffix(".py").replace("/", ".")
        aliases = {a.asname or a.name for t in trees.values() for n in ast.walk(t)
                   if isinstance(n, ast.Import) for a in n.names if a.name == module}
        if any(isinstance(n, ast.Attribute) and n.attr == short and isinstance(n.value, ast.Name)
               and n.value.id in aliases for t in trees.values() for n in ast.walk(t)):
            return None  # also used as module.name
        uses = [n for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.Name) and n.id == short]
        if len(uses) != 1 or not isinstance(uses[0].ctx, ast.Load) or uses[0] not in list(ast.walk(tree)):
            return None
    else:
        uses = [n for t in trees.values() for n in ast.walk(t)
                if isinstance(n, ast.Attribute) and n.attr == short]
        if len(uses) != 1 or not isinstance(uses[0].value, ast.Name):
            return None
    if any(isinstance(n, ast.Constant) and n.value == short for t in trees.values() for n in ast.walk(t)):
        return None  # getattr(obj, "name"): a use we cannot follow
    call = parents.get(id(uses[0]))
    if not (isinstance(call, ast.Call) and call.func is uses[0]):
        return None
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    if any(n is func for n in _ancestors(call, parents)):
        return None  # recursive
    # the scope the call is in
    chain = _ancestors(call, parents)
    scope = next((n for n in chain if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
                                                      | ast.ClassDef | ast.Module)), None)
    params = [a.arg for a in func.args.args]
    receiver = None
    if cls is not None:
        # obj.name(...): in a method of the same class on its first parameter, or anywhere on a
        # name (the method's name is unique in the program) when the method needs no class cell
        receiver, params = uses[0].value.id, params[1:]
        same_class = (isinstance(scope, ast.FunctionDef) and parents.get(id(scope)) is cls
                      and scope.args.args and scope.args.args[0].arg == receiver)
        if not func.args.args or uses[0] not in list(ast.walk(tree)) or (not same_class and (
                isinstance(scope, ast.ClassDef | ast.Lambda)
                or any(isinstance(n, ast.Name) and n.id in ("super", "__class__") for n in ast.walk(func))
                or any(isinstance(n, ast.Attribute) and n.attr.startswith("__") for n in ast.walk(func)))):
            return None  # another file (its imports differ), or the class cell is needed
        if not same_class:  # the receiver must be an instance made here: ``obj = Class(...)``
            made = [n for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == receiver
                    and not isinstance(n.ctx, ast.Load)]
            value = getattr(parents.get(id(made[0])), "value", None) if len(made) == 1 else None
            if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                    and value.func.id == cls.name):
                return None
    elif isinstance(scope, ast.ClassDef | ast.Lambda):
        return None
    # argument of each parameter
    values: dict[str, ast.expr] = {}
    if len(call.args) > len(params):
        return None
    for p, a in zip(params, call.args, strict=False):
        values[p] = a
    for k in call.keywords:
        if k.arg not in params or k.arg in values:
            return None
        values[k.arg] = k.value
    defaults = dict(zip(params[::-1], func.args.defaults[::-1], strict=False))
    for p in params:
        if p not in values:
            if p not in defaults or not isinstance(defaults[p], ast.Constant):
                return None
            values[p] = defaults[p]
    if receiver is not None:
        self_name = func.args.args[0].arg
        if self_name != receiver:
            if receiver in _names(func):
                return None
            body = [_rename(copy.deepcopy(s), self_name, receiver) for s in body]
    inner = ast.Module(body=body, type_ignores=[])
    own = set(params) | _bound(inner)  # the function's local names (its receiver aside)
    reads_module = _reads(inner) - own - {receiver or ""}
    local = _bound(scope) if not isinstance(scope, ast.Module) else set()
    if cls is None and short in local:
        return None  # the call's name is a local of the caller there, not this function
    for node in chain:  # comprehensions, lambdas and enclosing functions: their names too
        if node is not scope and isinstance(node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp
                                            | ast.GeneratorExp | ast.FunctionDef | ast.AsyncFunctionDef):
            local |= _bound(node)
    if reads_module & local:
        return None  # the caller binds a name the function reads from its module
    stmt = next(n for n in chain if isinstance(n, ast.stmt))
    expr = copy.deepcopy(body[0].value) if len(body) == 1 and isinstance(body[0], ast.Return) else None
    if expr is not None:
        counts = {p: sum(isinstance(n, ast.Name) and n.id == p for n in ast.walk(expr)) for p in params}
        deferred = {n.id for d in ast.walk(expr) if isinstance(d, ast.Lambda | ast.ListComp | ast.SetComp
                                                                  | ast.DictComp | ast.GeneratorExp)
                    for n in ast.walk(d) if isinstance(n, ast.Name)}
        if _bound(expr) & (set(params) | set().union(*(_names(v) for v in values.values()))) or \
                any(isinstance(n, ast.NamedExpr) for n in ast.walk(expr)) or \
                any(p in deferred and not isinstance(values[p], ast.Constant) for p in params) or \
                any(counts[p] > 1 and not isinstance(values[p], ast.Name | ast.Constant) for p in params):
            expr = None  # a comprehension or lambda in it would capture an argument's names or run
            # it at another time, a walrus would bind in the caller, or an argument would be
            # computed twice: as statements instead
    if expr is not None:
        new = _substitute(expr, values)
        holder = parents[id(call)]
        _replace_child(holder, call, new)
    else:
        if not isinstance(stmt, ast.Expr | ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Return):
            return None
        path = chain[:chain.index(stmt)]
        if any(isinstance(n, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp
                          | ast.BoolOp | ast.IfExp) for n in path):
            return None  # the call may run several times, or not at all
        # a name or a constant goes in place of its parameter (no rebinding in the body)
        direct = {p: values[p] for p in params
                  if isinstance(values[p], ast.Name | ast.Constant) and p not in _bound(inner)}
        if isinstance(scope, ast.Module):  # its names become globals: what else in the module sees them
            elsewhere = set()
            for node in tree.body:
                if node is func:
                    continue
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    elsewhere |= {node.name} | _free_reads(node)
                else:
                    elsewhere |= _names(node)
        else:
            elsewhere = _names(scope)
        if (own - set(direct)) & elsewhere:
            return None  # the function's own names would change the caller's
        new_body = [ast.Assign([ast.Name(p, ast.Store())], values[p]) for p in params if p not in direct]
        new_body += [_substitute(copy.deepcopy(s), direct) for s in body]
        result = new_body.pop().value if isinstance(new_body[-1], ast.Return) else None
        if isinstance(stmt, ast.Expr) and stmt.value is call:
            if result is not None:
                new_body.append(ast.Expr(result))
        else:  # the statement, with the call's value in place of the call
            _replace_child(parents[id(call)], call, result or ast.Constant(None))
            new_body.append(stmt)
        container, field, index = _position(stmt, parents)
        getattr(container, field)[index:index + 1] = new_body or [ast.Pass()]
    owner = cls or tree
    owner.body = [n for n in owner.body if n is not func] or [ast.Pass()]
    return _unparsed(files, trees)


def _unparsed(files: dict[str, str | None], trees: dict[str, ast.Module]) -> dict[str, str | None] | None:
    """The changed trees as source; None when one is no program (Python 3.11 cannot write a
    backslash inside an f-string's braces, where a moved constant may land)."""
    out = {}
    for name, source in files.items():
        if name not in trees:
            out[name] = source
            continue
        try:
            out[name] = ast.unparse(ast.fix_missing_locations(trees[name]))
            compile(out[name], name, "exec")
        except (ValueError, SyntaxError):
            return None
    return out


def _ancestors(node: ast.AST, parents: dict[int, ast.AST]) -> list[ast.AST]:
    chain = []
    while id(node) in parents:
        node = parents[id(node)]
        chain.append(node)
    return chain


def _replace_child(parent: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for field, value in ast.iter_fields(parent):
        if value is old:
            setattr(parent, field, new)
            return
        if isinstance(value, list):
            for i, item in enumerate(value):
                if item is old:
                    value[i] = new
                    return


def _position(stmt: ast.stmt, parents: dict[int, ast.AST]) -> tuple[ast.AST, str, int]:
    parent = parents[id(stmt)]
    for field, value in ast.iter_fields(parent):
        if isinstance(value, list):
            for i, item in enumerate(value):
                if item is stmt:
                    return parent, field, i
    raise LookupError("statement not found in its parent")


def inlinable(files: dict[str, str | None]) -> list[str]:
    """The functions and methods ``inline`` can paste at their only call."""
    trees = {n: ast.parse(s) for n, s in files.items() if s}
    return sorted(q for q in _definitions(trees) if inline(files, q) is not None)


def inline_all(files: dict[str, str | None], allowed=lambda files: True) -> dict[str, str | None]:
    """``files`` with every function and method that can be inlined inlined, one after the
    other (an inlined call may make another function's only call inlinable); ``allowed``
    judges each step statically (the keep markers)."""
    done: set[str] = set()
    while True:
        for q in inlinable(files):
            if q in done:
                continue
            candidate = inline(files, q)
            done.add(q)
            if candidate is not None and allowed(candidate):
                files = candidate
                break
        else:
            return files


# -- variables read once -------------------------------------------------------------------

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _own(scope: ast.AST) -> tuple[list[ast.AST], list[ast.AST]]:
    """The nodes of ``scope`` itself, and the nested scopes in it (not descended into)."""
    own, nested, todo = [], [], list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, SCOPES):
            nested.append(node)
            # decorators, defaults and bases run in this scope
            todo.extend(getattr(node, "decorator_list", []) + getattr(node, "bases", []))
            if not isinstance(node, ast.ClassDef):
                todo.extend(d for d in [*node.args.defaults, *node.args.kw_defaults] if d)
            continue
        own.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return own, nested


def _single_use(tree: ast.Module, scope: ast.AST, parents: dict[int, ast.AST], outside: set[str]):
    """(assignment, its reads) of each variable of ``scope`` bound by one plain assignment and
    read once after it (or, when its value is a number or a string, read any number of times),
    whose value can move to those reads; (assignment, []) for one never read whose value does
    nothing."""
    own, nested = _own(scope)
    params = set() if isinstance(scope, ast.Module | ast.ClassDef) else \
        {a.arg for a in ast.walk(scope.args) if isinstance(a, ast.arg)}
    # what nested scopes read of this one (a parameter of the same name there is another name)
    in_nested = set()
    for n in nested:
        in_nested |= _free_reads(n) | {name for g in ast.walk(n) if isinstance(g, ast.Global | ast.Nonlocal)
                                       for name in g.names}
        if isinstance(n, ast.Lambda):
            in_nested |= _reads(n.body) - _bound(n)
    declared = {name for n in own if isinstance(n, ast.Global | ast.Nonlocal) for name in n.names} | \
        _captured(own)  # a ``case`` pattern binds it too: not one plain assignment
    stores: dict[str, list] = {}
    loads: dict[str, list] = {}
    for n in own:
        if isinstance(n, ast.Name):
            (loads if isinstance(n.ctx, ast.Load) else stores).setdefault(n.id, []).append(n)
        elif isinstance(n, ast.Import | ast.ImportFrom | ast.ExceptHandler):
            for name in ([(a.asname or a.name).split(".")[0] for a in n.names]
                         if not isinstance(n, ast.ExceptHandler) else [n.name]):
                stores.setdefault(name, []).append(n)
    for n in nested:
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            stores.setdefault(n.name, []).append(n)
    found = []
    for name, bound in stores.items():
        if len(bound) != 1 or name in params | declared | outside or name in in_nested:
            continue
        target, uses = bound[0], loads.get(name, [])
        assign = parents.get(id(target))
        if not uses:  # never read: the assignment goes if its value does nothing
            acts = (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr, ast.Subscript,
                    ast.Attribute)
            if isinstance(assign, ast.Assign) and assign.targets == [target] \
                    and not any(isinstance(n, acts) for n in ast.walk(assign.value)):
                found.append((assign, []))
            continue
        if not (isinstance(assign, ast.Assign) and assign.targets == [target]):
            continue
        if isinstance(assign.value, ast.Starred | ast.Yield | ast.YieldFrom | ast.Await | ast.NamedExpr):
            continue
        constant = _is_constant(assign.value)  # a number or a string: written at every read
        if len(uses) > 1 and not constant:
            continue
        if all(_movable(assign, use, scope, stores, parents) for use in uses):
            found.append((assign, uses))
    return found


def _movable(assign: ast.Assign, use: ast.Name, scope: ast.AST, stores: dict[str, list],
             parents: dict[int, ast.AST]) -> bool:
    """Can ``assign``'s value move to ``use`` and mean the same there?"""
    if (use.lineno, use.col_offset) <= (assign.end_lineno, assign.end_col_offset):
        return False  # read before it is bound (a loop), or in its own value
    pure = isinstance(assign.value, ast.Name | ast.Constant) or _is_constant(assign.value)
    after, before = (assign.end_lineno, assign.end_col_offset), (use.lineno, use.col_offset)
    if pure:  # a name moved into a loop must not be bound again anywhere after it
        before = (10 ** 9, 0)
    if any(after < (s.lineno, s.col_offset) < before
           for r in _reads(assign.value) for s in stores.get(r, ()) if hasattr(s, "lineno")):
        return False  # a name its value reads is bound again before the read
    chain = _ancestors(use, parents)
    outer = _ancestors(assign, parents)
    if parents.get(id(assign)) not in chain:
        return False  # out of its block (a loop, a with, a try, an if): it may run another number of times
    if any(isinstance(n, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp)
           and _bound(n) & _reads(assign.value) for n in chain[:chain.index(scope)]):
        return False  # a comprehension or lambda around the read binds a name the value reads
    if not pure and any(_repeats(n, use) and not any(a is n for a in outer)
                        for n in chain[:chain.index(scope)]):
        return False  # the value would be computed at every turn of a loop
    return True


def _scopes(tree: ast.Module) -> list[ast.AST]:
    return [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]


def _repeats(node: ast.AST, use: ast.AST) -> bool:
    """Does ``use``, inside ``node``, run more than once per run of ``node`` (a loop's body or
    test, a comprehension past its first iterable)?"""
    if not isinstance(node, LOOPS):
        return False
    first = node.iter if isinstance(node, ast.For | ast.AsyncFor) else \
        node.generators[0].iter if not isinstance(node, ast.While) else None
    return first is None or not any(n is use for n in ast.walk(first))


def _split_tuples(tree: ast.Module) -> bool:
    """``a, b = x, y`` -> ``a = x`` and ``b = y`` where that means the same (no value reads a
    target); True if any was split."""
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    for node in list(ast.walk(tree)):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple) \
                and len(node.targets[0].elts) == len(node.value.elts) \
                and all(isinstance(t, ast.Name) for t in node.targets[0].elts) \
                and not any(isinstance(v, ast.Starred) for v in node.value.elts) \
                and not {t.id for t in node.targets[0].elts} & _reads(node.value):
            container, field, index = _position(node, parents)
            getattr(container, field)[index:index + 1] = [
                ast.Assign([t], v) for t, v in zip(node.targets[0].elts, node.value.elts, strict=True)]
            return True
    return False


def _split_versions(tree: ast.Module) -> bool:
    """A variable of a function assigned several times in one block (``x = a(x)``, then
    ``x = b(x)``) renamed at each assignment after the first (``x_2 = b(x)``) and at the reads
    of that value: each version is then bound once and can move like any other. Only when every
    binding is a plain assignment in that block (a parameter may be the first), and every read
    is in that block after a binding (or reads the parameter outside a loop); True if any was
    renamed."""
    taken = _names(tree) | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for scope in ast.walk(tree):
        if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        own, nested = _own(scope)
        params = {a.arg for a in ast.walk(scope.args) if isinstance(a, ast.arg)}
        closed = {r for n in nested for r in _free_reads(n) | _reads(n)} | \
            {g for n in [*own, *(x for m in nested for x in ast.walk(m))]  # a nested nonlocal writes it
             if isinstance(n, ast.Global | ast.Nonlocal) for g in n.names}
        parents = {id(c): p for p in ast.walk(scope) for c in ast.iter_child_nodes(p)}
        names: dict[str, list[ast.Name]] = {}
        other_bindings = set()
        for n in own:
            if isinstance(n, ast.Name):
                names.setdefault(n.id, []).append(n)
            elif isinstance(n, ast.Import | ast.ImportFrom):
                other_bindings |= {(a.asname or a.name).split(".")[0] for a in n.names}
            elif isinstance(n, ast.ExceptHandler) and n.name:
                other_bindings.add(n.name)
        other_bindings |= {n.name for n in nested if not isinstance(n, ast.Lambda)} | _captured(own)
        for name, nodes in names.items():
            if name in closed | other_bindings:
                continue
            nodes.sort(key=lambda n: (n.lineno, n.col_offset))
            stores = [n for n in nodes if not isinstance(n.ctx, ast.Load)]
            assigns = [parents.get(id(n)) for n in stores]
            plain = all(isinstance(a, ast.Assign) and a.targets == [n]
                        for a, n in zip(assigns, stores, strict=True))
            if len(stores) < 2 - (name in params) or not plain:
                continue
            block, field, _ = _position(assigns[0], parents)
            body = getattr(block, field)
            if not all(_position(a, parents)[:2] == (block, field) for a in assigns):
                continue
            looped = any(isinstance(n, LOOPS) for n in _ancestors(assigns[0], parents))
            at = [next(i for i, st in enumerate(body) if st is a) for a in assigns]
            plan: list[tuple[ast.Name, int]] = []
            for load in (n for n in nodes if isinstance(n.ctx, ast.Load)):
                top = next((s for s in [load, *_ancestors(load, parents)] if any(s is b for b in body)), None)
                if top is None:
                    plan = None
                    break
                j = next(i for i, st in enumerate(body) if st is top)
                version = max((k for k, i in enumerate(at) if i < j), default=None)
                if version is None and (name not in params or looped):
                    plan = None
                    break
                plan.append((load, -1 if version is None else version))
            if plan is None:
                continue
            first = 0 if name not in params else -1  # the version that keeps the name
            renamed = {}
            for k in range(len(stores)):
                if k == first:
                    continue
                new = next(f"{name}_{i}" for i in range(2, 1000) if f"{name}_{i}" not in taken)
                taken.add(new)
                renamed[k] = new
            if not renamed:
                continue
            for k, new in renamed.items():
                stores[k].id = new
            for load, version in plan:
                if version in renamed:
                    load.id = renamed[version]
            return True
    return False


def _appended(stmt: ast.stmt, name: str) -> list[ast.expr] | None:
    """The items ``stmt`` adds to the list ``name`` (``name.append(v)``, ``name.extend([...])``,
    ``name += [...]``), if it does only that and they do not read ``name``; else None."""
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add) \
            and isinstance(stmt.target, ast.Name) and stmt.target.id == name \
            and isinstance(stmt.value, ast.List):
        items = stmt.value.elts
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
            and isinstance(stmt.value.func, ast.Attribute) and isinstance(stmt.value.func.value, ast.Name) \
            and stmt.value.func.value.id == name and len(stmt.value.args) == 1 and not stmt.value.keywords \
            and not isinstance(stmt.value.args[0], ast.Starred) \
            and (stmt.value.func.attr == "append"
                 or (stmt.value.func.attr == "extend" and isinstance(stmt.value.args[0], ast.List))):
        arg = stmt.value.args[0]
        items = [arg] if stmt.value.func.attr == "append" else arg.elts
    else:
        return None
    return None if any(name in _names(i) for i in items) else items


def _merge_appends(tree: ast.Module) -> bool:
    """``x = [a]`` followed by ``x.append(b)``, ``x.extend([b])`` or ``x += [b]`` -> ``x = [a, b]``;
    True if any was merged."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            for i, stmt in enumerate(body[:-1]):
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                        and isinstance(stmt.targets[0], ast.Name) and isinstance(stmt.value, ast.List):
                    items = _appended(body[i + 1], stmt.targets[0].id)
                    if items is not None:
                        stmt.value.elts += items
                        del body[i + 1]
                        return True
    return False


def _fold_literal_subscript(node: ast.AST, parents: dict[int, ast.AST]) -> None:
    """``{"k": v, ...}["k"]`` (a dict literal just moved into a subscript) -> ``v``."""
    holder = parents.get(id(node))
    if isinstance(node, ast.Dict) and isinstance(holder, ast.Subscript) and holder.value is node \
            and isinstance(holder.ctx, ast.Load) and isinstance(holder.slice, ast.Constant) \
            and all(isinstance(k, ast.Constant) for k in node.keys):
        values = [v for k, v in zip(node.keys, node.values, strict=True) if k.value == holder.slice.value]
        if values:
            _replace_child(parents[id(holder)], holder, values[-1])


def inline_variables(files: dict[str, str | None], only: tuple[str, str] | None = None,
                     ) -> dict[str, str | None]:
    """The files with each variable that is bound by one plain assignment and read once moved
    into that read (``x = build(); f(x)`` -> ``f(build())``), a number or a string written at
    every read of a variable bound to it once (``h = 32``), and without those never read
    whose value does nothing (no call, attribute or subscript); only ``(file, name)`` if given.
    First ``a, b = x, y`` is split, and ``x = [...]`` followed by ``x.append(v)``,
    ``x.extend([...])`` or ``x += [...]`` merged.
    Not when the read is inside a loop the assignment is outside of (unless the value is a
    name or a constant), nor when a name the value reads is bound again in between."""
    out = dict(files)
    for file, source in files.items():
        if not source or (only and only[0] != file):
            continue
        others = set()  # module names other files import or read as attributes
        for other, src in files.items():
            if src and other != file:
                others |= {n.attr for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Attribute)}
                others |= {a.asname or a.name for n in ast.walk(ast.parse(src))
                           if isinstance(n, ast.ImportFrom) for a in n.names}
        changed, refused, shaped = True, set(), False
        while changed:
            changed = False
            tree = ast.parse(out[file])
            if not only and not shaped and (_split_tuples(tree) or _merge_appends(tree)
                                            or _split_versions(tree)):
                written = _unparsed({file: out[file]}, {file: tree})
                if written:
                    out[file], changed = written[file], True
                else:
                    shaped, changed = True, True  # leave the shapes as they are
                continue
            parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
            for scope in _scopes(tree):
                outside = others if scope is tree else set()
                for assign, uses in _single_use(tree, scope, parents, outside):
                    name = assign.targets[0].id
                    if (only and name != only[1]) or (getattr(scope, "lineno", 0), name) in refused:
                        continue
                    for use in uses:
                        value = copy.deepcopy(assign.value) if len(uses) > 1 else assign.value
                        _replace_child(parents[id(use)], use, value)
                        parents[id(value)] = parents[id(use)]
                        _fold_literal_subscript(value, parents)
                    container, field, index = _position(assign, parents)
                    del getattr(container, field)[index]
                    if not getattr(container, field) and (
                            field == "body" or (field == "finalbody" and not container.handlers)):
                        getattr(container, field).append(ast.Pass())
                    changed = True
                    break
                if changed:
                    break
            if changed:
                written = _unparsed({file: out[file]}, {file: tree})
                if written:
                    out[file] = written[file]
                else:  # no program (a backslash moved into an f-string): that one stays
                    refused.add((getattr(scope, "lineno", 0), name))  # same source: same lines
    return out


def single_use_variables(files: dict[str, str | None]) -> list[tuple[str, str]]:
    """(file, name) of every variable ``inline_variables`` would move."""
    found = []
    for file, source in files.items():
        if not source:
            continue
        tree = ast.parse(source)
        parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        for scope in _scopes(tree):
            found += [(file, a.targets[0].id) for a, _ in _single_use(tree, scope, parents, set())]
    return found


# -- a sub-module class built once, flattened into its owner --------------------------------

def _self_attrs(func: ast.FunctionDef) -> tuple[set[str], bool]:
    """The attributes ``func`` stores on its first parameter, and whether every use of that
    parameter is ``self.attr`` (no ``self`` passed on, no ``self.method()`` of a base class)."""
    me = func.args.args[0].arg
    parents = {id(c): p for p in ast.walk(func) for c in ast.iter_child_nodes(p)}
    stored, plain = set(), True
    for n in ast.walk(func):
        if isinstance(n, ast.Name) and n.id == me and n is not func.args.args[0]:
            holder = parents.get(id(n))
            if not isinstance(holder, ast.Attribute):
                plain = False
            elif isinstance(holder.ctx, ast.Store):
                stored.add(holder.attr)
    return stored, plain


def flatten_submodule(files: dict[str, str | None], name: str) -> dict[str, str | None] | None:
    """The files with class ``name`` (say ``Head``: an ``__init__`` and a ``forward``, the
    ``nn.Module`` shape) built once as ``self.head = Head(...)`` in a method of another class,
    flattened into that class: its ``__init__`` body in place of the assignment (its
    attributes renamed ``head_<attr>``), its ``forward`` a method ``head_forward`` of the owner,
    called where ``self.head(...)`` was. None when that cannot be done safely: the class does
    anything else (other methods, ``self`` passed on, a base-class method called), or its
    attribute is read other than as a call."""
    trees = {n: ast.parse(s) for n, s in files.items() if s}
    found = [(f, n) for f, t in trees.items() for n in t.body
             if isinstance(n, ast.ClassDef) and n.name == name]
    if len(found) != 1:
        return None
    file, cls = found[0]
    tree = trees[file]
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    rest = [n for n in cls.body if not isinstance(n, ast.FunctionDef)
            and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    if cls.decorator_list or cls.keywords or rest or set(methods) != {"__init__", "forward"}:
        return None
    init, forward = methods["__init__"], methods["forward"]
    if any(m.decorator_list or not m.args.args or m.args.vararg or m.args.kwarg or m.args.kwonlyargs
           or m.args.posonlyargs for m in (init, forward)):
        return None
    body = _plain_body(init)
    if not body or _returns(init):
        return None
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Call) and \
            isinstance(first.value.func, ast.Attribute) and first.value.func.attr == "__init__" \
            and not first.value.args and not first.value.keywords:
        body = body[1:]  # super().__init__(): the owner has made its own
    if any(isinstance(n, ast.Name) and n.id in ("super", "__class__")
           for part in [*body, forward] for n in ast.walk(part)):
        return None  # the base class's own code is used: not ours to flatten
    attrs, plain = _self_attrs(init)
    used, plain_forward = _self_attrs(forward)
    reads = {n.attr for m in (init, forward) for n in ast.walk(m) if isinstance(n, ast.Attribute)
             and isinstance(n.value, ast.Name) and n.value.id == m.args.args[0].arg}
    if not (plain and plain_forward) or used or not reads <= attrs:
        return None  # forward stores attributes, or one reads what __init__ did not set (a base's)
    uses = [n for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.Name) and n.id == name]
    parents = {id(c): p for t in trees.values() for p in ast.walk(t) for c in ast.iter_child_nodes(p)}
    if len(uses) != 1 or uses[0] not in list(ast.walk(tree)):
        return None
    call = parents.get(id(uses[0]))
    assign = parents.get(id(call))
    if not (isinstance(call, ast.Call) and call.func is uses[0] and isinstance(assign, ast.Assign)
            and assign.value is call and len(assign.targets) == 1
            and isinstance(assign.targets[0], ast.Attribute)
            and isinstance(assign.targets[0].value, ast.Name)):
        return None
    chain = _ancestors(assign, parents)
    method = next((n for n in chain if isinstance(n, ast.FunctionDef)), None)
    owner = parents.get(id(method)) if method else None
    me, attr = assign.targets[0].value.id, assign.targets[0].attr
    if not (isinstance(owner, ast.ClassDef) and method.args.args and method.args.args[0].arg == me
            and parents.get(id(assign)) is method):
        return None
    # every other use of the attribute in the owner: self.attr(...) calls
    refs = [n for n in ast.walk(owner)
            if isinstance(n, ast.Attribute) and n.attr == attr and n is not assign.targets[0]]
    if any(not (isinstance(r.value, ast.Name) and isinstance(parents.get(id(r)), ast.Call)
                and parents[id(r)].func is r) for r in refs):
        return None
    if any(isinstance(n, ast.Attribute) and n.attr == attr for t in trees.values() for n in ast.walk(t)
           if not any(n is r for r in refs) and n is not assign.targets[0]):
        return None
    new_names = {f"{attr}_{a}" for a in attrs} | {f"{attr}_forward"}
    taken = {n.attr for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.Attribute)} | \
        {n.name for n in owner.body if isinstance(n, ast.FunctionDef)}
    if new_names & taken:
        return None
    # __init__'s body in place of the assignment, as ``inline`` does with a call's statement
    params = [a.arg for a in init.args.args[1:]]
    values: dict[str, ast.expr] = dict(zip(params, call.args, strict=False))
    if len(call.args) > len(params) or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    for k in call.keywords:
        if k.arg not in params or k.arg in values:
            return None
        values[k.arg] = k.value
    defaults = dict(zip(params[::-1], init.args.defaults[::-1], strict=False))
    for p in params:
        if p not in values:
            if not isinstance(defaults.get(p), ast.Constant):
                return None
            values[p] = defaults[p]
    inner = ast.Module(body=body, type_ignores=[])
    direct = {p: v for p, v in values.items()
              if isinstance(v, ast.Name | ast.Constant) and p not in _bound(inner)}
    own = (set(params) | _bound(inner)) - set(direct) - {init.args.args[0].arg}
    if own & _names(method) or (_reads(inner) - set(params) - _bound(inner) - {init.args.args[0].arg}) \
            & _bound(method):
        return None
    moved = [ast.Assign([ast.Name(p, ast.Store())], values[p]) for p in params if p not in direct]
    moved += [_substitute(_rename_self(copy.deepcopy(s), init.args.args[0].arg, me, attr), direct)
              for s in body]
    container, field, index = _position(assign, parents)
    getattr(container, field)[index:index + 1] = moved or [ast.Pass()]
    # forward as a method of the owner
    me_forward = forward.args.args[0].arg
    new_forward = _rename_self(copy.deepcopy(forward), me_forward, me_forward, attr)
    new_forward.name = f"{attr}_forward"
    owner.body.append(new_forward)
    for r in refs:
        r.attr = f"{attr}_forward"
    tree.body = [n for n in tree.body if n is not cls]
    return _unparsed(files, trees)


def _returns(func: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(func))


def _rename_self(node: ast.AST, old: str, new: str, prefix: str) -> ast.AST:
    """``old.attr`` -> ``new.<prefix>_attr`` everywhere in ``node``."""
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == old:
            n.value.id, n.attr = new, f"{prefix}_{n.attr}"
    return node


def flattenable(files: dict[str, str | None]) -> list[str]:
    """The classes ``flatten_submodule`` can flatten into their owner."""
    names = {n.name for s in files.values() if s for n in ast.parse(s).body if isinstance(n, ast.ClassDef)}
    return sorted(n for n in names if flatten_submodule(files, n) is not None)


# -- a Lightning data module used once, as plain data loaders -------------------------------

DATA_HOOKS = ("prepare_data", "setup", "train_dataloader", "val_dataloader")


def loaders_for_datamodule(files: dict[str, str | None], name: str) -> dict[str, str | None] | None:
    """The files with the ``LightningDataModule`` subclass ``name``, made once and passed to
    ``fit`` (``datamodule=data``, or ``fit(model, data)``), replaced by what Lightning would do
    with it: ``prepare_data``'s and ``setup``'s bodies run before (their attributes become
    module names: ``self.train_set`` -> ``train_set``, ``stage`` -> ``"fit"``) and
    ``train_dataloader``'s returned loader passed as ``train_dataloaders`` (``val_dataloader``'s,
    if it has one, as ``val_dataloaders``). Its hooks run once
    then, not at every ``fit``: the harness judges whether that matters. None when that cannot
    be done safely: the class has other methods or state, ``self`` is passed on, or a name
    would change meaning."""
    trees = {n: ast.parse(s) for n, s in files.items() if s}
    found = [(f, n) for f, t in trees.items() for n in t.body
             if isinstance(n, ast.ClassDef) and n.name == name]
    if len(found) != 1:
        return None
    file, cls = found[0]
    tree = trees[file]
    base = cls.bases[0] if len(cls.bases) == 1 else None
    if cls.decorator_list or cls.keywords or not (
            isinstance(base, ast.Name | ast.Attribute)
            and getattr(base, "id", getattr(base, "attr", "")) == "LightningDataModule"):
        return None
    methods: dict[str, ast.FunctionDef] = {}
    for node in cls.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if not isinstance(node, ast.FunctionDef) or node.decorator_list or node.name in methods:
            return None
        methods[node.name] = node
    init = methods.pop("__init__", None)
    if init is not None and not all(  # only ``super().__init__()`` (and its docstring)
            isinstance(s, ast.Expr) and (isinstance(s.value, ast.Constant) or (
                isinstance(s.value, ast.Call) and isinstance(s.value.func, ast.Attribute)
                and s.value.func.attr == "__init__")) for s in init.body):
        return None
    loader, val = methods.get("train_dataloader"), methods.get("val_dataloader")
    if not loader or not set(methods) <= set(DATA_HOOKS):
        return None
    loaders = [m for m in (loader, val) if m is not None]
    bodies = [_plain_body(m) for m in loaders]
    if not all(b and len(b) == 1 and isinstance(b[0], ast.Return) and b[0].value is not None for b in bodies):
        return None
    hooks = [methods[h] for h in DATA_HOOKS[:2] if h in methods]
    stored = set()
    moved: list[ast.stmt] = []
    if any(not m.args.args or any(isinstance(n, ast.Name) and n.id in ("super", "__class__")
                                  for n in ast.walk(m)) for m in [*hooks, *loaders]):
        return None  # a static hook, or one that calls its base's: not plain code to move
    for hook in hooks:
        inner = _plain_body(hook)
        returns = any(isinstance(n, ast.Return) for n in ast.walk(hook))
        if inner is None or len(hook.args.args) > 2 or returns \
                or {a.arg for a in hook.args.args[1:]} & _bound(ast.Module(body=inner, type_ignores=[])):
            return None  # (``stage`` bound again in it, or a lambda's own ``stage``)
        attrs, plain = _self_attrs(hook)
        if not plain:
            return None
        stored |= attrs
        values = {a.arg: ast.Constant("fit") for a in hook.args.args[1:]}
        moved += [_substitute(_unself(copy.deepcopy(s), hook.args.args[0].arg), values) for s in inner]
    for m in loaders:
        read, plain = _self_attrs(m)
        if not plain or read:  # a loader hook stores nothing
            return None
    wanted = {n.attr for h in [*hooks, *loaders] for n in ast.walk(h) if isinstance(n, ast.Attribute)
              and isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Name)
              and n.value.id == h.args.args[0].arg}
    if not wanted <= stored:
        return None  # it reads an attribute of Lightning's own (self.trainer, self.hparams)
    value, *rest = [_unself(copy.deepcopy(b[0].value), m.args.args[0].arg)
                    for m, b in zip(loaders, bodies, strict=True)]
    val_value = rest[0] if rest else None
    # the one use: ``Name(...)``, assigned to a module name or passed to fit directly
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    uses = [n for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.Name) and n.id == name]
    if len(uses) != 1 or uses[0] not in list(ast.walk(tree)):
        return None
    call = parents.get(id(uses[0]))
    if not (isinstance(call, ast.Call) and call.func is uses[0]):
        return None
    holder = parents.get(id(call))
    if isinstance(holder, ast.Assign) and holder in tree.body and len(holder.targets) == 1 \
            and isinstance(holder.targets[0], ast.Name):
        var, where = holder.targets[0].id, holder
        places = [n for n in ast.walk(tree)
                  if isinstance(n, ast.Name) and n.id == var and n is not holder.targets[0]]
    else:
        var, where, places = None, next(s for s in _ancestors(call, parents) if s in tree.body), [call]
    sites = []
    for place in places:
        outer = parents.get(id(place))
        if isinstance(outer, ast.keyword) and outer.arg == "datamodule":
            sites.append((outer, None))
        elif isinstance(outer, ast.Call) and len(outer.args) > 1 and outer.args[1] is place \
                and isinstance(outer.func, ast.Attribute) and outer.func.attr == "fit":
            sites.append((outer, 1))
        else:
            return None
    if not sites or any(isinstance(n, SCOPES) for p in places for n in _ancestors(p, parents)):
        return None  # passed elsewhere, or inside a function: its names would not be module names
    hoisted = ast.Module(body=moved, type_ignores=[])
    own = _bound(hoisted) | _bound(value) | (_bound(val_value) if val_value else set()) | stored
    elsewhere = set()  # the module names the rest of the program binds or reads
    for node in tree.body:
        if node is cls or (node is where and var is not None):
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            elsewhere |= {node.name} | _free_reads(node)
        else:
            elsewhere |= _names(node)
    if own & elsewhere or (var is not None and var in own):
        return None
    for site, index in sites:
        if index is None:
            site.arg, site.value = "train_dataloaders", copy.deepcopy(value)
        else:
            site.args[index] = copy.deepcopy(value)
        if val_value is not None:
            fit = parents[id(site)] if index is None else site
            if len(fit.args) > 2 or any(k.arg == "val_dataloaders" for k in fit.keywords):
                return None
            fit.keywords.append(ast.keyword("val_dataloaders", copy.deepcopy(val_value)))
    at = tree.body.index(where)
    tree.body[at:at + 1] = moved + ([] if var is not None else [where])
    tree.body = [s for s in tree.body if s is not cls]
    return _unparsed(files, trees)


def _unself(node: ast.AST, me: str) -> ast.AST:
    """``me.attr`` -> ``attr`` everywhere in ``node``."""
    class Unself(ast.NodeTransformer):
        def visit_Attribute(self, n):
            self.generic_visit(n)
            if isinstance(n.value, ast.Name) and n.value.id == me:
                return ast.copy_location(ast.Name(n.attr, n.ctx), n)
            return n
    return Unself().visit(node)


def datamodules(files: dict[str, str | None]) -> list[str]:
    """The data modules ``loaders_for_datamodule`` can replace."""
    names = {n.name for s in files.values() if s for n in ast.parse(s).body if isinstance(n, ast.ClassDef)}
    return sorted(n for n in names if loaders_for_datamodule(files, n) is not None)


# -- a module class that only wraps another ------------------------------------------------

def unwrap_module(files: dict[str, str | None], name: str) -> dict[str, str | None] | None:
    """The files with the class ``name`` (the ``nn.Module`` shape: ``__init__`` stores one
    attribute, ``forward`` returns it called on forward's own arguments), made once as
    ``name()``, replaced there by what it wraps (``Encoder()`` -> ``nn.Sequential(...)``):
    the owner keeps its attribute (``self.backbone``, which a callback may read), one level
    less deep. None when it does anything more, or a name would change meaning."""
    trees = {n: ast.parse(s) for n, s in files.items() if s}
    found = [(f, n) for f, t in trees.items() for n in t.body
             if isinstance(n, ast.ClassDef) and n.name == name]
    if len(found) != 1:
        return None
    file, cls = found[0]
    tree = trees[file]
    body = [n for n in cls.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    methods = {n.name: n for n in body if isinstance(n, ast.FunctionDef)}
    base = cls.bases[0] if len(cls.bases) == 1 else None
    if cls.decorator_list or cls.keywords or len(body) != 2 or set(methods) != {"__init__", "forward"} \
            or getattr(base, "attr", getattr(base, "id", None)) != "Module":
        return None  # a subclass of anything but nn.Module may get more from its base
    init, forward = methods["__init__"], methods["forward"]
    if any(m.decorator_list or m.args.vararg or m.args.kwarg or m.args.kwonlyargs or m.args.posonlyargs
           or m.args.defaults or not m.args.args for m in (init, forward)) or len(init.args.args) != 1:
        return None
    me = init.args.args[0].arg
    stmts = _plain_body(init) or []
    if stmts and isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Call) \
            and isinstance(stmts[0].value.func, ast.Attribute) and stmts[0].value.func.attr == "__init__":
        stmts = stmts[1:]  # super().__init__()
    if len(stmts) != 1 or not isinstance(stmts[0], ast.Assign) or len(stmts[0].targets) != 1:
        return None
    target, value = stmts[0].targets[0], stmts[0].value
    if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
            and target.value.id == me):
        return None
    if me in _reads(value) or any(isinstance(n, ast.Name) and n.id in ("super", "__class__")
                                  for n in ast.walk(value)):
        return None
    fme, fparams = forward.args.args[0].arg, [a.arg for a in forward.args.args[1:]]
    ret = forward.body[-1] if len(_plain_body(forward) or []) == 1 else None
    call = ret.value if isinstance(ret, ast.Return) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr == target.attr and isinstance(call.func.value, ast.Name)
            and call.func.value.id == fme and not call.keywords
            and [getattr(a, "id", None) for a in call.args] == fparams):
        return None
    uses = [n for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.Name) and n.id == name]
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    if len(uses) != 1 or uses[0] not in list(ast.walk(tree)) or any(
            isinstance(n, ast.Constant) and n.value == name for t in trees.values() for n in ast.walk(t)):
        return None
    made = parents.get(id(uses[0]))
    if not (isinstance(made, ast.Call) and made.func is uses[0] and not made.args and not made.keywords):
        return None
    local = set()
    for node in _ancestors(made, parents):  # what the places around the call bind
        if isinstance(node, SCOPES + (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            local |= _bound(node) - ({node.name} if hasattr(node, "name") else set())
    if _reads(value) & local:
        return None
    _replace_child(parents[id(made)], made, copy.deepcopy(value))
    tree.body = [n for n in tree.body if n is not cls]
    return _unparsed(files, trees)


def wrappers(files: dict[str, str | None]) -> list[str]:
    """The classes ``unwrap_module`` can replace by what they wrap."""
    names = {n.name for s in files.values() if s for n in ast.parse(s).body if isinstance(n, ast.ClassDef)}
    return sorted(n for n in names if unwrap_module(files, n) is not None)
