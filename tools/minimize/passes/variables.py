"""Variables read once moved into their read (``inline_variables``), tuples and version checks
split, appends merged."""

from __future__ import annotations

import ast
import copy

from tools.minimize.passes.syntax import (
    LOOPS,
    SCOPES,
    _ancestors,
    _bound,
    _captured,
    _free_reads,
    _is_constant,
    _names,
    _position,
    _reads,
    _repeats,
    _replace_child,
    _unparsed,
)


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
