"""A report's snippet made runnable by mechanical completion, shown as a diff.

Real reports paste code that uses ``LightningModule``, ``Trainer`` or a callback without
importing them, define a ``LightningModule`` and never train it, or say "use any model". The
completion (each change an assumption, listed for the comment):

- a name the snippet uses but never binds is imported from where the installed release exports
  it: the package the report uses (``lightning.pytorch`` or ``pytorch_lightning``, its
  callbacks, loggers, strategies, the bug-report model's demos), then torch's. The exports are
  read from the release itself (``exports``: its modules' public names, in its environment), not
  from a hand-kept list; only the conventional aliases (``pl``, ``L``, ``nn``, ``F``, ``np``) and
  the standard library's modules are known by name;
- a model it trains but never makes (``trainer.fit(model)`` with ``model`` unbound, "use any
  model") becomes the demos' ``BoringModel``, a data module the same way ``BoringDataModule``;
- a ``LightningModule`` it defines but never trains gets a short ``fit`` in the shape of
  Lightning's bug-report model (one epoch, two batches, the demos' random data when the module
  has no ``train_dataloader``).

What cannot be completed is said (``Completion.missing``): a name nothing exports, a file the
snippet reads, no module to train.
"""

from __future__ import annotations

import ast
import difflib
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tools.environments import envs
from tools.triage import read, runs
from tools.triage.progress import progress

# the modules whose public names a free name may come from, in this order ({root}: the package)
MODULES = ("{root}", "{root}.callbacks", "{root}.loggers", "{root}.strategies", "{root}.profilers",
           "{root}.demos.boring_classes", "{root}.utilities", "torch", "torch.nn", "torch.utils.data",
           "torch.optim", "torch.optim.lr_scheduler", "torch.distributed")
ROOTS = {"lightning": "lightning.pytorch", "pytorch-lightning": "pytorch_lightning"}
MODELS = ("model", "net", "lit_model", "module", "lightning_module", "pl_module")
DATA_MODULES = ("datamodule", "dm", "data_module")
# the reading of its exports, run with the release's own interpreter
# (a name several modules offer goes to the one its object lives under: DataLoader is torch's
# torch.utils.data, though the demos import it too)
LISTER = """
import importlib, json, sys
found = {}
for name in json.loads(sys.argv[1]):
    try:
        module = importlib.import_module(name)
    except Exception:
        continue
    for attr in getattr(module, "__all__", None) or [a for a in dir(module) if not a.startswith("_")]:
        home = getattr(getattr(module, attr, None), "__module__", None) or ""
        found.setdefault(attr, []).append((name, home == name or home.startswith(name + ".")))
print(json.dumps({a: next((m for m, own in c if own), c[0][0]) for a, c in found.items()}))
"""


def exports(python: Path | str, package: str) -> dict[str, str]:
    """Public name -> the first module of ``MODULES`` that exports it, in the environment of
    ``python`` (the release the snippet will run on)."""
    root = ROOTS[package]
    names = [m.format(root=root) for m in MODULES]
    proc = subprocess.run([str(python), "-c", LISTER, json.dumps(names)], capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        return {}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}


@dataclass
class Completion:
    code: str
    changes: list[str] = field(default_factory=list)  # what was added, for the comment
    missing: list[str] = field(default_factory=list)  # what could not be, for the questions
    diff: str = ""
    stand_ins: list[str] = field(default_factory=list)  # what the demos stand in for (model, data)


def guess_package(code: str, text: str) -> str:
    """The Lightning package a snippet uses: what it imports; else ``L.`` or a mention of
    ``lightning.pytorch`` / ``import lightning`` in the report means the unified package; else
    ``pytorch_lightning``, the package the bug form's environment section names first."""
    import re

    if re.search(r"^\s*(?:import|from)\s+lightning\b", code, re.M) or re.search(r"\bL\.\w", code) \
            or re.search(r"\blightning\.pytorch\b|\bimport lightning\b", text):
        return "lightning"
    return "pytorch-lightning"


def aliases(package: str) -> dict[str, str]:
    root = ROOTS[package]
    return {"pl": f"import {root} as pl", "L": f"import {root.split('.')[0]} as L", "torch": "import torch",
            "nn": "from torch import nn", "F": "import torch.nn.functional as F", "np": "import numpy as np",
            "optim": "from torch import optim", "dist": "import torch.distributed as dist"}


