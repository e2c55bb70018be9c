"""The patch series in ``patches/``: headers, checks against installed packages and checkouts.

A patch file is ``git format-patch`` output (``git am`` and ``git apply`` take it as is): mail
headers (``From:``, ``Date:``, ``Subject:``), a message whose last paragraph holds the DEP-3 fields
(``Bug``, ``Forwarded``, ``Origin``, ``Last-Update``, plus ``X-Target``: ``torch`` or ``lightning``;
``X-Base``: the upstream commit or tag it was made against; ``X-Cells``, ``X-Repro``,
``X-Expect-Before`` / ``X-Expect-After``, ``X-Tests``, ``X-Relation``: ``fixes`` (the default) or
``related``, for the PR's ``Fixes #N`` or ``Related to #N``), a ``---`` line, then the diff with paths as
in the upstream repository (``src/lightning/pytorch/...`` or ``torch/...``). The series is quilt's:
each patch applies on top of the ones before it. Applying uses GNU patch without fuzz (the context
is minimal, fuzz would let a hunk land anywhere); a hunk that applies at an offset is drift.
"""

from __future__ import annotations

import email
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tools.core import contract

ROOT = Path(__file__).resolve().parents[2]
PATCHES = ROOT / "patches"
REQUIRED = ("Description", "Bug", "Forwarded", "Origin", "Last-Update", "X-Target", "X-Base", "X-Repro",
            "X-Expect-Before", "X-Expect-After")
FIELD = re.compile(r"^([A-Za-z][\w-]*): ?(.*)$")
HUNK = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
TARGETS = ("torch", "lightning")
RELATIONS = ("fixes", "related")  # X-Relation: the PR says "Fixes #N" or "Related to #N"
VERDICTS = ("good", "bad", "skip")  # what X-Expect-Before / X-Expect-After may say
ORIGINS = ("upstream", "backport", "vendor", "other")  # DEP-3
CHANGELOG_SECTIONS = ("Added", "Changed", "Deprecated", "Removed", "Fixed")  # Lightning's CHANGELOG


class PatchError(contract.BadInput):
    """A malformed patch or series (one line, exit 2)."""


@dataclass
class Patch:
    path: Path
    headers: dict[str, str]
    diff: str
    files: list[str] = field(default_factory=list)  # paths as in the upstream repository

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def target(self) -> str:
        return self.headers["X-Target"]

    @property
    def cells(self) -> list[str]:
        return self.headers.get("X-Cells", "").split()

    @property
    def repro(self) -> list[str]:
        return shlex.split(self.headers["X-Repro"])

    def sections(self) -> dict[str, str]:
        """The diff cut into one piece per file, by its path in the upstream repository."""
        pieces = re.split(r"(?m)^(?=diff --git )", self.diff)
        if len(pieces) == 1:  # a plain unified diff without git headers
            pieces = re.split(r"(?m)^(?=--- )", self.diff)
        out = {}
        for piece in pieces:
            path = re.search(r"(?m)^\+\+\+ b/(\S+)", piece)
            if path:
                out[path.group(1)] = piece
        return out

    def installable_files(self) -> list[str]:
        """The files that land in an installed package: its Python sources only (no tests, no
        CHANGELOG), as they exist in a wheel."""
        prefix = (("torch/",) if self.target == "torch"
                  else ("src/lightning/pytorch/", "src/lightning/fabric/"))
        return [path for path in self.sections() if path.startswith(prefix) and path.endswith(".py")]

    @property
    def touches_fabric(self) -> bool:
        return any(path.startswith("src/lightning/fabric/") for path in self.installable_files())

    def installable_diff(self) -> str:
        sections = self.sections()
        return "".join(sections[path] for path in self.installable_files())

    def test_changes(self) -> dict[str, str]:
        """Test files the patch creates or changes, with their part of the diff."""
        folder = "test/" if self.target == "torch" else "tests/"  # each project's own layout
        return {path: text for path, text in self.sections().items() if path.startswith(folder)}


