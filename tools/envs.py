"""Era-correct environments: Lightning's dependencies as of its release date, torch as the matrix says.

A cell installs ``torch==T`` and ``<package>==V`` with uv's ``--exclude-newer`` set to the day
after V's upload, so old releases get the setuptools, torchmetrics, ... of their time. torch and
its own dependency closure are exempt (``--exclude-newer-package``): they are resolved as of the
later of the two release dates, so the pinned torch is always installable.
Where torch comes from is uv's business: ``UV_INDEX``, ``UV_FIND_LINKS``, ... in the environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

from tools import index

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "closure"


def torch_closure(torch_version: str, cutoff: str) -> list[str]:
    """Names of torch's dependency closure (torch included), resolved by uv as of ``cutoff``."""
    path = CACHE / f"torch-{torch_version}-{cutoff}-py{sys.version_info[0]}{sys.version_info[1]}.json"
    if path.exists():
        return json.loads(path.read_text())
    cmd = ["uv", "pip", "compile", "-", "--quiet", "--no-header", "--no-annotate",
           "--exclude-newer", cutoff, "--python-version", f"{sys.version_info[0]}.{sys.version_info[1]}"]
    proc = subprocess.run(cmd, input=f"torch=={torch_version}\n", capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"uv could not resolve torch=={torch_version}: {proc.stderr.strip()}")
    names = sorted({Requirement(line.split(";")[0].strip()).name
                    for line in proc.stdout.splitlines() if line.strip() and not line.startswith("#")})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(names))
    os.replace(tmp, path)
    return names


def install_args(package: str, version: str, torch_version: str) -> list[str]:
    """Arguments for ``uv pip install`` (nox's ``session.install``) of one era-correct cell."""
    lightning = index.release(package, version)
    torch = index.release("torch", torch_version)
    era = index.day_after(lightning.uploaded)
    torch_era = index.day_after(max(lightning.uploaded, torch.uploaded))
    exempt = torch_closure(torch_version, torch_era)
    return [f"torch=={torch_version}", f"{package}=={version}", f"--exclude-newer={era}",
            *(f"--exclude-newer-package={name}={torch_era}" for name in exempt)]
