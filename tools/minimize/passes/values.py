"""Value folding: a run records every constant-key subscript and attribute read; a read that
gave one plain value every time, in every process, is replaced by it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from tools.minimize.passes.syntax import _is_constant

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
