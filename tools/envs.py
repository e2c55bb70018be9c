"""Era-correct environments: Lightning's dependencies as of its release date, torch as the matrix says.

A cell installs ``torch==T`` and ``<package>==V`` with uv's ``--exclude-newer`` set to the day
after V's upload, so old releases get the setuptools, torchmetrics, ... of their time. torch and
its own dependency closure are exempt (``--exclude-newer-package``): they are resolved as of the
later of the two release dates, so the pinned torch is always installable.
Where torch comes from is uv's business: ``UV_INDEX``, ``UV_FIND_LINKS``, ... in the environment.

Every environment made here has its bytecode compiled at install (uv's ``UV_COMPILE_BYTECODE``):
machines and images that set ``PYTHONDONTWRITEBYTECODE=1`` would otherwise import torch and
Lightning from source on every run (about 2.7x slower to import).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from tools import index

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "closure"


COMPILED = {"UV_COMPILE_BYTECODE": "1"}  # what every ``uv pip install`` of the workspace adds


def uv_env() -> dict[str, str]:
    """The environment of a ``uv pip install`` run by the tools: bytecode compiled at install."""
    return {**os.environ, **COMPILED}


class EnvError(RuntimeError):
    """A cell's environment cannot be made (one line, for the user)."""


SLACK_DAYS = (0, 7, 30, 90, 365)  # torch's pinned dependencies sometimes came out days later


def _compile_torch(torch_version: str, cutoff: str) -> subprocess.CompletedProcess:
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    cmd = [index.uv(), "pip", "compile", "-", "--quiet", "--no-header", "--no-annotate",
           "--exclude-newer", cutoff, "--python-version", py]
    return subprocess.run(cmd, input=f"torch=={torch_version}\n", capture_output=True, text=True)


def torch_closure(torch_version: str, earliest: datetime) -> tuple[list[str], str]:
    """Names of torch's dependency closure (torch included) and the cutoff that resolves it.

    The cutoff is the first of ``earliest`` + 1 day, + 1 week, ... at which uv can install
    ``torch==T`` with everything it pins (triton 2.0.0 was uploaded 5 days after torch 2.0.0).
    """
    # where torch comes from changes its closure (a CPU wheel pins no nvidia-* packages)
    source = hashlib.sha256(repr(sorted((k, v) for k, v in os.environ.items()
                                       if k.startswith("UV_") and "INDEX" in k or k == "UV_FIND_LINKS")
                                 ).encode()).hexdigest()[:8]
    key = f"torch-{torch_version}-{earliest.date()}-py{sys.version_info[0]}{sys.version_info[1]}-{source}"
    path = CACHE / f"{key}.json"
    if path.exists():
        cached = json.loads(path.read_text())
        return cached["names"], cached["cutoff"]
    for slack in SLACK_DAYS:
        cutoff = index.day_after(earliest + timedelta(days=slack))
        proc = _compile_torch(torch_version, cutoff)
        if proc.returncode == 0:
            break
    else:
        last = (proc.stderr.strip().splitlines() or [""])[-1]
        raise EnvError(f"uv could not resolve torch=={torch_version}: {last}")
    names = sorted({Requirement(line.split(";")[0].strip()).name
                    for line in proc.stdout.splitlines() if line.strip() and not line.startswith("#")})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"names": names, "cutoff": cutoff}))
    os.replace(tmp, path)
    return names, cutoff


def install_args(package: str, version: str, torch_version: str) -> list[str]:
    """Arguments for ``uv pip install`` (nox's ``session.install``) of one era-correct cell."""
    return era_args([f"{package}=={version}"], torch_version, index.release(package, version).uploaded)


ENVS = Path(__file__).resolve().parent.parent / ".cache" / "envs"


def ensure(name: str, args: list[str], python: str = "3.11", log=None) -> Path:
    """A cached venv under ``.cache/envs/<name>`` with ``uv pip install <args>``; its python.

    Made once per name and argument list: a marker file holding their hash is written last, so
    a creation that was interrupted is simply made again.
    """
    digest = hashlib.sha256(json.dumps(["compiled", *args]).encode()).hexdigest()[:16]
    folder = ENVS / name
    marker = folder / ".made-with"
    if marker.exists() and marker.read_text() == digest:
        return folder / "bin" / "python"
    folder.parent.mkdir(parents=True, exist_ok=True)
    if log:
        log(f"  [env] making {name} (a torch not yet in uv's cache is downloaded first)")
    steps = [[index.uv(), "venv", "--quiet", "--clear", "--python", python, str(folder)],
             [index.uv(), "pip", "install", "--quiet", "--python", str(folder / "bin" / "python"), *args]]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=uv_env())
        if proc.returncode:
            last = (proc.stderr.strip().splitlines() or ["?"])[-1]
            raise EnvError(f"cannot make environment {name}: {last}")
    marker.write_text(digest)
    return folder / "bin" / "python"


def era_args(requirements: list[str], torch_version: str, moment: datetime) -> list[str]:
    """``uv pip install`` arguments for requirements as of ``moment`` with ``torch==T`` exempt."""
    torch = index.release("torch", torch_version)
    exempt, torch_era = torch_closure(torch_version, max(moment, torch.uploaded))
    # torch wheels before 2.3 were built against NumPy 1.x and cannot use NumPy 2 ("Numpy is not
    # available"): a fact of torch's builds, whatever the era of the other packages
    abi = ["numpy<2"] if torch.version < Version("2.3") else []
    return [f"torch=={torch_version}", *requirements, *abi,
            f"--exclude-newer={index.day_after(moment)}",
            *(f"--exclude-newer-package={name}={torch_era}" for name in exempt)]


def era_torch(moment: datetime, python: str = "3.11") -> str:
    """The newest torch release installable on ``python`` that was out at ``moment``."""
    out = [r for r in index.releases("torch").values()
           if r.uploaded <= moment and r.installable_on(python)]
    if not out:
        raise EnvError(f"no torch release for Python {python} before {moment.date()}")
    return str(max(out, key=lambda r: r.version).version)
