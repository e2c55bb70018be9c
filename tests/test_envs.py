"""Era-correct environments: the arguments, and a real resolution against the package index."""

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from packaging.version import Version

from tools import envs, index


def fake_release(day, version="2.4.1"):
    return index.Release(Version(version), datetime.fromisoformat(f"{day}T12:00:00+00:00"), False,
                         None)


def test_install_args_pin_both_and_exempt_torch_closure(monkeypatch):
    dates = {"pytorch-lightning": "2024-08-07", "torch": "2024-09-04"}
    monkeypatch.setattr(index, "release", lambda name, version: fake_release(dates[name]))
    seen = {}

    def closure(version, earliest):
        seen["earliest"] = earliest
        return ["sympy", "torch"], "2024-09-05"

    monkeypatch.setattr(envs, "torch_closure", closure)
    args = envs.install_args("pytorch-lightning", "2.4.0", "2.4.1")
    assert args == ["torch==2.4.1", "pytorch-lightning==2.4.0", "--exclude-newer=2024-08-08",
                    "--exclude-newer-package=sympy=2024-09-05",
                    "--exclude-newer-package=torch=2024-09-05"]
    assert seen["earliest"] == datetime(2024, 9, 4, 12, tzinfo=UTC)  # the later of the two dates
    monkeypatch.setattr(index, "release", lambda name, version: fake_release(dates[name], "2.1.2"))
    assert "numpy<2" in envs.install_args("pytorch-lightning", "2.3.3", "2.1.2")  # torch's ABI


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
    from tools import validate_patches

    python = validate_patches.throwaway(["packaging"], tmp_path / "throwaway")
    assert _uncompiled(str(python), ["packaging"]) == []
