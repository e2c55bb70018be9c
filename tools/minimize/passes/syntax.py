"""Syntax helpers the passes share (package-private): names read and bound, ancestors,
positions, substitution, and the transformer base that leaves kept statements alone."""

from __future__ import annotations

import ast
import copy


def _is_constant(node: ast.expr) -> bool:
    negative = isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
    return isinstance(node.operand if negative else node, ast.Constant)


# -- unused parameters ---------------------------------------------------------------------

def _reads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


class _OutsideKept(ast.NodeTransformer):
    """A transformer that leaves the statements marked to keep (by ``ast.dump``) as they are."""

    def __init__(self, kept: set[str]):
        self.kept = kept

    def visit(self, node):
        return node if isinstance(node, ast.stmt) and ast.dump(node) in self.kept else super().visit(node)


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


# -- variables read once -------------------------------------------------------------------

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _repeats(node: ast.AST, use: ast.AST) -> bool:
    """Does ``use``, inside ``node``, run more than once per run of ``node`` (a loop's body or
    test, a comprehension past its first iterable)?"""
    if not isinstance(node, LOOPS):
        return False
    first = node.iter if isinstance(node, ast.For | ast.AsyncFor) else \
        node.generators[0].iter if not isinstance(node, ast.While) else None
    return first is None or not any(n is use for n in ast.walk(first))


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


def _one_class(files: dict[str, str | None], name: str):
    """The parsed files, and the one top-level class ``name`` in them: ``(trees, file, class,
    its file's tree)``; None when no file, or more than one, defines it."""
    trees = {n: ast.parse(s) for n, s in files.items() if s}
    found = [(f, n) for f, t in trees.items() for n in t.body
             if isinstance(n, ast.ClassDef) and n.name == name]
    if len(found) != 1:
        return None
    file, cls = found[0]
    return trees, file, cls, trees[file]
