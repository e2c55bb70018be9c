"""The shape of ``tools/``: no import cycles, and one way down to a running process.

Every import between ``tools`` modules counts, at the top of a module or inside a function (a
function-level import that closes a cycle is a cycle all the same). And only the launcher and
the floors below it start a run: every other module describes a run (``launcher.Run``) and
hands it to a ``launcher.Launcher``.
"""

import ast
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent / "tools"
# a module, or a package of modules (``tools/triage/``): ``name`` or ``package.module``, its file
MODULES = {".".join(p.relative_to(TOOLS).with_suffix("").parts).removesuffix(".__init__"): p
           for p in TOOLS.rglob("*.py") if p.parent == TOOLS and p.stem != "__init__"
           or (p.parent / "__init__.py").is_file() and p.parent != TOOLS and p.stem != "__main__"}
# the launcher and what it stands on (tools/launch/, and the contract under it); stress runs the
# catalogue's forked workers inside its repro
LAUNCH_FLOORS = {name for name in MODULES if name.split(".")[0] in ("launch", "core")} | {"stages.stress"}
# the floors, from the bottom: a module imports only from its own folder and the folders below it;
# the programs in tools/ itself stand on all of them, and no floor imports a program
FLOORS = ["core", "launch", "environments", "stages", "series", "records"]
PROGRAMS = {"bisect_cli", "fingerprint", "findings", "minimize", "nodes", "pr_bundle", "run", "sessions",
            "triage", "validate_patches"}
STARTS_A_RUN = {("harness", "run"), ("harness", "run_forked"), ("nodes", "run_job"),
                ("slurm_jobs", "run"), ("preloaded", "Runner")}


def _unit(dotted: str) -> str | None:
    """``tools.triage.read`` -> ``triage.read``: the longest module of ``MODULES`` it names."""
    parts = dotted.split(".")[1:]
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts) or None


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tools":
            # ``from tools.triage import read``: the module read, else the package's names
            found |= {_unit(f"{node.module}.{a.name}") for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {_unit(a.name) for a in node.names if a.name.startswith("tools.")}
    this = next(name for name, p in MODULES.items() if p == path)
    return found - {this, None}


def test_no_import_cycle_among_the_tools_modules():
    graph = {name: imports(path) & set(MODULES) for name, path in MODULES.items()}
    cycles = []

    def walk(node, path):
        for dep in sorted(graph[node]):
            if dep == path[0]:
                cycles.append(" -> ".join([*path, dep]))
            elif dep not in path:
                walk(dep, [*path, dep])

    for name in sorted(graph):
        walk(name, [name])
    assert cycles == []


def test_only_the_launcher_and_its_floors_start_runs():
    offenders = []
    for name, path in MODULES.items():
        if name in LAUNCH_FLOORS:
            continue
        name = str(path.relative_to(TOOLS).with_suffix(""))
        tree = ast.parse(path.read_text())
        aliases = {a.asname or a.name: a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                   and n.module and n.module.startswith("tools") for a in n.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name):
                module = aliases.get(node.func.value.id, node.func.value.id)
                if (module, node.func.attr) in STARTS_A_RUN:
                    offenders.append(f"{name}.py:{node.lineno} {module}.{node.func.attr}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "Runner":
                offenders.append(f"{name}.py:{node.lineno} Runner")
    assert offenders == []


def test_the_multi_process_tests_run_one_at_a_time_and_the_slurm_waits_on_another_worker(tmp_path):
    # `nox -s tests` runs three pytest-xdist workers: every test marked ddp (SLURM ones included)
    # must go to one of them, every SLURM test that runs no DDP job to one other, and the plain
    # tests may go anywhere (tests/conftest.py groups them; pytest 9 broke that silently)
    import os
    import subprocess
    import sys

    own = str(TOOLS.parent / "tests" / "conftest.py")
    (tmp_path / "conftest.py").write_text(  # the workspace's own hooks, loaded under another name
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('ws_conftest', {own!r})\n"
        "ws = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(ws)\n"
        "pytest_itemcollected = ws.pytest_itemcollected\n"
        "pytest_collection_modifyitems = ws.pytest_collection_modifyitems\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    ddp: x\n    slurm: x\n")
    (tmp_path / "test_jobs.py").write_text(
        "import os, pathlib, pytest\n"
        f"def mark(name):\n    pathlib.Path({str(tmp_path)!r}, name)"
        ".write_text(os.environ['PYTEST_XDIST_WORKER'])\n"
        "@pytest.mark.ddp\n@pytest.mark.parametrize('i', range(4))\n"
        "def test_job(i):\n    mark(f'job{i}')\n"
        "@pytest.mark.ddp\n@pytest.mark.slurm\ndef test_slurm_job():\n    mark('job4')\n"
        "@pytest.mark.slurm\n@pytest.mark.parametrize('i', range(3))\n"
        "def test_wait(i):\n    mark(f'wait{i}')\n"
        "@pytest.mark.parametrize('i', range(6))\ndef test_other(i):\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "3", "--dist", "loadgroup",
                           "-p", "no:cacheprovider", str(tmp_path)], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = {(tmp_path / f"job{i}").read_text() for i in range(5)}
    waits = {(tmp_path / f"wait{i}").read_text() for i in range(3)}
    assert len(jobs) == 1 and len(waits) == 1 and jobs != waits, (jobs, waits)


MODULE_LINES = 600  # a module a newcomer can read in one sitting
FUNCTION_LINES = 90  # "about 80": past it, a function says in its docstring why it is one piece
ONE_PIECE = "One piece on purpose"


def test_no_module_or_function_is_too_long_to_read():
    long = []
    for name, path in MODULES.items():
        text = path.read_text()
        if len(text.splitlines()) > MODULE_LINES:
            long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = node.end_lineno - node.lineno + 1
                if size > FUNCTION_LINES and ONE_PIECE not in (ast.get_docstring(node) or ""):
                    long.append(f"{name}.{node.name}: {size} lines")
    assert long == []


def test_the_folders_are_the_floors_and_an_import_only_goes_down():
    upward = []
    for name, path in MODULES.items():
        folder = name.split(".")[0]
        mine = FLOORS.index(folder) if folder in FLOORS else len(FLOORS)  # a program: the top
        for dep in imports(path) & set(MODULES):
            theirs = dep.split(".")[0]
            level = FLOORS.index(theirs) if theirs in FLOORS else len(FLOORS)
            if level > mine:
                upward.append(f"{name} -> {dep}")
    assert upward == []


def test_every_module_of_tools_lives_on_a_floor_or_is_a_program():
    """A new module goes into the folder of its floor; only programs (``python -m tools.X``, the
    sessions' entry points) sit in tools/ itself."""
    programs = {p.stem for p in TOOLS.glob("*.py") if p.stem != "__init__"}
    programs |= {p.name for p in TOOLS.iterdir() if p.is_dir() and p.name not in FLOORS
                 and (p / "__init__.py").is_file()}
    assert programs <= PROGRAMS, programs - PROGRAMS