def read(path: Path, name: str) -> str:
    """A text file of the series (UTF-8, as git writes patches); a PatchError when it is not."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise PatchError(f"{name}: cannot read it ({err.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise PatchError(f"{name}: not UTF-8 (line {line})") from None


def check_hunks(name: str, diff: str, first_line: int) -> int:
    """The number of hunks in ``diff`` (whose first line is line ``first_line`` of the file).

    A PatchError for a malformed hunk header, or line counts that do not match the hunk's body:
    GNU patch refuses those ("malformed patch") only when it applies the patch, minutes into a
    validation. The body is read as GNU patch and git read it: by the counts.
    """
    lines = diff.removesuffix("\n").split("\n")  # as patch splits them (str.splitlines splits on more)
    hunks = i = 0
    while i < len(lines):
        if not lines[i].startswith("@@"):
            i += 1
            continue
        header, where = lines[i], f"{name}: line {first_line + i}"
        match = HUNK.match(header)
        if not match:
            raise PatchError(f"{where}: malformed hunk header {header[:60]!r}")
        old, new = int(match[1] or 1), int(match[2] or 1)  # a count left out is 1
        i += 1
        while old > 0 or new > 0:
            kind = lines[i][:1] if i < len(lines) else "end"
            if kind in (" ", ""):  # a context line (an empty one: its blank was stripped)
                old, new = old - 1, new - 1
            elif kind == "-":
                old -= 1
            elif kind == "+":
                new -= 1
            elif kind != "\\":  # "\ No newline at end of file" is no line of either side
                break
            i += 1
        while i < len(lines) and lines[i].startswith("\\"):
            i += 1
        after = lines[i] if i < len(lines) else ""
        # past the counts: the next hunk or file, git's "-- " signature, or a line the body lost
        longer = after[:1] in (" ", "+") or (after[:1] == "-" and not after.startswith("--- ")
                                              and after != "-- ")
        if old or new or longer:
            raise PatchError(f"{where}: malformed hunk {header[:60]!r}: its line counts do not match "
                             f"its body")
        hunks += 1
    return hunks


def parse(path: Path) -> Patch:
    name = Path(path).name
    text = read(path, name)
    if not text.startswith("From "):
        raise PatchError(f"{name}: not a git format-patch file (no 'From ' line)")
    message, sep, diff = text.partition("\n---\n")
    if not sep or not re.search(r"^--- ", diff, re.M):
        raise PatchError(f"{name}: no unified diff after the message")
    mail = email.message_from_string(message)
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", " ".join((mail["Subject"] or "").split()))
    if not subject:
        raise PatchError(f"{name}: no Subject")
    paragraphs = mail.get_payload().strip().split("\n\n")
    # Description: the subject, then the message's paragraphs (the cause first, then the change)
    headers = {"Description": "\n".join([subject, "\n\n".join(paragraphs[:-1])]).strip(),
               "Author": mail["From"] or ""}
    last = None
    for line in paragraphs[-1].splitlines():
        if line.startswith((" ", "\t")) and last:
            headers[last] += "\n" + line.strip()
        elif FIELD.match(line):
            last, value = FIELD.match(line).groups()
            headers[last] = value.strip()
        else:
            raise PatchError(f"{name}: a line of the field block is not a field: {line[:60]!r}")
    missing = [h for h in REQUIRED if not headers.get(h)]
    if missing:
        raise PatchError(f"{name}: missing field {', '.join(missing)}")
    if headers["X-Target"] not in TARGETS:
        raise PatchError(f"{name}: X-Target must be one of {', '.join(TARGETS)}")
    check_fields(name, headers, Path(path).resolve().parent.parent)
    files = [m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", diff, re.M)]
    hunks = check_hunks(name, diff, first_line=message.count("\n") + 3)  # the message, then "---"
    if not files or not hunks:
        raise PatchError(f"{name}: the diff has no file or no hunk")
    return Patch(Path(path), headers, diff, files)


def check_fields(name: str, headers: dict[str, str], workspace: Path = ROOT) -> None:
    """Every field's value, now: each is read minutes into a validation (a repro that does not
    exist, an expectation that is no verdict, a cell the matrix lacks). Paths are the workspace's
    (the folder above the series)."""
    from datetime import date

    from tools.environments import matrix

    def bad(key: str, why: str):
        raise PatchError(f"{name}: {key}: {headers[key][:60]!r} {why}")

    for key in ("X-Expect-Before", "X-Expect-After"):
        if headers[key] not in VERDICTS:
            bad(key, f"is not one of {', '.join(VERDICTS)}")
    try:
        date.fromisoformat(headers["Last-Update"])
    except ValueError:
        bad("Last-Update", "is not a date (YYYY-MM-DD)")
    forwarded = headers["Forwarded"]
    if forwarded not in ("no", "not-needed") and not re.match(r"https?://\S+$", forwarded):
        bad("Forwarded", "is not 'no', 'not-needed' or the URL where it was sent")
    if headers["Origin"].split(",")[0].strip() not in ORIGINS:
        bad("Origin", f"does not start with one of {', '.join(ORIGINS)}")
    bug = headers["Bug"]
    if not (re.match(r"https?://\S+$", bug) or bug == "none" or (workspace / bug).is_file()):
        bad("Bug", "is neither a URL, 'none' (a draft without an issue) nor a file of the workspace")
    try:
        repro = shlex.split(headers["X-Repro"])
    except ValueError as err:
        raise PatchError(f"{name}: X-Repro is not a command line ({err})") from None
    if not repro or not (ROOT / repro[0]).is_file():
        bad("X-Repro", "does not start with a repro script of this workspace")
    known = {c.id for c in matrix.load().cells}
    unknown = [c for c in headers.get("X-Cells", "").split() if c not in known]
    if unknown:
        raise PatchError(f"{name}: X-Cells: unknown cell {unknown[0]!r} (`nox -l` lists them)")
    if headers.get("X-Relation", "fixes") not in RELATIONS:
        bad("X-Relation", f"is not one of {', '.join(RELATIONS)}")
    sections = [s for s in headers.get("X-Changelog", "").split() if s not in CHANGELOG_SECTIONS]
    if sections:
        raise PatchError(f"{name}: X-Changelog: {sections[0]!r} is not one of "
                         f"{', '.join(CHANGELOG_SECTIONS)}")


def series(folder: Path | None = None) -> list[Patch]:
    """Every patch of ``folder``'s series (default: ``PATCHES``, looked up at each call), parsed:
    whatever is wrong with any of them is a PatchError now, before any long work."""
    folder = Path(folder or PATCHES)
    listing = folder / "series"
    if not listing.exists():
        raise PatchError(f"no series file in {folder}")
    where = f"{folder.name}/series"
    names = [line.split("#")[0].strip() for line in read(listing, where).splitlines()]
    out = []
    for name in filter(None, names):
        path = folder / name
        if path.is_dir():
            raise PatchError(f"{where} names {name}, which is a directory, not a patch file")
        if not path.exists():
            raise PatchError(f"{where} names {name}, which does not exist")
        out.append(parse(path))
    return out


def named(name: str | None, folder: Path | None = None) -> list[Patch]:
    """The series, or only the patch called ``name`` (a PatchError when it is not in it)."""
    found = [p for p in series(folder) if name is None or p.name == name]
    if name and not found:
        raise PatchError(f"no patch {name!r} in the series")
    return found


def installed_root(site: Path, patch: Patch) -> tuple[Path, int]:
    """Where the patch's paths land in an installed environment, and GNU patch's -p level.

    ``torch/...`` lands in site-packages as is. ``src/lightning/pytorch/...`` lands in
    ``lightning/pytorch/...`` (the unified package) or ``pytorch_lightning/...`` (the mirror).
    A patch that also changes ``src/lightning/fabric/...`` lands in ``lightning/`` (the unified
    package), or in site-packages itself for the mirrors (``installable_for`` then names each
    file's package: ``pytorch_lightning/`` or ``lightning_fabric/``).
    """
    site = Path(site)
    if patch.target == "torch":
        return site, 1
    if patch.touches_fabric:
        if (site / "lightning" / "pytorch").is_dir():
            return site / "lightning", 3  # a/src/lightning/<pytorch|fabric>/<rest>
        if (site / "pytorch_lightning").is_dir() and (site / "lightning_fabric").is_dir():
            return site, 1
    if (site / "lightning" / "pytorch").is_dir():
        return site / "lightning" / "pytorch", 4  # a/src/lightning/pytorch/<rest>
    if (site / "pytorch_lightning").is_dir():
        return site / "pytorch_lightning", 4
    raise PatchError(f"no Lightning installed in {site}")


MIRROR_NAMES = ((re.compile(r"\blightning\.pytorch\b"), "pytorch_lightning"),
                (re.compile(r"\blightning\.fabric\b"), "lightning_fabric"))


def installable_for(patch: Patch, root: Path) -> str:
    """The patch's installable part for the package at ``root``. The ``pytorch_lightning`` mirror
    is Lightning's source with its module names rewritten (``lightning.pytorch`` ->
    ``pytorch_lightning``, ``lightning.fabric`` -> ``lightning_fabric``), as Lightning's own build
    makes it: the diff gets the same rewrite, context and added lines alike."""
    diff, root = patch.installable_diff(), Path(root)
    # a patch that also changes Fabric, on the mirrors: applied from site-packages
    in_site = patch.target != "torch" and (root / "pytorch_lightning").is_dir()
    if root.name == "pytorch_lightning" or in_site:
        for name, replacement in MIRROR_NAMES:
            diff = name.sub(replacement, diff)
    if in_site:  # each file's path names its package
        package = {"pytorch": "pytorch_lightning", "fabric": "lightning_fabric"}
        diff = re.sub(r"\b([ab])/src/lightning/(pytorch|fabric)/", lambda m: f"{m[1]}/{package[m[2]]}/", diff)
    return diff


@dataclass
class Check:
    state: str  # applies | drift | already-applied | fails
    detail: str = ""


def _patch(root: Path, level: int, diff: str, *extra: str) -> subprocess.CompletedProcess:
    # --fuzz 0: the patches carry minimal context, and fuzz would let a hunk land anywhere
    return subprocess.run(["patch", f"-p{level}", "--batch", "--forward", "--fuzz", "0",
                           "-d", str(root), *extra], input=diff, capture_output=True, text=True)


def check(patch: Patch, root: Path, level: int, diff: str | None = None) -> Check:
    """Does the patch (or ``diff``, a part of it) apply to the tree at ``root``? Nothing changes."""
    diff = patch.diff if diff is None else diff
    forward = _patch(root, level, diff, "--dry-run")
    if forward.returncode == 0:
        parts = []
        for line in re.findall(r"^Hunk #\d+ succeeded at .*$", forward.stdout, re.M):
            offset, fuzz = re.search(r"offset (-?\d+)", line), re.search(r"fuzz (\d+)", line)
            parts += [f"offset {offset.group(1)} lines"] if offset else []
            parts += [f"fuzz {fuzz.group(1)}"] if fuzz else []
        return Check("drift", ", ".join(parts)) if parts else Check("applies")
    backward = subprocess.run(["patch", f"-p{level}", "--batch", "-R", "--fuzz", "0", "--dry-run",
                               "-d", str(root)], input=diff, capture_output=True, text=True)
    if backward.returncode == 0:
        return Check("already-applied", "the reverse applies: upstream already has it")
    last = (forward.stdout.strip().splitlines() or ["?"])[-1]
    return Check("fails", last)


def apply(patch: Patch, root: Path, level: int, diff: str | None = None) -> None:
    """Apply for real. GNU patch writes new files (never in place), so files hard-linked from
    uv's cache are replaced, not modified. The bytecode compiled from a file it changed is
    removed: bytecode that is not checked against its source would run the old code."""
    diff = patch.diff if diff is None else diff
    proc = _patch(root, level, diff, "--no-backup-if-mismatch")
    if proc.returncode:
        raise PatchError(f"{patch.name} does not apply: {proc.stdout.strip().splitlines()[-1:]}")
    for name in re.findall(r"^\+\+\+ (\S+)", diff, re.M):
        changed = Path(root, *Path(name).parts[level:])
        for stale in changed.parent.glob(f"__pycache__/{changed.stem}.*.pyc"):
            stale.unlink(missing_ok=True)
