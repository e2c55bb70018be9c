import importlib.util
import os
import shutil
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@pytest.fixture
def root() -> Path:
    return ROOT


def load_repro(name: str):
    """Import ``repro/<name>.py`` as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "repro" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# DDP tests that keep both cores busy for a minute or more: run last, once the single-process
# tests on the other workers are done (beside them they took a third longer)
BUSIEST_LAST = ("tests/test_minimize.py::test_a_real_bloated_ddp_program_shrinks_and_the_remedy_is_refused",
                "tests/test_equivalence.py::test_fast_and_fresh_process_modes_give_the_same_verdicts_on_the_multi")


def pytest_collection_modifyitems(config, items):
    # Integration tests run real two-rank jobs: keep them last and one at a time.
    def ddp(item):
        return item.get_closest_marker("ddp") is not None

    items.sort(key=lambda item: (ddp(item), ddp(item) and item.nodeid.startswith(BUSIEST_LAST)))


DDP_GROUP = "one-multi-process-job-at-a-time"
SLURM_GROUP = "slurm-waits"


def pytest_itemcollected(item):
    # With pytest-xdist (`nox -s tests` runs three workers) the multi-process tests all go to one
    # worker, one after the other. The SLURM tests that run no multi-process job (sleepers under a
    # killed controller, a killed submitter: mostly waiting) go to a second one, one after the
    # other; every SLURM test holds the cluster (a file lock: tests/test_slurm.py), so they never
    # overlap the SLURM tests of the first. The third, and the others when their group is done,
    # take the single-process tests. (Marked as each test is collected: pytest-xdist reads the
    # groups when the collection is modified.)
    if item.get_closest_marker("ddp"):
        item.add_marker(pytest.mark.xdist_group(DDP_GROUP))
    elif item.get_closest_marker("slurm"):
        item.add_marker(pytest.mark.xdist_group(SLURM_GROUP))


@pytest.fixture
def python() -> str:
    return sys.executable


NICE = 10  # of the workers that run the single-process tests


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # The multi-process chain, one job at a time on one worker, is the suite's long pole: the
    # other workers run their tests at nice 10, and so do their runs (harness.session_nice gives
    # the session each run leads the same niceness), so the chain's ranks get the cores first.
    # Only under pytest-xdist; before any fixture (a session's runner started now keeps it). A
    # DDP test goes back to nice 0 where that is allowed (root); elsewhere a worker that took a
    # single-process test first runs it slower, with the same verdicts.
    if not hasattr(item.config, "workerinput"):
        return
    want = 0 if item.get_closest_marker("ddp") else NICE
    if os.getpriority(os.PRIO_PROCESS, 0) != want:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, want)
        except PermissionError:  # lowering the niceness needs root
            pass


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    # results of tests never land in the user's results folder
    monkeypatch.setenv("REPRO_RESULTS", str(tmp_path_factory.getbasetemp() / "results"))


@pytest.fixture(scope="session")
def runner(tmp_path_factory):
    """One preloaded runner for the session's repro runs (tools/launch/preloaded.py): torch and
    Lightning are imported once, every run is a fork, judged by the harness as a fresh one.
    tests/test_equivalence.py shows it gives the verdicts of new interpreters."""
    from tools.launch.preloaded import Runner

    with Runner(sys.executable, stderr=tmp_path_factory.mktemp("runner") / "stderr") as r:
        yield r


def run_repro(runner, script: Path, *args: str, log_stem: Path, timeout: float = 240):
    """``python script args`` as a fork of the session's preloaded runner."""
    return runner.run({"argv": [str(script), *args], "timeout": timeout,
                       "log_stem": str(log_stem), "signature": None})


@pytest.fixture
def repro(runner, tmp_path):
    """``repro(name, *args)``: ``python repro/<name>.py args`` in the preloaded runner."""
    def run(name: str, *args: str):
        return run_repro(runner, ROOT / "repro" / f"{name}.py", *args, log_stem=tmp_path / "run")
    return run


def alive(pid: int) -> bool:
    """Is ``pid`` running (not gone, not a zombie)?"""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def patched_copy(folder: Path, applied: list) -> Path:
    """A copy of the installed pytorch_lightning with ``applied`` (patches of the series) patched
    in, to put first on PYTHONPATH (every DDP rank the launcher starts inherits it); the installed
    one is untouched."""
    from tools.series import patches

    site = Path(metadata.distribution("pytorch_lightning").locate_file(""))
    shutil.copytree(site / "pytorch_lightning", folder / "pytorch_lightning")
    root = folder / "pytorch_lightning"
    for p in applied:
        patches.apply(p, root, 4, patches.installable_for(p, root))
    return folder
