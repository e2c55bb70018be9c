"""Statements that do nothing for the bug: dead definitions (``drop_unused``) and no-op
statements (``drop_noops``)."""

from __future__ import annotations

import ast

from tools.minimize.passes.syntax import _OutsideKept

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
