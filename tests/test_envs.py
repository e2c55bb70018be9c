"""Era-correct environments: the arguments, and a real resolution against the package index."""

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from packaging.version import Version

from tools.environments import envs, index


def fake_release(day, version="2.4.1"):
    return index.Release(Version(version), datetime.fromisoformat(f"{day}T12:00:00+00:00"), False,
                         None)


def fake_compile(monkeypatch, needs_newer: dict[str, str]):
    """uv's resolution, faked: sympy is torch's alone, typing-extensions both need; a package in
    ``needs_newer`` resolves only with a cutoff on or after that day (torch's lower bound)."""
    calls = []

    def compile_(args, annotate=False):
        calls.append(args)
        dates = dict(a.removeprefix("--exclude-newer-package=").split("=")
                     for a in args if a.startswith("--exclude-newer-package="))
        ok = all(dates.get(name, "") >= day for name, day in needs_newer.items())
        out = ("sympy==1.0\n    # via torch\ntorch==2.4.1\n    # via -r -\n"
               "typing-extensions==4.0\n    # via\n    #   pytorch-lightning\n    #   torch\n"
               "pytorch-lightning==2.4.0\n    # via -r -\n")
        return subprocess.CompletedProcess([], 0 if ok else 1, out, "" if ok else "unsatisfiable")

    monkeypatch.setattr(envs, "_compile", compile_)
    return calls


def test_install_args_pin_both_and_exempt_torch_closure(monkeypatch, tmp_path):
    dates = {"pytorch-lightning": "2024-08-07", "torch": "2024-09-04"}
    monkeypatch.setattr(index, "release", lambda name, version: fake_release(dates[name]))
    monkeypatch.setattr(envs, "CACHE", tmp_path)
    seen = {}

    def closure(version, earliest):
        seen["earliest"] = earliest
        return ["sympy", "torch", "typing-extensions"], "2024-09-05"

    monkeypatch.setattr(envs, "torch_closure", closure)
    fake_compile(monkeypatch, {})
    plan = envs.install_plan("pytorch-lightning", "2.4.0", "2.4.1")
    # typing-extensions is the release's need too: it keeps the release's date
    assert plan.args == ["torch==2.4.1", "pytorch-lightning==2.4.0", "setuptools",
                         "--exclude-newer=2024-08-08",
                         "--exclude-newer-package=sympy=2024-09-05",
                         "--exclude-newer-package=torch=2024-09-05",
                         "--exclude-newer-package=typing-extensions=2024-08-08"]
    assert plan.shared == {"typing-extensions": "2024-08-08"} and plan.by_torch_date == ["sympy"]
    assert seen["earliest"] == datetime(2024, 9, 4, 12, tzinfo=UTC)  # the later of the two dates
    monkeypatch.setattr(index, "release", lambda name, version: fake_release(dates[name], "2.1.2"))
    assert "numpy<2" in envs.install_args("pytorch-lightning", "2.3.3", "2.1.2")  # torch's ABI


