"""``nox -s fingerprint -- traceback.txt``: which releases have the quoted code at the quoted lines?

A traceback pasted from an issue names files, line numbers and the code on each line. For every
Lightning frame (the trainer, and Fabric / Lite, which ship in the same release) and torch frame,
a release "matches" the frame when its source has that very code at that line. The answer is the
releases that match every frame; when none does (a garbled paste, a patched install), releases are
ranked by how many frames they match ("12/13 frames").

Pastes in issues are lossy, so the traceback is read line by line, not with one pattern:

- ``[rankN]:`` prefixes and ANSI colours are dropped; the lines of each rank are read as a stream
  of their own (interleaved ranks do not mix), and a frame quoted by several ranks, or again by a
  chained exception, counts once.
- A ``File`` line whose code line was lost (the next line is another ``File`` line, the exception,
  or nothing) is kept as a frame with *unknown* code: it is listed, but it matches no release and
  is left out of the "N/M frames" count, as it cannot tell releases apart. It never takes the next
  frame's ``File`` line as its code. A code line without its ``File`` line cannot be placed and is
  ignored.
- A ``File`` line wrapped over two lines is joined; a code line that may have been wrapped also
  matches when joined with its continuation.
- Windows paths (backslashes), conda, dist-packages and source checkouts all reduce to the path
  inside the package. IPython / Jupyter tracebacks (``File path:N, in f`` or ``path in f``, then
  the ``---> N code`` line) are read too; rich's boxed tracebacks are not (they cut code lines).

Sources come from the release wheels on the index, kept under ``.cache/wheels``: small wheels
(Lightning's) are downloaded whole, torch's are read member by member through HTTP range requests
(only the zip's directory and the quoted files), or from git tags when ``--repo`` names a checkout.
"""

from __future__ import annotations

import argparse
import codecs
import hashlib
import io
import json
import os
import re
import shutil
import sys
import urllib.request
import zipfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from tools.core import contract
from tools.environments import index

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "wheels"
WHOLE_WHEEL_MAX = 50 * 2**20  # wheels up to this size are downloaded whole (Lightning's are ~1 MB)

# Where a package's files sit in a path, in its wheels and in a checkout (under src/). Fabric and
# Lite (its 1.8 name) are part of every Lightning release: the ``lightning`` wheel holds
# lightning/{pytorch,fabric}, a ``pytorch-lightning`` wheel holds lightning_fabric beside
# pytorch_lightning, so their frames are matched against the same release.
ROOTS = {
    "lightning": ("pytorch_lightning", "lightning/pytorch"),
    "fabric": ("lightning_fabric", "lightning/fabric"),
    "lite": ("lightning_lite", "lightning/lite"),
    "torch": ("torch",),
}
# --package: the frames its wheels hold
PACKAGES = {
    "pytorch-lightning": ("lightning", "fabric", "lite"),
    "lightning": ("lightning", "fabric", "lite"),
    "lightning-fabric": ("fabric",),
}
# the last match in a path wins: a checkout named pytorch_lightning holds src/pytorch_lightning/
PATHS = [(package, re.compile(r"^.*(?:^|/)(?:" + "|".join(map(re.escape, roots)) + r")/(.+)$"))
         for package, roots in ROOTS.items()]

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RANK = re.compile(r"^\[(?:rank|default)\d+\]:")  # torchrun's per-rank prefix of every line
QUOTE = re.compile(r"^(?:> ?)+")  # a traceback quoted in a Markdown reply
LINK = re.compile(r"\[([^\]\n]*)\]\([^)\s]*\)")  # IPython in VS Code: [path:N](vscode-url)
FILE = re.compile(r'^(?P<indent>\s*)File "(?P<path>[^"]+)",\s*line (?P<line>\d+)(?P<func>,?\s*in\b.*)?$')
IPY_FILE = re.compile(r"^\s*File (?P<path>\S[^\"]*?\.pyx?):(?P<line>\d+), in .*$")
IPY_OLD = re.compile(r"^\s*(?P<path>\S+\.pyx?) in \S.*$")
IPY_ARROW = re.compile(r"^\s*-+> ?(?P<line>\d+)\s(?P<code>.*)$")
HEADER = re.compile(r"Traceback \(most recent call last\)|During handling of the above exception"
                    r"|The above exception was the direct cause|\[Previous line repeated")
EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|Failure)\b"
                       r"|^[A-Z]\w*(?:\.\w+)*: ")


@dataclass(frozen=True)
class Frame:
    package: str  # lightning | fabric | lite | torch
    rel: str  # path inside the package, e.g. strategies/ddp.py
    line: int
    code: str | None  # as quoted; None when the paste lost the code line
    alternatives: tuple[str, ...] = ()  # other readings: joined with a wrapped tail, another rank's

    @property
    def readings(self) -> tuple[str, ...]:
        return ((self.code,) if self.code else ()) + self.alternatives

    @property
    def label(self) -> str:
        return f"{self.package}:{self.rel}:{self.line}" + ("" if self.code else " (code unknown)")


# -- reading a pasted traceback -------------------------------------------------------------

def decode(data: bytes) -> str:
    """The text of a pasted file; ValueError for one that is not text."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # PowerShell's `>` writes these
        return data.decode("utf-16", "replace")
    if b"\x00" in data:
        raise ValueError("it has NUL bytes: a binary file, not a pasted traceback")
    text = data.decode("utf-8-sig", "replace")
    if text.count("\ufffd") > max(8, len(text) // 20):
        raise ValueError("it is not UTF-8 text")
    return text


def streams(text: str) -> dict[str, list[tuple[int, str]]]:
    """(position, line) of each rank's lines; lines without a rank prefix are one more stream."""
    out: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for pos, raw in enumerate(text.splitlines()):
        line = QUOTE.sub("", ANSI.sub("", raw).rstrip())
        rank = RANK.match(line)
        line = LINK.sub(r"\1", line[rank.end():] if rank else line)
        out[rank.group(0) if rank else ""].append((pos, line.replace("\t", "    ")))
    return out


def indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def is_code(line: str, file_indent: int) -> bool:
    """Can ``line`` be the code line of a ``File`` line indented by ``file_indent``?"""
    text = line.strip()
    if not text or set(text) <= set("^~ ") or HEADER.search(line) or FILE.match(line):
        return False
    if indent(line) > file_indent:
        return True
    # a paste that lost its indentation: anything but the exception line
    return file_indent == 0 and not EXCEPTION.match(text)


def file_line(lines: list[tuple[int, str]], i: int) -> tuple[re.Match | None, int]:
    """The ``File`` line at ``i`` and the index of its last line: a narrow terminal wraps a long
    one onto up to two more lines (also after ``line 5`` of ``line 553, in fit``)."""
    text = lines[i][1]
    if 'File "' not in text:
        return None, i
    found, end = FILE.match(text), i
    for j in (i + 1, i + 2):
        if (found and found.group("func")) or j >= len(lines):
            break
        text += lines[j][1].lstrip()
        joined = FILE.match(text)
        if joined and (joined.group("func") or not found):
            found, end = joined, j
        elif found:
            break  # complete enough; the next line is the code
    return found, end


def parse_stream(lines: list[tuple[int, str]]) -> list[tuple[int, str, int, str | None, tuple]]:
    """(position, path, line, code, alternatives) of each frame of one stream."""
    out = []
    i = 0
    while i < len(lines):
        pos = lines[i][0]
        found, i = file_line(lines, i)
        if found:
            k = i + 1
            while k < len(lines) and not lines[k][1].strip():
                k += 1  # pastes that double-space every line
            code, alternatives = None, ()
            if k < len(lines) and is_code(lines[k][1], len(found.group("indent"))):
                code = lines[k][1].strip()
                alternatives = wrapped(code, lines[k][1], lines[k + 1][1] if k + 1 < len(lines) else "")
                i = k
            out.append((pos, found.group("path"), int(found.group("line")), code, alternatives))
        else:
            ipython = ipython_frame(lines, i)
            if ipython:
                out.append(ipython)
        i += 1
    return out