def free_names(tree: ast.AST) -> list[str]:
    """Names the code reads and binds nowhere (nor as a builtin), in order of first use."""
    from tools.minimize.source import unbound_names

    free = unbound_names(ast.unparse(tree))
    first: dict[str, tuple[int, int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in free:
            first[node.id] = min(first.get(node.id, (1 << 30, 0)), (node.lineno, node.col_offset))
    return sorted(first, key=first.get)


def _lightning_modules(tree: ast.Module) -> list[ast.ClassDef]:
    """Classes deriving from a LightningModule (by that name, however imported)."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if name == "LightningModule":
                    found.append(node)
    return found


def _calls(tree: ast.AST, *names: str) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")) in names:
                return True
    return False


def _needs_arguments(cls: ast.ClassDef) -> bool:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            args = node.args
            return len(args.args) - 1 > len(args.defaults) or any(
                d is None for d in args.kw_defaults)
    return False


def complete(code: str, package: str, api: dict[str, str]) -> Completion:
    """``code`` made runnable as far as mechanical completion goes (see the module docstring).
    ``api``: ``exports`` of the release it will run on."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return Completion(code)
    root = ROOTS[package]
    demos = f"{root}.demos.boring_classes"
    conventional = aliases(package)
    imports, prelude, changes, missing, stand_ins = [], [], [], [], []
    free = free_names(tree)
    for name in free:
        if name in MODELS and not _lightning_modules(tree):
            imports.append(f"from {demos} import BoringModel")
            prelude.append(f"{name} = BoringModel()")
            changes.append(f"`{name}` is never made: the demos' BoringModel")
            stand_ins.append(f"`{name}`")
        elif name in DATA_MODULES:
            imports.append(f"from {demos} import BoringDataModule")
            prelude.append(f"{name} = BoringDataModule()")
            changes.append(f"`{name}` is never made: the demos' BoringDataModule")
            stand_ins.append(f"`{name}`")
        elif name in conventional:
            imports.append(conventional[name])
            changes.append(f"`{conventional[name]}`")
        elif name in api and (not api[name].startswith("torch") or name[:1].isupper()):
            # (torch's lower-case exports are everyday words: `device`, `seed`, `load`; a snippet
            # means its own variable, not them)
            imports.append(f"from {api[name]} import {name}")
            changes.append(f"`from {api[name]} import {name}`")
        elif name in sys.stdlib_module_names:
            imports.append(f"import {name}")
            changes.append(f"`import {name}`")
        else:
            missing.append(f"`{name}` is used but defined nowhere in the report")
    tail = []
    modules = _lightning_modules(tree)
    data_for = _fit_without_data(tree, modules)
    if data_for:
        imports += [f"from {demos} import RandomDataset", "from torch.utils.data import DataLoader"]
        changes.append(f"`fit` of `{data_for[0]}`, which has no data of its own: the demos' random data "
                       "(32 features, batches of 2)")
    if modules and not _calls(tree, "fit", "validate", "test", "predict", "Trainer"):
        cls = modules[-1]
        if _needs_arguments(cls):
            missing.append(f"`{cls.name}` needs arguments to be made; nothing trains it")
        else:
            if "Trainer" not in free:  # (a free Trainer is imported above)
                imports.append(f"from {api.get('Trainer', root)} import Trainer")
            data = ""
            if not any(isinstance(n, ast.FunctionDef) and n.name == "train_dataloader" for n in cls.body):
                imports += [f"from {demos} import RandomDataset", "from torch.utils.data import DataLoader"]
                data = ", train_dataloaders=DataLoader(RandomDataset(32, 64), batch_size=2)"
            tail = ["", "", 'if __name__ == "__main__":', f"    model = {cls.name}()",
                    "    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=2, "
                    "num_sanity_val_steps=0, logger=False, enable_checkpointing=False)",
                    f"    trainer.fit(model{data})"]
            changes.append(f"`{cls.name}` is defined and never trained: a one-epoch `fit` of it "
                           "(two batches" + (", the demos' random data" if data else "") + ")")
    if _reads_files(tree):
        missing += [f"it reads `{f}`, which the report does not include" for f in _reads_files(tree)]
    if not imports and not tail:
        return Completion(code, [], missing)
    if data_for:  # the call's closing parenthesis gets the data
        lines = code.splitlines(keepends=True)
        row, col = data_for[1]
        lines[row - 1] = (lines[row - 1][:col] + ", train_dataloaders=DataLoader(RandomDataset(32, 64), "
                          "batch_size=2)" + lines[row - 1][col:])
        code_used = "".join(lines)
    else:
        code_used = code
    seen, head = set(), []
    for line in imports:
        if line not in seen:
            seen.add(line)
            head.append(line)
    new = "\n".join([*head, "", *prelude, *([""] if prelude else []), code_used.rstrip("\n"), *tail]) + "\n"
    diff = "".join(difflib.unified_diff(code.splitlines(keepends=True), new.splitlines(keepends=True),
                                        "reported.py", "completed.py", n=1))
    return Completion(new, changes, missing, diff, stand_ins)


def _fit_without_data(tree: ast.AST, modules: list[ast.ClassDef]) -> tuple[str, tuple[int, int]] | None:
    """A ``fit(Module())`` (or of a name bound to one) with no data given, where ``Module`` is
    one of the snippet's modules without a ``train_dataloader``: (its name, where the call's
    closing parenthesis is: line and column of its last argument's end)."""
    dataless = {m.name for m in modules
                if not any(isinstance(n, ast.FunctionDef) and n.name == "train_dataloader" for n in m.body)}
    made = {t.id: v.func.id for n in ast.walk(tree) if isinstance(n, ast.Assign)
            for t in n.targets if isinstance(t, ast.Name)
            for v in [n.value] if isinstance(v, ast.Call) and isinstance(v.func, ast.Name)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "fit" and len(node.args) == 1 and not node.keywords):
            continue
        arg = node.args[0]
        cls = arg.func.id if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) else \
            made.get(arg.id) if isinstance(arg, ast.Name) else None
        if cls in dataless:
            return cls, (arg.end_lineno, arg.end_col_offset)
    return None


def _reads_files(tree: ast.AST) -> list[str]:
    """Relative paths the code opens or loads that a report cannot have carried."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            path = node.args[0].value
            if name in ("open", "read_csv", "load", "load_from_checkpoint", "read_parquet", "imread") \
                    and "/" not in path[:1] and "." in path and path not in found:
                found.append(path)
    return found

def completed_script(issue: read.Issue, text: str, t: dict) -> read.Script | None:
    """The report's Python snippets (joined in order) completed into a program
    (``tools/py``) against the newest release's exports: its imports, a model it
    never makes, a ``fit`` of a module it never trains. None when it still is not one; what is
    missing then goes in ``t["missing"]``."""
    from tools.stages import bisect_tiers

    def snippets(text: str) -> list[read.Block]:
        return [b for b in read.code_blocks(text) if b.lang in ("", "python", "py", "python3")
                and b.code.strip() and not read.is_traceback(b.code) and read.parses(b.code)
                and not read.is_output(b.code)]

    # the reporter's own code: the body's blocks, else one comment's (never a mix of people's)
    blocks = snippets(issue.body) or next((found for c in issue.comments if (found := snippets(c))), [])
    if not blocks:
        t["missing"] = ["the report holds no Python code" + (" (only a diff of a proposed change)" if any(
            b.lang in ("diff", "patch") for b in read.code_blocks(issue.body)) else "")]
        return None
    code = "\n\n".join(b.code for b in blocks) + "\n"
    package = guess_package(code, text)
    try:
        python = bisect_tiers.release_env(package, runs.newest_release(package), runs.NEWEST_TORCH, ())
    except envs.EnvError as err:
        t["missing"] = [f"the snippet could not be completed: no environment ({err})"]
        return None
    done = complete(code, package, exports(python, package))
    t["missing"] = done.missing
    if done.stand_ins and t.get("tracebacks"):  # the traceback came from the reporter's own model
        t["missing"] = done.missing + [f"the snippet does not make {', '.join(done.stand_ins)}, and the "
                                       "traceback came from the reporter's own: a stand-in would not "
                                       "be the reported run"]
        return None
    tree = ast.parse(done.code)
    if not ({"torch", "lightning", "pytorch_lightning"} & read.imports_of(tree) and read.builds(tree)):
        t["missing"] = done.missing + ["no `Trainer` or DDP model is built, and no `LightningModule` "
                                       "defined to train"]
        return None
    t.update(package=package, completion={"changes": done.changes, "diff": done.diff})
    progress("read", f"the snippet completed: {'; '.join(done.changes)}")
    return read.Script(done.code, [(b.line, len(b.code.splitlines())) for b in blocks])
