"""Era-correct environments: Lightning's dependencies as of its release date, torch as the matrix says.

A cell or a bisect candidate installs ``torch==T`` and ``<package>==V`` (``plan``: the one place
an environment's resolution is decided) with uv's ``--exclude-newer`` set to the day after V's
upload, so old releases get the setuptools, torchmetrics, ... of their time; setuptools is always
installed, as every venv of those years had it. torch and its own dependency closure are exempt
(``--exclude-newer-package``): they are resolved as of the later of the two release dates, so the
pinned torch is always installable; packages both need keep the release's date where torch
accepts that version.
Where torch comes from is uv's business: ``UV_INDEX``, ``UV_FIND_LINKS``, ... in the environment.

Every environment made here has its bytecode compiled at install (uv's ``UV_COMPILE_BYTECODE``):
machines and images that set ``PYTHONDONTWRITEBYTECODE=1`` would otherwise import torch and
Lightning from source on every run (about 2.7x slower to import).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tools.environments import index

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "closure"


COMPILED = {"UV_COMPILE_BYTECODE": "1"}  # what every ``uv pip install`` of the workspace adds


def uv_env() -> dict[str, str]:
    """The environment of a ``uv pip install`` run by the tools: bytecode compiled at install."""
    return {**os.environ, **COMPILED}


def link_bytecode(source: Path, site: Path) -> int:
    """Hard-link (or copy) the compiled bytecode of ``source`` (a site-packages folder) into
    ``site``, another one installed from the same requirements without compiling. Where uv
    linked the same files from its cache into both (its default on one file system), the
    bytecode is valid there too; elsewhere Python finds it does not match its source's time and
    size, and compiles that source again, as it would have. Compiling torch and Lightning again
    costs about 10 s of CPU; this, well under one. How many folders."""
    linked = 0
    for cache in source.rglob("__pycache__"):
        target = site / cache.relative_to(source)
        if not target.parent.is_dir() or target.exists():
            continue  # a package the other one does not have, or bytecode already there
        try:
            shutil.copytree(cache, target, copy_function=os.link)
        except (OSError, shutil.Error):  # another file system: copy instead
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(cache, target)
        linked += 1
    return linked


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
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"names": names, "cutoff": cutoff}))
    os.replace(tmp, path)
    return names, cutoff


def install_args(package: str, version: str, torch_version: str) -> list[str]:
    """Arguments for ``uv pip install`` (nox's ``session.install``) of one era-correct cell."""
    return install_plan(package, version, torch_version).args


def install_plan(package: str, version: str, torch_version: str, extra: tuple[str, ...] = ()) -> Plan:
    """The era-correct plan of one release with one torch (and ``extra`` requirements of the
    user's script, resolved as of the same date): what cells and bisects both install."""
    for requirement in extra:
        try:
            Requirement(requirement)
        except ValueError:
            raise EnvError(f"--with {requirement!r} is not a requirement") from None
    return plan([f"{package}=={version}", *extra], torch_version,
                index.release(package, version).uploaded)


ENVS = Path(__file__).resolve().parents[2] / ".cache" / "envs"


def ensure(name: str, args: list[str], python: str = "3.11", log=None) -> Path:
    """A cached venv under ``.cache/envs/<name>-<hash>`` with ``uv pip install <args>``; its
    python.

    Made once per name and argument list, in a folder of its own: the same release planned two
    ways (with and without a local torch wheel in ``UV_FIND_LINKS``, whose closure differs) gets
    two environments, never one rebuilt under a run that is using it. A marker file holding the
    hash is written last, so a creation that was interrupted is simply made again.
    """
    digest = hashlib.sha256(json.dumps(["compiled", *args]).encode()).hexdigest()[:16]
    folder = ENVS / f"{name}-{digest[:8]}"
    marker = folder / ".made-with"
    if marker.exists() and marker.read_text() == digest:
        return folder / "bin" / "python"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(ENVS / f".{folder.name}.lock", "a") as lock:  # another process making the same one waits
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and marker.read_text() == digest:
            return folder / "bin" / "python"
        return _make(name, folder, args, digest, python, log)


def _make(name: str, folder: Path, args: list[str], digest: str, python: str, log) -> Path:
    marker = folder / ".made-with"
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


# What every virtual environment of a release's era had without asking: pip's venvs seeded
# setuptools, and lightning-utilities up to 0.11 (every pytorch-lightning from 1.9.5 to 2.3.3)
# imports pkg_resources from it, which setuptools 82 removed. A plain ``uv venv`` seeds nothing.
SEED = ("setuptools",)


@dataclass(frozen=True)
class Plan:
    """How one environment is resolved: the release's own dependencies as of its date, torch's
    closure as of torch's, and packages both need as close to the release's date as torch allows."""

    args: list[str]  # for ``uv pip install``
    era: str  # cutoff of the release's own dependencies (uv's --exclude-newer)
    torch_era: str  # cutoff of torch's closure
    by_torch_date: list[str]  # torch's closure less the shared: resolved as of torch's date
    shared: dict[str, str]  # needed by both: the cutoff each got (the era where torch allows)

    def describe(self) -> str:
        """One line for a report's environment section."""
        line = f"dependencies as of {self.era} (uv --exclude-newer), torch's closure as of {self.torch_era}"
        at_era = [n for n, d in self.shared.items() if d == self.era]
        later = [f"{n} as of {d}" for n, d in self.shared.items() if d != self.era]
        if at_era:
            line += f"; needed by both and kept at the release's date: {', '.join(at_era)}"
        if later:
            line += f"; needed by both, as early as torch allows: {', '.join(later)}"
        return line


def _compile(args: list[str], annotate: bool = False) -> subprocess.CompletedProcess:
    reqs = [a for a in args if not a.startswith("--")]
    flags = [a for a in args if a.startswith("--")]
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    cmd = [index.uv(), "pip", "compile", "-", "--quiet", "--no-header", "--python-version", py,
           *([] if annotate else ["--no-annotate"]), *flags]
    return subprocess.run(cmd, input="\n".join(reqs) + "\n", capture_output=True, text=True)


def _own_closure(compiled: str, roots: set[str]) -> set[str]:
    """Packages reachable from ``roots`` in ``uv pip compile``'s annotated output, not through
    torch (whatever torch needs only for itself is torch's business)."""
    via: dict[str, set[str]] = {}  # package -> the packages that need it
    current = None
    for line in compiled.splitlines():
        if line and not line.startswith((" ", "#")):
            current = canonicalize_name(re.split(r"[=<>!~ ;\[]", line, maxsplit=1)[0])
            via[current] = set()
        elif current and line.strip().startswith("#"):
            name = line.strip().lstrip("#").strip().removeprefix("via").strip()
            if name and not name.startswith("-r"):
                via[current].add(canonicalize_name(name))
    own, grew = set(roots) - {"torch"}, True
    while grew:
        grew = False
        for package, parents in via.items():
            if package not in own and package != "torch" and parents & own:
                own.add(package)
                grew = True
    return own


def _days(start: str, end: str) -> list[str]:
    first, last = datetime.fromisoformat(start), datetime.fromisoformat(end)
    return [(first + timedelta(days=n)).date().isoformat() for n in range((last - first).days + 1)]


def _earliest_seen(torch_version: str, name: str) -> str | None:
    path = CACHE / f"earliest-torch{torch_version}.json"
    try:
        return json.loads(path.read_text()).get(name)
    except (OSError, ValueError):
        return None


def _remember_earliest(torch_version: str, name: str, day: str) -> None:
    path = CACHE / f"earliest-torch{torch_version}.json"
    try:
        known = json.loads(path.read_text()) if path.exists() else {}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({**known, name: day}))
        os.replace(tmp, path)
    except (OSError, ValueError):
        pass  # only a shortcut for the next plan