def wrapped(code: str, line: str, after: str) -> tuple[str, ...]:
    """Readings of a code line that a terminal may have wrapped onto ``after`` (its tail starts
    further left than the code did; the exception line does too, and then matches nothing)."""
    tail = after.strip()
    if not tail or indent(after) >= indent(line) or 'File "' in after or HEADER.search(after) \
            or set(tail) <= set("^~ "):
        return ()
    return code + tail, f"{code} {tail}"


def ipython_frame(lines: list[tuple[int, str]], i: int):
    """An IPython frame at ``i``: its header names the file (and line), the ``--->`` line the code."""
    pos, text = lines[i]
    header = IPY_FILE.match(text) or IPY_OLD.match(text)
    if not header:
        return None
    for _, later in lines[i + 1:i + 40]:
        if IPY_FILE.match(later) or IPY_OLD.match(later) or FILE.match(later):
            break
        arrow = IPY_ARROW.match(later)
        if arrow:
            line = int(header.groupdict().get("line") or arrow.group("line"))
            if int(arrow.group("line")) == line:
                return pos, header.group("path"), line, arrow.group("code").strip() or None, ()
            break
    line = header.groupdict().get("line")
    return (pos, header.group("path"), int(line), None, ()) if line else None


def locate(path: str) -> tuple[str, str] | None:
    """(package, path inside it) of a frame's file, or None for any other file."""
    path = re.sub(r"\\+", "/", path)  # Windows, also escaped (C:\\Users\\...)
    for package, pattern in PATHS:
        found = pattern.match(path)
        if found:
            return package, found.group(1)
    return None


def parse(text: str) -> list[Frame]:
    """The Lightning and torch frames of a pasted traceback, in order, each once."""
    found = [frame for stream in streams(text).values() for frame in parse_stream(stream)]
    merged: dict[tuple, list] = {}  # (package, rel, line) -> [code, other readings], first seen first
    for _, path, line, code, alternatives in sorted(found, key=lambda f: f[0]):
        where = locate(path)
        if where is None:
            continue
        entry = merged.setdefault((*where, line), [None, []])
        if entry[0] is None:
            entry[0] = code  # a rank that kept the code line fills in one that lost it
        for reading in (code, *alternatives):
            if reading and reading != entry[0] and reading not in entry[1]:
                entry[1].append(reading)
    return [Frame(package, rel, line, code, tuple(others))
            for (package, rel, line), (code, others) in merged.items()]


def guess_package(text: str) -> str:
    """The Lightning package a paste's paths come from: the ``lightning`` wheel (and a checkout)
    holds lightning/pytorch and lightning/fabric, ``pytorch-lightning`` holds pytorch_lightning."""
    return "lightning" if re.search(r"lightning[/\\]+(?:pytorch|fabric)[/\\]", text) else "pytorch-lightning"


def matches(source: str | None, frame: Frame) -> bool:
    if source is None:
        return False
    lines = source.splitlines()
    return 0 < frame.line <= len(lines) and lines[frame.line - 1].strip() in frame.readings


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


def wheel_file(name: str, version: Version, prefer: tuple[str, ...]) -> dict | None:
    """The index's entry of one wheel of that release (a ``prefer`` hint in its name first)."""
    files = [f for f in index._project_json(name)["files"] if f["filename"].endswith(".whl")
             and index._file_version(f["filename"]) == version]
    for hint in prefer:
        for f in files:
            if hint in f["filename"]:
                return f
    return files[0] if files else None


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _download(f: dict) -> Path:
    """A whole wheel, kept under the cache; checked against the index's sha256."""
    path = CACHE / f["filename"]
    if not path.exists():
        with urllib.request.urlopen(f["url"], timeout=120) as resp:
            buf = io.BytesIO()
            shutil.copyfileobj(resp, buf)
        want = f.get("hashes", {}).get("sha256")
        if want and hashlib.sha256(buf.getvalue()).hexdigest() != want:
            raise OSError(f"{f['filename']}: the download does not match its sha256")
        _write_atomic(path, buf.getvalue())
    return path


