"""Whole-program passes of ``nox -s minimize`` that one launch can check at once.

pysource-minimize removes one piece of syntax per test, and a DDP launch costs seconds, so two
kinds of change that a deletion reducer pays for piece by piece are proposed here in one
candidate each (the harness still judges each candidate: nothing is accepted unseen):

- **value folding**: a user's program reads most of its numbers and names through a config
  (``cfg["data"]["batch_size"]``, the hydra style). The program is run once with every
  subscript by a constant key recorded (``instrument``); a subscript that gave one and the same
  plain value (a number, a string, a bool, None, a short list or tuple of those) every time, in
  every process, is replaced by that value (``fold``). The config entries then become dead, and
  go with the next pass.
- **dead definitions**: module-level functions, classes, imports and assignments whose names
  nothing reads (``drop_unused``), repeated until none is left.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

RECORDER = "__minimize_value__"
SCALARS = (int, float, str, bool, type(None))
MAX_ITEMS = 8  # a list or tuple longer than this is not folded (it would only add lines)


def fold_sites(tree: ast.AST) -> list[ast.Subscript]:
    """Subscripts read with a constant key, in a fixed order (the record's ids)."""
    return [n for n in ast.walk(tree)
            if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load)
            and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str | int)]


def _prelude(sink: Path) -> list[ast.stmt]:
    code = f"""
def {RECORDER}(i, v, _seen={{}}, _path={str(sink)!r}):
    import json as _json
    try:
        text = repr(v)
        plain = __import__('ast').literal_eval(text) == v and type(v) in (int, float, str, bool,
                                                                        type(None), list, tuple)
    except Exception:
        text, plain = None, False
    key = text if plain else None
    if i in _seen and _seen[i] in (key, None):
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


def drop_unused_params(files: dict[str, str | None], only: str | None = None) -> dict[str, str | None]:
    """The files without the parameters a module-level function (or a class's ``__init__``)
    never reads, and without the arguments every call passes to them (all its uses must be
    direct calls by name, none with ``*`` or ``**``). A deletion reducer cannot do this: dropping
    the parameter alone, or one argument alone, makes a call that cannot bind. ``only``: that
    function or class alone."""
    trees = {n: ast.parse(s) for n, s in files.items() if s}
    parents = {id(c): p for t in trees.values() for p in ast.walk(t) for c in ast.iter_child_nodes(p)}
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
                defs.setdefault(node.name, []).append((node, node.args, 0))
            elif isinstance(node, ast.ClassDef):
                init = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
                defs.setdefault(node.name, []).append((init[0], init[0].args, 1) if init else None)
    changed = False
    for name, found in defs.items():
        if len(found) != 1 or found[0] is None or (only and name != only) or name in other:
            continue
        func, args, skip = found[0]
        if args.vararg or args.kwarg or args.posonlyargs:
            continue
        uses = [n for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.Name) and n.id == name
                and not isinstance(n.ctx, ast.Store)]
        calls = [parents.get(id(u)) for u in uses]
        if not all(isinstance(c, ast.Call) and c.func is u for c, u in zip(calls, uses, strict=True)):
            continue  # passed around or subclassed: its parameters are not ours to change
        if any(isinstance(a, ast.Starred) for c in calls for a in c.args) or \
                any(k.arg is None for c in calls for k in c.keywords):
            continue
        params = args.args[skip:]
        used = _reads(ast.Module(body=func.body, type_ignores=[])) | \
            {n for d in [*args.defaults, *args.kw_defaults] if d for n in _reads(d)}
        for i in range(len(params) - 1, -1, -1):
            param = params[i]
            if param.arg in used:
                continue
            first_default = len(args.args) - len(args.defaults)
            position = skip + i
            if position >= first_default:
                del args.defaults[position - first_default]
            del args.args[position]
            for call in calls:
                if len(call.args) > i:
                    del call.args[i]
                call.keywords = [k for k in call.keywords if k.arg != param.arg]
            changed = True
    if not changed:
        return files
    return {n: ast.unparse(trees[n]) if n in trees else s for n, s in files.items()}


def functions_with_unused_params(files: dict[str, str | None]) -> list[str]:
    """The names ``drop_unused_params`` would change, one by one."""
    names = {n.name for s in files.values() if s for n in ast.parse(s).body
             if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    return sorted(n for n in names if drop_unused_params(files, only=n) != files)