def plan(requirements: list[str], torch_version: str, moment: datetime) -> Plan:
    """The ``uv pip install`` plan for ``requirements`` as of ``moment`` with ``torch==T``.

    torch and its dependency closure are exempt from the era cutoff (so the pinned torch is always
    installable), except the packages the release needs too (setuptools, fsspec, typing-extensions,
    ...): each of those gets the release's date, or where torch needs a newer one (torch 2.13 asks
    for setuptools >= 77.0.3) the earliest date torch accepts, found by bisecting the days. So an
    old release gets a setuptools that still has the ``pkg_resources`` it imports, whatever torch
    is chosen. Cached by input.
    """
    torch = index.release("torch", torch_version)
    closure, torch_era = torch_closure(torch_version, max(moment, torch.uploaded))
    era = index.day_after(moment)
    # torch wheels before 2.3 were built against NumPy 1.x and cannot use NumPy 2 ("Numpy is not
    # available"): a fact of torch's builds, whatever the era of the other packages
    abi = ["numpy<2"] if torch.version < Version("2.3") else []
    base = [f"torch=={torch_version}", *requirements, *SEED, *abi, f"--exclude-newer={era}"]
    key = hashlib.sha256(json.dumps(["v2", base, closure, torch_era]).encode()).hexdigest()[:16]
    path = CACHE / f"plan-{key}.json"
    if path.exists():
        return Plan(**json.loads(path.read_text()))

    def args_with(dates: dict[str, str]) -> list[str]:
        return base + [f"--exclude-newer-package={name}={dates.get(name, torch_era)}"
                       for name in sorted(closure)]

    loose = _compile(args_with({}), annotate=True)
    if loose.returncode:
        lines = [line.strip() for line in loose.stderr.splitlines() if line.strip()]
        why = next((line.removeprefix("cause: ") for line in lines if "Because" in line),
                   lines[-1] if lines else "?")
        raise EnvError(f"requirements unsatisfiable with torch {torch_version}: {why}")
    roots = {canonicalize_name(Requirement(r).name) for r in [*requirements, *SEED]}
    shared = sorted((_own_closure(loose.stdout, roots) & set(closure)) - {"torch"})
    dates = {name: era for name in shared}
    if shared and _compile(args_with(dates)).returncode:
        dates = {}
        for name in shared:  # the earliest day each one resolves, the others as found so far
            days = _days(era, torch_era)
            lo, hi = 0, len(days) - 1  # days[hi] resolves (torch's own date)
            known = _earliest_seen(torch_version, name)  # what it was for another release
            if known in days:  # usually torch's own lower bound: two compiles instead of a dozen
                at = days.index(known)
                if _compile(args_with({**dates, name: known})).returncode == 0:
                    hi = at
                    if at and _compile(args_with({**dates, name: days[at - 1]})).returncode:
                        lo = at
                else:
                    lo = at + 1
            while lo < hi:
                mid = (lo + hi) // 2
                if _compile(args_with({**dates, name: days[mid]})).returncode == 0:
                    hi = mid
                else:
                    lo = mid + 1
            dates[name] = days[hi]
            _remember_earliest(torch_version, name, days[hi])
    found = Plan(args_with(dates), era, torch_era, sorted(set(closure) - set(shared) - {"torch"}),
                 dates)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(found.__dict__))
    os.replace(tmp, path)
    return found


def era_args(requirements: list[str], torch_version: str, moment: datetime) -> list[str]:
    """``uv pip install`` arguments for requirements as of ``moment`` with ``torch==T``."""
    return plan(requirements, torch_version, moment).args


def era_torch(moment: datetime, python: str = "3.11") -> str:
    """The newest torch release installable on ``python`` that was out at ``moment``."""
    out = [r for r in index.releases("torch").values()
           if r.uploaded <= moment and r.installable_on(python)]
    if not out:
        raise EnvError(f"no torch release for Python {python} before {moment.date()}")
    return str(max(out, key=lambda r: r.version).version)
