"""The Lightning x torch matrix of ``nox -s repro``, read from ``repro/matrix.toml``."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "repro" / "matrix.toml"
PREFIX = {"pytorch-lightning": "pl", "lightning": "lightning"}


def slug(version: str) -> str:
    """A version as a nox ``-k`` keyword: dots and other punctuation become ``_``."""
    return "".join(c if c.isalnum() else "_" for c in version)


@dataclass(frozen=True)
class Repro:
    name: str
    script: str
    args: tuple[str, ...] = ()
    expect: str | None = None
    passthrough: bool = False  # takes the options given after `nox -s repro --`
    fresh_args: tuple[str, ...] = ()  # added with `--fresh-process`: new interpreters for its ranks too
    verdict_line: bool = True  # prints the contract's verdict line (else: judged by a --signature)
    preload: bool = True  # the workspace's own: safe to fork from a preloaded runner
    multinode: str | None = None  # how it runs as several nodes: "torchrun" | "self" | None (one node)
    issue: int | None = None  # the upstream issue it reproduces
    known_as: str | None = None  # regex: what a report, or a run of a reporter's script, shows of it


@dataclass(frozen=True)
class Cell:
    package: str
    lightning: str
    torch: str
    declared: str | None  # the torch range the release declares (None: unknown)
    included: str | None = None  # why an out-of-range cell runs anyway
    index: int = field(default=0, compare=False)

    @property
    def id(self) -> str:
        # a Python identifier: nox's -k reads `-` as minus (a cell id must select that cell)
        return f"{PREFIX[self.package]}{slug(self.lightning)}_torch{slug(self.torch)}"

    @property
    def in_range(self) -> bool:
        return self.declared is None or Version(self.torch) in SpecifierSet(self.declared)

    def skip_reason(self, include_unsupported: bool = False) -> str | None:
        if self.in_range or self.included or include_unsupported:
            return None
        return (f"torch {self.torch} is outside {self.package} {self.lightning}'s declared "
                f"range {self.declared} (run anyway: -- --include-unsupported)")


@dataclass(frozen=True)
class Matrix:
    cells: tuple[Cell, ...]
    repros: tuple[Repro, ...]


def load(path: Path | None = None) -> Matrix:
    """The matrix of ``path``, else of ``$REPRO_MATRIX`` (another matrix file, e.g. one cell and
    one repro for a quick check), else ``repro/matrix.toml``."""
    path = Path(path or os.environ.get("REPRO_MATRIX") or DEFAULT)
    data = tomllib.loads(path.read_text())
    ranges = data.get("supported_torch", {})
    includes = {(i["package"], i["lightning"], i["torch"]): i.get("reason", "listed")
                for i in data.get("include", [])}
    keys = [(pkg, ver, t) for pkg, versions in data.get("lightning", {}).items()
            for ver in versions for t in data.get("torch", [])]
    keys += [k for k in includes if k not in keys]
    for pkg, _, _ in keys:
        if pkg not in PREFIX:
            raise ValueError(f"{path}: unknown package {pkg!r} (one of {', '.join(PREFIX)})")
    cells = tuple(Cell(pkg, ver, t, ranges.get(ver), includes.get((pkg, ver, t)), i)
                  for i, (pkg, ver, t) in enumerate(keys))
    for r in data.get("repro", []):
        if r.get("multinode") not in (None, "torchrun", "self"):
            raise ValueError(f"{path}: repro {r.get('name')!r}: multinode is 'torchrun' or 'self', "
                             f"not {r['multinode']!r}")
    repros = tuple(Repro(r["name"], r["script"], tuple(r.get("args", ())), r.get("expect"),
                         bool(r.get("passthrough")), tuple(r.get("fresh_args", ())),
                         bool(r.get("verdict_line", True)), multinode=r.get("multinode"),
                         issue=r.get("issue"), known_as=r.get("known_as"))
                   for r in data.get("repro", []))
    return Matrix(cells, repros)