class _RemoteMembers:
    """The members of a big remote wheel, read on demand, each kept under the cache."""

    def __init__(self, f: dict):
        self.f, self.dir, self._zip = f, CACHE / f"{f['filename']}.members", None

    def zip(self) -> zipfile.ZipFile:
        if self._zip is None:
            self._zip = zipfile.ZipFile(RangeFile(self.f["url"]))
        return self._zip

    def namelist(self) -> list[str]:
        listing = self.dir / "names.json"
        if not listing.exists():
            _write_atomic(listing, json.dumps(self.zip().namelist()).encode())
        return json.loads(listing.read_text())

    def read(self, member: str) -> bytes:
        kept = self.dir / "members" / member
        if not kept.exists():
            _write_atomic(kept, self.zip().read(member))
        return kept.read_bytes()


class _LocalWheel:
    """A wheel kept whole under the cache; opened for each read (hundreds of releases, few fds)."""

    def __init__(self, path: Path):
        self.path = path

    def namelist(self) -> list[str]:
        with zipfile.ZipFile(self.path) as z:
            return z.namelist()

    def read(self, member: str) -> bytes:
        with zipfile.ZipFile(self.path) as z:
            return z.read(member)


class WheelSources:
    """Files of one release's wheel, fetched on the first read."""

    def __init__(self, name: str, version: Version, prefer=("none-any",)):
        self.name, self.version, self.prefer = name, version, prefer
        self._wheel, self._names = None, None

    def _open(self):
        f = wheel_file(self.name, self.version, self.prefer)
        if f is None:
            self._names = set()
            return
        big = (f.get("size") or 0) > WHOLE_WHEEL_MAX
        self._wheel = _RemoteMembers(f) if big else _LocalWheel(_download(f))
        self._names = set(self._wheel.namelist())

    def read(self, package: str, rel: str) -> str | None:
        if self._names is None:
            self._open()
        for root in ROOTS[package]:
            if f"{root}/{rel}" in self._names:
                return self._wheel.read(f"{root}/{rel}").decode("utf-8", "replace")
        return None


class GitSources:
    """Files of one tag of a Lightning checkout (old and new source layouts)."""

    def __init__(self, repo, tag: str):
        self.repo, self.tag = repo, tag

    def read(self, package: str, rel: str) -> str | None:
        for root in ROOTS[package]:
            for prefix in ("src/", ""):
                try:
                    return self.repo.git.show(f"{self.tag}:{prefix}{root}/{rel}")
                except Exception:
                    continue
        return None


# -- the search ---------------------------------------------------------------------------

def rank(frames: list[Frame], versions: list[Version], sources_for, log=print,
         name: str = "") -> tuple[int, list[tuple[int, list[str]]]]:
    """(frames with known code, [(frames matched, releases)] best first) over ``versions``."""
    known = [f for f in frames if f.code]
    by_score: dict[int, list[str]] = defaultdict(list)
    if not known:
        return 0, []
    for v in versions:
        src = sources_for(v)
        cache: dict[tuple[str, str], str | None] = {}
        score = 0
        for f in known:
            if (f.package, f.rel) not in cache:
                cache[f.package, f.rel] = src.read(f.package, f.rel)
            score += matches(cache[f.package, f.rel], f)
        by_score[score].append(str(v))
        if score == len(known):
            log(f"  {name} {v}: every quoted line matches")
    return len(known), sorted(by_score.items(), reverse=True)


def best(total: int, ranking: list[tuple[int, list[str]]]) -> list[str]:
    """The best-ranked releases: all matched, else the most frames matched (none for 0)."""
    return ranking[0][1] if ranking and ranking[0][0] > 0 else []


def fingerprint(frames: list[Frame], package: str, versions: list[Version], sources_for,
                log=print) -> list[str]:
    """The releases where every quoted line of ``package``'s frames matches."""
    total, ranking = rank([f for f in frames if f.package in PACKAGES.get(package, (package,))],
                          versions, sources_for, log)
    return ranking[0][1] if total and ranking[0][0] == total else []


def answer(name: str, total: int, ranking: list[tuple[int, list[str]]], shown: int = 3) -> str:
    if not total:
        return f"{name}: no frame with its code line"
    if ranking and ranking[0][0] == total:
        return f"{name}: {', '.join(ranking[0][1])}"
    ranks = "; ".join(f"{score}/{total} frames: {', '.join(releases)}"
                      for score, releases in ranking[:shown] if score)
    return f"{name}: no release matches every quoted line; most frames matched: {ranks or 'none'}"


