"""``nox -s fingerprint -- traceback.txt``: which releases have the quoted code at every file:line?

A traceback pasted from an issue names files, line numbers and the code on each line. For every
Lightning and torch frame, a release "matches" when its source has that very code at that line.
Lightning sources come from git tags when ``--repo`` names a checkout, otherwise from release
wheels (small, cached); torch sources are read from a wheel on the index without downloading it
whole (HTTP range requests on the zip: only the central directory and the quoted files).
"""

from __future__ import annotations

import argparse
import io
import re
import sys
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from tools import index

FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>[^\n]+)\n'
                   r'(?:\[rank\d+\]:)?\s*(?P<code>[^\n]*)')
PACKAGES = (("lightning", re.compile(r"(?:pytorch_lightning|lightning/pytorch)/(.+)$")),
            ("torch", re.compile(r"(?:^|/)torch/(.+)$")))


@dataclass(frozen=True)
class Frame:
    package: str  # lightning | torch
    rel: str  # path inside the package, e.g. strategies/ddp.py
    line: int
    code: str


def parse(text: str) -> list[Frame]:
    frames = []
    for m in FRAME.finditer(text):
        path, code = m.group("path"), m.group("code").strip()
        if not code or set(code) <= set("^~ "):
            continue
        for package, pattern in PACKAGES:
            found = pattern.search(path)
            if found:
                frames.append(Frame(package, found.group(1), int(m.group("line")), code))
                break
    return frames


def matches(source: str | None, frame: Frame) -> bool:
    if source is None:
        return False
    lines = source.splitlines()
    return 0 < frame.line <= len(lines) and lines[frame.line - 1].strip() == frame.code


# -- where sources come from ----------------------------------------------------------------

class RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through HTTP range requests."""

    def __init__(self, url: str):
        self.url, self.pos = url, 0
        req = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(req, timeout=60) as resp:
            self.size = int(resp.headers["Content-Length"])

    def seekable(self):
        return True

    def readable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=0):
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def read(self, n=-1):
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if self.pos >= end:
            return b""
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end - 1}"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            data = resp.read()
        self.pos += len(data)
        return data


def wheel_url(name: str, version: Version, prefer: tuple[str, ...]) -> str | None:
    files = [f for f in index._project_json(name)["files"] if f["filename"].endswith(".whl")
             and index._file_version(f["filename"]) == version]
    for hint in prefer:
        for f in files:
            if hint in f["filename"]:
                return f["url"]
    return files[0]["url"] if files else None


class WheelSources:
    """Files of one release's wheel, read remotely (member by member)."""

    def __init__(self, name: str, version: Version, roots: tuple[str, ...], prefer=("none-any",)):
        self.roots = roots
        url = wheel_url(name, version, prefer)
        self.zip = zipfile.ZipFile(RangeFile(url)) if url else None

    def read(self, rel: str) -> str | None:
        if self.zip is None:
            return None
        names = set(self.zip.namelist())
        for root in self.roots:
            if f"{root}/{rel}" in names:
                return self.zip.read(f"{root}/{rel}").decode("utf-8", "replace")
        return None


class GitSources:
    """Files of one tag of a Lightning checkout (old and new source layouts)."""

    ROOTS = ("src/lightning/pytorch", "src/pytorch_lightning", "pytorch_lightning")

    def __init__(self, repo, tag: str):
        self.repo, self.tag = repo, tag

    def read(self, rel: str) -> str | None:
        for root in self.ROOTS:
            try:
                return self.repo.git.show(f"{self.tag}:{root}/{rel}")
            except Exception:
                continue
        return None


# -- the search ---------------------------------------------------------------------------

def fingerprint(frames: list[Frame], package: str, versions: list[Version], sources_for,
                log=print) -> list[str]:
    mine = [f for f in frames if f.package == package]
    if not mine:
        return []
    hits = []
    for v in versions:
        src = sources_for(v)
        cache: dict[str, str | None] = {}
        ok = True
        for f in mine:
            if f.rel not in cache:
                cache[f.rel] = src.read(f.rel)
            if not matches(cache[f.rel], f):
                ok = False
                break
        if ok:
            hits.append(str(v))
            log(f"  {package} {v}: every quoted line matches")
    return hits


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nox -s fingerprint --")
    p.add_argument("traceback", help="a file with the pasted traceback")
    p.add_argument("--repo", help="a Lightning git checkout: read its tags instead of wheels")
    p.add_argument("--package", default="pytorch-lightning")
    p.add_argument("--since", default="2.0.0", help="oldest release to consider")
    p.add_argument("--torch-since", default="2.0.0")
    args = p.parse_args(argv)
    try:
        text = Path(args.traceback).read_text()
    except OSError as err:
        print(f"error: cannot read {args.traceback}: {err.strerror}", file=sys.stderr)
        return 2
    frames = parse(text)
    if not frames:
        print("error: no Lightning or torch frame with its code line in that traceback",
              file=sys.stderr)
        return 2
    print(f"{len(frames)} frames: " + ", ".join(f"{f.package}:{f.rel}:{f.line}" for f in frames))
    pl_versions = [v for v, r in index.releases(args.package).items()
                   if v >= Version(args.since) and not v.is_prerelease]
    if args.repo:
        from tools import gitrange

        try:
            repo = gitrange.repo_at(args.repo)
        except gitrange.BadInput as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        tags = {t.name for t in repo.tags}
        pl_versions = [v for v in pl_versions if str(v) in tags]
        pl = fingerprint(frames, "lightning", pl_versions, lambda v: GitSources(repo, str(v)))
    else:
        roots = ("pytorch_lightning", "lightning/pytorch")
        pl = fingerprint(frames, "lightning", pl_versions,
                         lambda v: WheelSources(args.package, v, roots))
    torch_versions = [v for v, r in index.releases("torch").items()
                      if v >= Version(args.torch_since) and not v.is_prerelease]
    torch = fingerprint(frames, "torch", torch_versions,
                        lambda v: WheelSources("torch", v, ("torch",), ("macosx", "win_amd64")))
    print(f"{args.package}: {', '.join(pl) or 'no release matches every quoted line'}")
    print(f"torch: {', '.join(torch) or 'no release matches every quoted line'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
