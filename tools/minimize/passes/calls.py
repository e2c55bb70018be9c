"""Calls made plain: a function or method with one caller pasted there (``inline``), unused
parameters dropped with their arguments, a literal every call passes bound into the function."""

from __future__ import annotations

import ast
import copy

from tools.minimize.passes.syntax import (
    SCOPES,
    _ancestors,
    _bound,
    _free_reads,
    _names,
    _plain_body,
    _position,
    _reads,
    _rename,
    _repeats,
    _replace_child,
    _substitute,
    _unparsed,
)

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
    ``obj.name(...)`` anywhere when it needs no class cell (``super()``, private names).

    One piece on purpose, as every pass that edits in place (``tools.minimize.passes``)."""
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
