"""What a literal makes plain, written plainly: conditions on constants, loops over literals
unrolled (``fold_literals``)."""

from __future__ import annotations

import ast
import operator

from tools.minimize.passes.syntax import LOOPS, SCOPES, _OutsideKept, _unparsed


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
