"""Era-correct environments: the arguments, and a real resolution against the package index."""

import shutil
import subprocess
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
