"""Put on a run's ``PYTHONPATH`` by the workspace (never installed): Python imports it at start-up.

With ``WORKSPACE_LIGHTNING_SRC`` set to a Lightning checkout's ``src`` folder, every import name
of Lightning is that checkout's code, whatever the environment has installed:

- ``lightning`` is the checkout's package. Before 2.1 its ``__init__`` imports ``lightning.app``
  (whose dependencies a ``pytorch-lightning`` environment lacks): then the package is made
  without running that ``__init__``, with the version it declares;
- ``pytorch_lightning`` and ``lightning_fabric`` are the same modules as ``lightning.pytorch`` and
  ``lightning.fabric`` (one module object under two names, as the packages Lightning generates
  from one source are the same code): an installed ``pytorch_lightning`` wheel is never imported.

With ``WORKSPACE_CHECK_REPLICAS`` set, the replica check (``workspace_replicas``) hooks into
torch as soon as the run imports it (Lightning finds its callback by itself, through the
entry points next to this file).

Without either variable it does nothing. A ``sitecustomize`` the interpreter would otherwise have
found is run afterwards.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

_SRC = os.environ.get("WORKSPACE_LIGHTNING_SRC")
_ALIASES = {"pytorch_lightning": "lightning.pytorch", "lightning_fabric": "lightning.fabric"}


class _LightningSource(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, src: str):
        self.src = src
        self.specs = {}  # alias name -> the real module's spec, between create and exec
        init = os.path.join(src, "lightning", "__init__.py")
        with open(init, encoding="utf-8") as fh:
            self.bare = "lightning.app" in fh.read()  # an __init__ this environment cannot run

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in _ALIASES:
            real = importlib.util.find_spec(_ALIASES[top] + name[len(top):])
            if real is None:
                return None
            return importlib.util.spec_from_loader(
                name, self, is_package=real.submodule_search_locations is not None)
        if name == "lightning":
            if self.bare:
                spec = importlib.machinery.ModuleSpec(name, self, is_package=True)
                spec.submodule_search_locations = [os.path.join(self.src, "lightning")]
                return spec
            return importlib.machinery.PathFinder.find_spec(name, [self.src])
        return None

    def create_module(self, spec):
        top, _, rest = spec.name.partition(".")
        if top == "lightning":
            module = types.ModuleType("lightning")
            module.__path__ = list(spec.submodule_search_locations)
            with open(os.path.join(self.src, "version.info"), encoding="utf-8") as fh:
                module.__version__ = fh.readline().strip()
            return module
        real = importlib.import_module(_ALIASES[top] + (f".{rest}" if rest else ""))
        self.specs[spec.name] = real.__spec__
        return real

    def exec_module(self, module):
        own = self.specs.pop(module.__spec__.name, None)
        if own is not None:  # an alias: the module already ran under its real name; its spec back
            module.__spec__ = own


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Runs ``workspace_replicas.install_torch`` right after ``import torch`` completes (torch is
    not imported here: a run that never uses it pays nothing). It stays in place until torch is
    imported: a package that only asks where torch is (``importlib.util.find_spec``) does not
    use it up."""

    busy = False

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return spec
        run, finder = spec.loader.exec_module, self

        def exec_module(module):
            run(module)
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            import workspace_replicas

            workspace_replicas.install_torch(module)

        spec.loader.exec_module = exec_module
        return spec


def _install() -> None:
    if _SRC and not os.path.isdir(_SRC):  # never the installed release in its place, silently
        sys.stderr.write(f"cannot test: the Lightning source {_SRC} is not there (WORKSPACE_LIGHTNING_SRC)\n")
        sys.stderr.flush()
        os._exit(125)
    if _SRC and os.path.isdir(os.path.join(_SRC, "lightning")):
        sys.meta_path.insert(0, _LightningSource(_SRC))
    if os.environ.get("WORKSPACE_CHECK_REPLICAS"):
        sys.meta_path.insert(0, _AfterTorch())


def _chain() -> None:
    """Run the ``sitecustomize`` this one shadows, if the interpreter has another."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if entry and os.path.abspath(entry) != here:
            candidate = os.path.join(entry, "sitecustomize.py")
            if os.path.isfile(candidate):
                spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
                return


_install()
_chain()
