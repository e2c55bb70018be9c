"""Classes and modules: a sub-module class built once flattened into its owner
(``flatten_submodule``); a module class that only wraps another replaced by it (``unwrap_module``)."""

from __future__ import annotations

import ast
import copy

from tools.minimize.passes.syntax import (
    SCOPES,
    _ancestors,
    _bound,
    _names,
    _one_class,
    _plain_body,
    _position,
    _reads,
    _replace_child,
    _self_attrs,
    _substitute,
    _unparsed,
)


def flatten_submodule(files: dict[str, str | None], name: str) -> dict[str, str | None] | None:
    """The files with class ``name`` (say ``Head``: an ``__init__`` and a ``forward``, the
    ``nn.Module`` shape) built once as ``self.head = Head(...)`` in a method of another class,
    flattened into that class: its ``__init__`` body in place of the assignment (its
    attributes renamed ``head_<attr>``), its ``forward`` a method ``head_forward`` of the owner,
    called where ``self.head(...)`` was. None when that cannot be done safely: the class does
    anything else (other methods, ``self`` passed on, a base-class method called), or its
    attribute is read other than as a call.

    One piece on purpose, as every pass that edits in place (``tools.minimize.passes``)."""
    found = _one_class(files, name)
    if found is None:
        return None
    trees, file, cls, tree = found
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


# -- a module class that only wraps another ------------------------------------------------

def unwrap_module(files: dict[str, str | None], name: str) -> dict[str, str | None] | None:
    """The files with the class ``name`` (the ``nn.Module`` shape: ``__init__`` stores one
    attribute, ``forward`` returns it called on forward's own arguments), made once as
    ``name()``, replaced there by what it wraps (``Encoder()`` -> ``nn.Sequential(...)``):
    the owner keeps its attribute (``self.backbone``, which a callback may read), one level
    less deep. None when it does anything more, or a name would change meaning."""
    found = _one_class(files, name)
    if found is None:
        return None
    trees, file, cls, tree = found
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