def check_version(option: str, value: str) -> Version:
    try:
        return Version(value)
    except InvalidVersion:
        raise ValueError(f"{option} {value!r} is not a version") from None


def parser() -> argparse.ArgumentParser:
    """The program's options (its ``--help``)."""
    p = argparse.ArgumentParser(prog="nox -s fingerprint --", description=__doc__.split("\n\n")[0],
                                formatter_class=contract.DefaultsShown)
    p.add_argument("traceback", help="a file with the pasted traceback")
    contract.add_repo(p, "its release tags, read instead of the wheels", "the wheels")
    p.add_argument("--package", help=f"the Lightning package: {', '.join(PACKAGES)} (default: "
                   "lightning when the paths show lightning/pytorch, else pytorch-lightning)")
    p.add_argument("--oldest", default="2.0.0", help="oldest Lightning release to consider")
    contract.add_old_name(p, "--since", "--oldest")
    p.add_argument("--torch-oldest", default="2.0.0", help="oldest torch release to consider")
    contract.add_old_name(p, "--torch-since", "--torch-oldest")
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    # every input is checked before the index or a wheel is asked for anything
    try:
        since = check_version("--oldest", args.oldest)
        torch_since = check_version("--torch-oldest", args.torch_oldest)
        if args.package is not None and args.package not in PACKAGES:
            raise ValueError(f"--package {args.package!r} is not one of {', '.join(PACKAGES)}")
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        text = decode(Path(args.traceback).read_bytes())
    except OSError as err:
        print(f"error: cannot read {args.traceback}: {err.strerror}", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"error: {args.traceback}: {err}", file=sys.stderr)
        return 2
    frames = parse(text)
    if not any(f.code for f in frames):
        print("error: no Lightning or torch frame with its code line in that traceback",
              file=sys.stderr)
        return 2
    repo = None
    if args.repo:
        from tools.stages import gitrange

        try:  # a path as it is; a URL cloned once into .cache, as the bisect does
            cache = Path(__file__).resolve().parent.parent / ".cache" / "repos"
            repo = (gitrange.repo_at(args.repo) if not gitrange.is_url(args.repo)
                    else gitrange.open_repo(args.repo, cache))
        except gitrange.BadInput as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    package = args.package or guess_package(text)
    print(f"{len(frames)} frames: " + ", ".join(f.label for f in frames))
    try:
        return search(frames, package, since, torch_since, repo)
    except (OSError, index.UnknownRelease) as err:
        print(f"error: cannot read releases from the package index: {err}", file=sys.stderr)
        return 1


def releases_since(package: str, since: Version, frames: list[Frame]) -> list[Version]:
    """Final releases from ``since`` on; none asked for when no frame has code to match."""
    if not any(f.code for f in frames):
        return []
    return [v for v in index.releases(package) if v >= since and not v.is_prerelease]


def search(frames: list[Frame], package: str, since: Version, torch_since: Version, repo) -> int:
    pl_frames = [f for f in frames if f.package in PACKAGES[package]]
    pl_versions = releases_since(package, since, pl_frames)
    if repo is not None:
        tags = {t.name for t in repo.tags}
        pl_versions = [v for v in pl_versions if str(v) in tags]
        sources = lambda v: GitSources(repo, str(v))  # noqa: E731
    else:
        sources = lambda v: WheelSources(package, v)  # noqa: E731
    pl = rank(pl_frames, pl_versions, sources, name=package)
    torch_frames = [f for f in frames if f.package == "torch"]
    torch = rank(torch_frames, releases_since("torch", torch_since, torch_frames),
                 lambda v: WheelSources("torch", v, ("macosx", "win_amd64")), name="torch")
    print(answer(package, *pl))
    print(answer("torch", *torch))
    for name, (total, ranking), option in ((package, pl, "--oldest"), ("torch", torch, "--torch-oldest")):
        if total and (not ranking or ranking[0][0] * 2 < total):
            print(f"note: no {name} release matches even half of its frames: an older {option}?")
    return 0


if __name__ == "__main__":
    sys.exit(main())
