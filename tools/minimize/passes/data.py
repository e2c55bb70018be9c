"""Data: a Lightning data module used once replaced by its data loaders (``loaders_for_datamodule``)."""

from __future__ import annotations

import ast
import copy

from tools.minimize.passes.syntax import (
    SCOPES,
    _ancestors,
    _bound,
    _free_reads,
    _names,
    _one_class,
    _plain_body,
    _self_attrs,
    _substitute,
    _unparsed,
)

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
    would change meaning.

    One piece on purpose, as every pass that edits in place (``tools.minimize.passes``)."""
    found = _one_class(files, name)
    if found is None:
        return None
    trees, file, cls, tree = found
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