def test_a_shared_dependency_takes_the_earliest_day_torch_accepts(monkeypatch, tmp_path):
    # as torch 2.13 needs setuptools >= 77.0.3 (2025-03-20) for a release of 2024
    monkeypatch.setattr(index, "release", lambda name, version: fake_release(
        {"pytorch-lightning": "2024-08-07", "torch": "2024-09-04"}[name]))
    monkeypatch.setattr(envs, "CACHE", tmp_path)
    monkeypatch.setattr(envs, "torch_closure", lambda v, e: (["sympy", "torch", "typing-extensions"],
                                                             "2024-09-05"))
    calls = fake_compile(monkeypatch, {"typing-extensions": "2024-08-20"})
    plan = envs.install_plan("pytorch-lightning", "2.4.0", "2.4.1")
    assert plan.shared == {"typing-extensions": "2024-08-20"}
    assert "--exclude-newer-package=typing-extensions=2024-08-20" in plan.args
    assert "as early as torch allows: typing-extensions as of 2024-08-20" in plan.describe()
    assert len(calls) <= 2 + 6  # a bisection of the 28 days, not a walk
    again = len(calls)
    assert envs.install_plan("pytorch-lightning", "2.4.0", "2.4.1") == plan and len(calls) == again
    # another release with the same torch starts from the day found: two compiles, not a dozen
    monkeypatch.setattr(index, "release", lambda name, version: fake_release(
        {"pytorch-lightning": "2024-08-01", "torch": "2024-09-04"}[name]))
    other = envs.install_plan("pytorch-lightning", "2.3.3", "2.4.1")
    assert other.shared == {"typing-extensions": "2024-08-20"} and len(calls) - again <= 2 + 2


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("release, torch", [("2.3.3", "2.13.0"), ("2.1.0", "2.1.0")])
def test_an_old_release_gets_a_setuptools_with_pkg_resources_whatever_the_torch(release, torch):
    # 2.3.3 and older import pkg_resources (setuptools < 82). With torch 2.13 the setuptools of
    # torch's own date (83) was taken; with torch 2.1 (no setuptools in its closure) none at all
    args = envs.install_args("pytorch-lightning", release, torch)
    reqs = [a for a in args if not a.startswith("--")]
    flags = [a for a in args if a.startswith("--")]
    proc = subprocess.run(["uv", "pip", "compile", "-", "--quiet", "--no-header", "--no-annotate",
                           "--python-version", "3.11", *flags],
                          input="\n".join(reqs) + "\n", capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    pins = dict(line.split("==") for line in proc.stdout.splitlines() if "==" in line)
    assert "setuptools" in pins and Version(pins["setuptools"]) < Version("82")
    assert pins["torch"].startswith(torch)


def test_unknown_version_is_a_clear_error():
    with pytest.raises(index.UnknownRelease, match="pytorch-lightning 9.9.9 is not on the package index"):
        index.release("pytorch-lightning", "9.9.9")
    with pytest.raises(index.UnknownRelease, match="is not a version"):
        index.release("pytorch-lightning", "two")


def test_release_dates_and_yanks_come_from_the_index():
    found = index.releases("pytorch-lightning")
    assert found[Version("2.4.0")].uploaded.date().isoformat().startswith("2024-08")
    assert list(found) == sorted(found)


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
@pytest.mark.timeout(300)
def test_pl_2_0_0_resolves_with_the_setuptools_of_its_time():
    # pytorch-lightning 1.9.5 .. 2.3.3 import pkg_resources, which setuptools 82 removed
    args = envs.install_args("pytorch-lightning", "2.0.0", "2.0.0")
    reqs = [a for a in args if not a.startswith("--")]
    flags = [a for a in args if a.startswith("--")]
    proc = subprocess.run(["uv", "pip", "compile", "-", "--quiet", "--no-header", "--no-annotate",
                           "--python-version", "3.11", *flags],
                          input="\n".join(reqs) + "\nsetuptools\n", capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    pins = dict(line.split("==") for line in proc.stdout.splitlines() if "==" in line)
    assert Version(pins["setuptools"]) < Version("82")
    assert Version(pins["torchmetrics"]) < Version("1.0")  # 2.0.0's own cap is <0.12
    assert pins["torch"].startswith("2.0.0")


def _uncompiled(python: str, modules: list[str]) -> list[str]:
    """Modules loaded by importing ``modules`` in ``python`` that had to be compiled from source."""
    code = (
        "import importlib, json, os, sys\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "loaded = [m for m in list(sys.modules.values()) if getattr(m, '__file__', None)\n"
        "          and str(m.__file__).endswith('.py') and isinstance(getattr(m, '__cached__', None), str)]\n"
        "print(json.dumps(sorted(m.__file__ for m in loaded if not os.path.exists(m.__cached__)\n"
        "                        or os.path.getmtime(m.__cached__) < os.path.getmtime(m.__file__))))\n"
        "print(len(loaded))\n"
        "print(sys.base_prefix)\n")
    proc = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    missing, loaded, base = proc.stdout.splitlines()
    assert int(loaded) > 10  # the check looked at real modules
    # the interpreter's own standard library is not the environment's business
    return [m for m in json.loads(missing) if not m.startswith(base.rstrip("/") + "/lib/")]


def test_the_test_environment_imports_torch_and_lightning_compiled():
    # made by `nox -s tests` like every environment of the workspace: with PYTHONDONTWRITEBYTECODE=1
    # (set on these machines) nothing would ever write these files at import time
    assert _uncompiled(sys.executable, ["torch", "pytorch_lightning"]) == []


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
@pytest.mark.timeout(300)
def test_environments_made_by_the_tools_are_compiled(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setattr(envs, "ENVS", tmp_path / "envs")
    python = envs.ensure("compiled-check", ["packaging"])
    assert _uncompiled(str(python), ["packaging"]) == []
    from tools.series import patched

    python = patched.throwaway(["packaging"], tmp_path / "throwaway")
    assert _uncompiled(str(python), ["packaging"]) == []


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
@pytest.mark.timeout(300)
def test_a_release_planned_two_ways_gets_two_environments_never_one_rebuilt(tmp_path, monkeypatch):
    """With and without a local torch wheel (UV_FIND_LINKS) one release's plan differs: the
    second plan must not clear the environment a run of the first may be using."""
    monkeypatch.setattr(envs, "ENVS", tmp_path / "envs")
    first = envs.ensure("one-release", ["packaging"])
    in_use = first.parent.parent / "in-use"
    in_use.write_text("a run's file")
    second = envs.ensure("one-release", ["packaging", "six"])
    assert second != first and in_use.read_text() == "a run's file"
    assert envs.ensure("one-release", ["packaging"]) == first
