"""Release facts from the package index: versions, upload dates, yanked flags, Requires-Python.

Uses the standard simple-repository JSON API (PEP 691 + PEP 700 upload times) of the index uv
resolves against (``UV_DEFAULT_INDEX`` / ``UV_INDEX_URL`` choose another one).
Answers are cached for a day under ``.cache/index/``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from tools.core import contract

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "index"
MAX_AGE = 24 * 3600


class UnknownRelease(contract.BadInput, LookupError):
    """The index has no such project or version (bad input: exit 2)."""


@dataclass(frozen=True)
class Release:
    version: Version
    uploaded: datetime  # first file's upload time
    yanked: bool  # every file yanked
    requires_python: str | None
    tags: frozenset = frozenset()  # interpreter tags of its wheels ("cp311", "py3", ...)

    def installable_on(self, python: str) -> bool:
        """Not yanked, Requires-Python admits ``python`` (e.g. "3.11"), and a wheel or sdist for it."""
        from packaging.specifiers import SpecifierSet

        if self.yanked or self.version.is_prerelease:
            return False
        if self.requires_python and python not in SpecifierSet(self.requires_python):
            return False
        cp = "cp" + python.replace(".", "")
        return not self.tags or bool({cp, "py3", "sdist"} & self.tags)


@functools.cache
def uv() -> str:
    """The uv binary: on PATH, or the one the ``uv`` Python package ships (as nox finds it)."""
    found = shutil.which("uv")
    if found:
        return found
    try:
        import uv as uv_package

        return uv_package.find_uv_bin()
    except (ImportError, FileNotFoundError):
        raise contract.BadInput("uv not found: install it (pip install uv)") from None


def index_url() -> str:
    """The default index uv resolves against (it honours ``UV_DEFAULT_INDEX`` / ``UV_INDEX_URL``)."""
    proc = subprocess.run([uv(), "pip", "compile", "-", "--emit-index-url", "--no-header",
                           "--quiet", "--offline"], input="", capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("--index-url "):
            return line.split(None, 1)[1].rstrip("/")
    raise RuntimeError(f"could not ask uv for its index: {proc.stderr.strip()}")


def _project_json(name: str) -> dict:
    name = canonicalize_name(name)
    path = CACHE / f"{name}.json"
    if path.exists() and time.time() - path.stat().st_mtime < MAX_AGE:
        return json.loads(path.read_text())
    req = urllib.request.Request(f"{index_url()}/{name}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            data = json.load(resp)
    except urllib.error.HTTPError as err:
        if err.code == 404:
            raise UnknownRelease(f"no project {name!r} on the package index") from None
        raise
    path.parent.mkdir(parents=True, exist_ok=True)
    # two processes, or two threads of one (parallel probes), may fetch it at once
    tmp = path.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
    return data


def _file_version(filename: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        return parse_sdist_filename(filename)[1]
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None


def _tags(filename: str) -> str:
    if not filename.endswith(".whl"):
        return "sdist"
    return filename[:-4].split("-")[-3].split(".")[0]


def releases(name: str) -> dict[Version, Release]:
    """Every release of ``name`` that has files with an upload time, oldest first."""
    found: dict[Version, list[dict]] = {}
    for f in _project_json(name).get("files", []):
        version = _file_version(f["filename"])
        if version is not None and f.get("upload-time"):
            found.setdefault(version, []).append(f)
    out = {}
    for version in sorted(found):
        files = found[version]
        out[version] = Release(
            version=version,
            uploaded=min(datetime.fromisoformat(f["upload-time"].replace("Z", "+00:00"))
                         for f in files),
            yanked=all(bool(f.get("yanked")) for f in files),
            requires_python=next((f["requires-python"] for f in files if f.get("requires-python")),
                                 None),
            tags=frozenset(_tags(f["filename"]) for f in files),
        )
    return out


def release(name: str, version: str) -> Release:
    try:
        wanted = Version(version)
    except InvalidVersion:
        raise UnknownRelease(f"{version!r} is not a version") from None
    found = releases(name).get(wanted)
    if found is None:
        raise UnknownRelease(f"{name} {version} is not on the package index")
    return found


def day_after(moment: datetime) -> str:
    """A cutoff for uv's --exclude-newer that still admits everything uploaded on that day."""
    return (moment + timedelta(days=1)).date().isoformat()
