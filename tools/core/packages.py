"""The distribution's packages a session needs (SLURM's daemons, bubblewrap), installed with
``apt-get`` when their programs are missing: root only, else one line says what to install."""

from __future__ import annotations

import os
import shutil
import subprocess

from tools.core import contract


def install(packages: tuple[str, ...], programs: tuple[str, ...], what: str, cannot=contract.BadInput,
            log=print) -> None:
    """Install ``packages`` unless every one of ``programs`` is on PATH. ``cannot`` (a
    ``BadInput``) says why it cannot be done here: not root, no apt-get, apt-get failed."""
    missing = [p for p in programs if not shutil.which(p)]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise cannot(f"{what} is not installed ({', '.join(missing)} missing) and cannot be installed "
                     f"here ({'not root' if os.geteuid() else 'no apt-get'}): install the packages "
                     f"{' '.join(packages)}")
    log(f"[{what}] installing {' '.join(packages)} from the distribution's packages")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    quiet = {"env": {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, "capture_output": True,
             "text": True}
    done = subprocess.run(cmd, **quiet)
    if done.returncode:  # package lists missing or stale
        subprocess.run(["apt-get", "update", "-q"], **quiet)
        done = subprocess.run(cmd, **quiet)
    if done.returncode:
        raise cannot(f"apt-get could not install {' '.join(packages)}: "
                     f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
