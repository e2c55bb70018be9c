"""Lightning's static gates for a patch: its mypy check, ruff lint and format, the license header
of new files, and the CHANGELOG entry. Each runs on plain source trees (``before``: without the
patch, ``after``: with it) and answers with a ``Gate``.

The tools run at the versions the tree pins (mypy in ``requirements/typing.txt``, ruff in
``.pre-commit-config.yaml``) with the tree's own configuration (``pyproject.toml``). Lightning's
master is not clean under every tool and torch, so mypy and ruff are judged on what the patch
adds: findings on ``after`` that ``before`` does not have, compared without line numbers (lines
move when code is inserted above them).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from tools.core import contract
from tools.environments import envs, index
from tools.series import patches

# mypy imports the tree's dependencies: torch is the workspace's test torch, not the pin of
# requirements/typing.txt (a CUDA build of several GB); the baseline comparison absorbs the
# errors a newer torch brings to master itself
TORCH = "2.13.0"
RUNTIME = ("requirements/pytorch/base.txt", "requirements/fabric/base.txt")
MYPY_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "mypy"
CHANGELOGS = {"pytorch": "src/lightning/pytorch/CHANGELOG.md", "fabric": "src/lightning/fabric/CHANGELOG.md"}
SECTIONS = patches.CHANGELOG_SECTIONS
LINK = re.compile(r"\(\[#(\d+)\]\(https://github\.com/Lightning-AI/pytorch-lightning/(?:issues|pull)/(\d+)\)\)$")
# the link of an entry whose issue or PR does not exist yet: `nox -s pr -- PATCH --number N` fills it in
PENDING = "([#PR](https://github.com/Lightning-AI/pytorch-lightning/pull/PR))"
COPYRIGHT = re.compile(r"^# Copyright .*Lightning", re.M)
LICENSE = re.compile(r"^# Licensed under the Apache License, Version 2\.0", re.M)


class GateError(contract.BadInput):
    """A tree the gates cannot read (no mypy pin, no pyproject.toml): exit 2."""


@dataclass(frozen=True)
class Gate:
    name: str  # "types", "lint", "license", "changelog"
    ok: bool
    text: str  # one short line for a table cell
    details: str = ""  # full output, for the log file


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# -- types ------------------------------------------------------------------------------------

def _requirements(path: Path) -> list[Requirement]:
    """The requirements listed in a requirements file (comments and pip options left out)."""
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line or line.startswith("-"):
            continue
        try:
            out.append(Requirement(line))
        except InvalidRequirement:
            raise GateError(f"{path.name}: not a requirement: {line!r}") from None
    return out


def mypy_version(tree: Path) -> str:
    """The mypy version pinned (``mypy==X``) in the tree's ``requirements/typing.txt``."""
    path = Path(tree) / "requirements" / "typing.txt"
    if not path.exists():
        raise GateError(f"{tree} has no requirements/typing.txt (the mypy pin)")
    for req in _requirements(path):
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if req.name == "mypy" and len(pins) == 1:
            return pins[0]
    raise GateError(f"{path} pins no mypy version (mypy==X)")


def mypy_env_args(tree: Path) -> tuple[str, list[str]]:
    """mypy's version and the ``uv pip install`` arguments of its environment: the test torch,
    the tree's runtime requirements, the pinned mypy and the stub packages of typing.txt."""
    tree = Path(tree)
    version = mypy_version(tree)  # the patched tree's pin serves both trees
    typing = _requirements(tree / "requirements" / "typing.txt")
    stubs = [str(r) for r in typing if r.name.startswith("types-")]
    runtime = sorted({str(r) for rel in RUNTIME if (tree / rel).exists()
                      for r in _requirements(tree / rel) if r.name != "torch"})
    return version, [f"torch=={TORCH}", *runtime, f"mypy=={version}", *stubs]


def mypy_env(tree: Path, log=print) -> tuple[str, Path]:
    """mypy's version and the python of its cached environment (one per version and requirements)."""
    version, args = mypy_env_args(tree)
    digest = hashlib.sha256(json.dumps(args).encode()).hexdigest()[:8]
    return version, envs.ensure(f"gates-mypy-{version}-{digest}", args, log=log)


def mypy_errors(python: Path, tree: Path, files: list[str], version: str) -> list[dict]:
    """mypy's errors (its JSON records, paths relative to the tree) on ``files`` of ``tree``, with
    the tree's ``[tool.mypy]`` config and the tree's ``src`` as the package root."""
    tree = Path(tree)
    if not (tree / "pyproject.toml").exists():
        raise GateError(f"{tree} has no pyproject.toml (mypy's configuration)")
    # the config asks mypy to pip-install missing stubs: they are in the environment already
    cmd = [str(python), "-m", "mypy", "--config-file", "pyproject.toml", "--output", "json",
           "--no-install-types", "--interactive", "--cache-dir", str(MYPY_CACHE / version), *files]
    env = {**os.environ, "MYPYPATH": "src"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
    errors = []
    for line in proc.stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("severity") == "error":
            errors.append({**record, "file": _relative(record["file"], tree)})
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not errors):
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"mypy failed (exit {proc.returncode}): {last[0][:200]}")
    return errors


def _key(error: dict) -> tuple:
    """An error as compared between the trees: its file, code and message, not its line."""
    return error["file"], error.get("code"), error["message"]


def _relative(path: str, tree: Path) -> str:
    p = Path(path)
    if p.is_absolute():
        try:
            return str(p.resolve().relative_to(Path(tree).resolve()))
        except ValueError:
            return path
    return path


def _new(before: list[tuple], after: list[tuple]) -> Counter:
    """Findings of ``after`` that ``before`` does not have, counted (a duplicate counts twice)."""
    return Counter(after) - Counter(before)


def typecheck(before: Path, after: Path, files: list[str], log=print) -> Gate:
    """Lightning's mypy job on the patch: the ``src/`` Python files it touches, checked on both
    trees; any error on ``after`` whose (file, error code, message) ``before`` does not have fails
    the gate. mypy follows the files' imports into the tree's ``src`` and reports errors there too:
    a change that breaks a module the touched files import counts, one that breaks only an importer
    of them does not (Lightning's CI checks all of ``src/lightning``)."""
    files = [f for f in files if f.startswith("src/") and f.endswith(".py")]
    if not files:
        return Gate("types", True, "no Python file under src/ changed")
    try:
        version, python = mypy_env(after, log=log)
    except envs.EnvError as err:
        return Gate("types", False, f"not run: {err}")
    found = {}
    for label, tree in (("before", before), ("after", after)):
        present = [f for f in files if (Path(tree) / f).exists()]
        start = time.monotonic()
        try:
            found[label] = mypy_errors(python, tree, present, version) if present else []
        except RuntimeError as err:
            return Gate("types", False, f"mypy {version} on {label}: {err}", str(err))
        log(f"  [gates] mypy {version} on {label}: {_plural(len(found[label]), 'error')} "
            f"({time.monotonic() - start:.0f} s)")
    new = _new([_key(e) for e in found["before"]], [_key(e) for e in found["after"]])
    listing = "\n".join(f"{e['file']}:{e['line']}: error: {e['message']}  [{e.get('code')}]"
                        for e in found["after"])
    baseline = len(found["before"])
    if not new:
        return Gate("types", True, f"mypy {version}: no new errors (baseline {baseline})",
                    f"mypy {version} on the patched tree:\n{listing}")
    lines = []
    for (file, code, message), n in new.items():
        where = ", ".join(str(e["line"]) for e in found["after"] if _key(e) == (file, code, message))
        lines.append(f"{file}:{where}: error: {message}  [{code}]" + (f" ({n} new)" if n > 1 else ""))
    file, code, message = next(iter(new))
    text = (f"mypy {version}: {_plural(new.total(), 'new error')}: {Path(file).name}: "
            f"{_short(message)} [{code}]")
    details = (f"new errors (not on the tree without the patch; baseline {baseline}):\n" + "\n".join(lines)
               + f"\n\nmypy {version} on the patched tree:\n{listing}")
    return Gate("types", False, text, details)


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


# -- lint -------------------------------------------------------------------------------------

def ruff_version(tree: Path) -> str | None:
    """The ruff version the tree's pre-commit hooks pin (``ruff-pre-commit``'s ``rev``), or None."""
    path = Path(tree) / ".pre-commit-config.yaml"
    if not path.exists():
        return None
    match = re.search(r"ruff-pre-commit['\"]?\s*\n\s*rev:\s*['\"]?v?([\w.]+)", path.read_text())
    return match.group(1) if match else None


def _ruff(version: str, tree: Path, *args: str) -> subprocess.CompletedProcess:
    # --no-cache: nothing is written into the tree
    return subprocess.run([index.uv(), "tool", "run", f"ruff@{version}", *args], cwd=tree,
                          capture_output=True, text=True, timeout=600)


def _lint_findings(version: str, tree: Path, files: list[str]) -> tuple[list[tuple], list[str]]:
    """(file, code, message) of ``ruff check`` and of ``ruff format --diff`` (each line the
    formatter would rewrite) on ``files``, and readable lines for the log."""
    if not files:
        return [], []
    check = _ruff(version, tree, "check", "--no-fix", "--no-cache", "--force-exclude",
                  "--output-format", "json", *files)
    if check.returncode not in (0, 1):
        raise RuntimeError(f"ruff check failed: {(check.stderr.strip().splitlines() or ['?'])[-1]}")
    keys, shown = [], []
    for f in json.loads(check.stdout or "[]"):
        name = _relative(f["filename"], tree)
        keys.append((name, f["code"], f["message"]))
        shown.append(f"{name}:{f['location']['row']}: {f['code']} {f['message']}")
    fmt = _ruff(version, tree, "format", "--diff", "--no-cache", "--force-exclude", *files)
    if fmt.returncode not in (0, 1):
        raise RuntimeError(f"ruff format failed: {(fmt.stderr.strip().splitlines() or ['?'])[-1]}")
    lines, name = fmt.stdout.splitlines(), None
    for i, line in enumerate(lines):
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            name = _relative(line[4:].strip(), tree)
        elif name and line[:1] in ("+", "-") and not line.startswith("+++ "):
            keys.append((name, "format", line))
    shown += [f"{n}: would be reformatted" for n in dict.fromkeys(k[0] for k in keys if k[1] == "format")]
    return keys, shown + ([f"\nruff format --diff:\n{fmt.stdout}"] if fmt.stdout.strip() else [])


def _count(keys: list[tuple]) -> int:
    """Findings: each of ``ruff check``, and each file the formatter would change."""
    return sum(k[1] != "format" for k in keys) + len({k[0] for k in keys if k[1] == "format"})


def lint(after: Path, changed: list[str], log=print, *, before: Path | None = None) -> Gate:
    """Lightning's pre-commit ruff hooks on the patch: ``ruff check`` and ``ruff format`` with the
    tree's configuration on the whole changed Python files (``src/`` and ``tests/``), at the ruff
    version of its ``.pre-commit-config.yaml`` (the newest ruff when it pins none, said in the
    text). With ``before`` (the tree without the patch), findings a file has there too do not
    count; without it every finding on the changed files does."""
    files = [f for f in changed if f.startswith(("src/", "tests/")) and f.endswith(".py")]
    files = [f for f in files if (Path(after) / f).exists()]
    if not files:
        return Gate("lint", True, "no Python file under src/ or tests/ changed")
    pinned = ruff_version(after)
    version = pinned or "latest"
    try:
        found = _ruff(version, after, "--version")
        if found.returncode:
            raise RuntimeError(f"ruff {version}: {(found.stderr.strip().splitlines() or ['?'])[-1]}")
        label = found.stdout.strip() + ("" if pinned else " (the newest: the tree pins no ruff)")
        old = [f for f in files if before is not None and (Path(before) / f).exists()]
        base_keys, _ = _lint_findings(version, before, old) if old else ([], [])
        keys, shown = _lint_findings(version, after, files)
    except (RuntimeError, ValueError) as err:
        return Gate("lint", False, f"not run: {err}", str(err))
    new = _new(base_keys, keys)
    log(f"  [gates] {label}: {_count(keys)} findings on the patched files, {_count(base_keys)} without "
        f"the patch")
    if not new:
        return Gate("lint", True, f"{label}: no new findings (baseline {_count(base_keys)})",
                    "\n".join(shown))
    checks = [k for k in new.elements() if k[1] != "format"]
    unformatted = sorted({k[0] for k in new.elements() if k[1] == "format"})
    parts = []
    if checks:
        file, code, message = checks[0]
        parts.append(f"{_plural(len(checks), 'new finding')}: {Path(file).name}: {code} "
                     f"{_short(message, 80)}")
    if unformatted:
        parts.append(f"not ruff-formatted: {', '.join(Path(f).name for f in unformatted)}")
    details = "new findings:\n" + "\n".join(f"{f}: {c} {m}" for f, c, m in checks) + \
        "\n\nall findings on the patched files:\n" + "\n".join(shown)
    return Gate("lint", False, f"{label}: " + "; ".join(parts), details)


# -- license headers --------------------------------------------------------------------------

def license_headers(after: Path, added: list[str]) -> Gate:
    """Every Python file the patch adds carries Lightning's Apache header: its first comment
    block has the copyright line (``# Copyright ... Lightning ...``) and the license line
    (``# Licensed under the Apache License, Version 2.0``). Empty files (a bare ``__init__.py``,
    as Lightning's own are) need none; other files are not checked."""
    files = [f for f in added if f.endswith(".py")]
    missing = []
    for rel in files:
        text = (Path(after) / rel).read_text()
        if not text.strip():
            continue
        head = "".join(line for line in text.splitlines(keepends=True)[:20] if line.startswith("#"))
        if not (COPYRIGHT.search(head) and LICENSE.search(head)):
            missing.append(rel)
    if missing:
        return Gate("license", False, f"no Apache header in {', '.join(Path(f).name for f in missing)}",
                    "new files without Lightning's Apache license header:\n" + "\n".join(missing))
    if not files:
        return Gate("license", True, "no new Python file")
    return Gate("license", True, f"{_plural(len(files), 'new file')}: header present")


# -- changelog --------------------------------------------------------------------------------

def _public_api(source: str) -> set[str]:
    """The public names a module defines: classes, functions, methods, and their parameters
    (``Cls.method(param)``). Private names (leading underscore), private classes' members and
    methods marked ``@override`` (they implement an existing hook) are left out."""
    out: set[str] = set()

    def decorated_override(node) -> bool:
        return any((d.id if isinstance(d, ast.Name) else getattr(d, "attr", None)) == "override"
                   for d in node.decorator_list)

    def visit(body, prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                out.add(prefix + node.name)
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not decorated_override(node):
                if node.name.startswith("_") and node.name != "__init__":
                    continue
                name = prefix + node.name
                if node.name != "__init__":
                    out.add(name)
                args = node.args
                out.update(f"{name}({a.arg})" for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)
                           if not a.arg.startswith("_") and a.arg not in ("self", "cls"))

    visit(ast.parse(source).body, "")
    return out


def _unpatched(after: Path, path: str, section: str) -> str:
    """The file at ``path`` as it was before the patch: its diff ``section`` reversed."""
    if re.search(r"(?m)^--- /dev/null", section):
        return ""
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / path
        target.parent.mkdir(parents=True)
        shutil.copyfile(Path(after) / path, target)
        proc = subprocess.run(["patch", "-R", "-p1", "--batch", "--fuzz", "0", "--silent", "-d", tmp],
                              input=section, capture_output=True, text=True)
        if proc.returncode:
            raise GateError(f"{path}: the patch does not reverse on the patched tree")
        return target.read_text()


def added_public_api(patch: patches.Patch, after: Path) -> list[str]:
    """Public names and parameters the patch adds to public modules of ``src/``."""
    found = []
    for path, section in patch.sections().items():
        parts = Path(path).parts
        if not (path.startswith("src/") and path.endswith(".py")) or not (Path(after) / path).exists():
            continue
        if any(p.startswith("_") and not p.startswith("__") for p in parts):
            continue  # a private module
        new = _public_api((Path(after) / path).read_text()) - _public_api(_unpatched(after, path, section))
        found += sorted(new)
    return found


def _added_lines(section: str) -> list[tuple[int, str]]:
    """(line number in the patched file, text) of each line a file's diff adds."""
    out, number = [], 0
    for line in section.splitlines():
        hunk = re.match(r"@@ -\d+(?:,\d+)? \+(\d+)", line)
        if hunk:
            number = int(hunk.group(1))
        elif number and line.startswith("+"):
            out.append((number, line[1:]))
            number += 1
        elif number and (line.startswith(" ") or line == ""):
            number += 1
    return out


def _expected_sections(patch: patches.Patch, api: list[str]) -> tuple[set[str], str]:
    declared = patch.headers.get("X-Changelog", "").split()
    unknown = [d for d in declared if d not in SECTIONS]
    if unknown:
        raise GateError(f"{patch.name}: X-Changelog: {unknown[0]!r} is not one of {', '.join(SECTIONS)}")
    if declared:
        return set(declared), "as the patch declares (X-Changelog)"
    if api:
        return {"Added"}, f"the patch adds public API: {', '.join(api[:3])}"
    if re.search(r"/issues/\d+", patch.headers.get("Bug", "")):
        return {"Fixed"}, "a fix of the issue in its Bug field"
    return {"Changed"}, "a change that fixes no issue and adds no public API"


def _entry_problems(lines: list[str], number: int, text: str) -> tuple[str | None, list[str]]:
    """The section of the entry at line ``number`` (1-based) of a CHANGELOG, and what is wrong
    with its place and format."""
    problems, release, section = [], "", None
    for line in reversed(lines[:number - 1]):
        if line.startswith("### ") and section is None:
            section = line[4:].strip()
        if line.startswith("## "):
            release = line
            break
    if not re.match(r"## \[unreleased\]", release, re.I):
        problems.append(f"not under the unreleased heading (under {release.strip() or 'no release'!r})")
    if section not in SECTIONS:
        problems.append(f"not in a {'/'.join(SECTIONS)} section")
    match = LINK.search(text.rstrip())
    if text.rstrip().endswith(PENDING):
        pass  # no issue or PR yet: its PR's own number, once opened
    elif not match:
        problems.append("does not end with the link ([#N](https://github.com/Lightning-AI/pytorch-lightning/"
                        f"issues/N)), or {PENDING} until the PR exists")
    elif match.group(1) != match.group(2):
        problems.append(f"link text #{match.group(1)} and its target {match.group(2)} differ")
    if number < 2 or lines[number - 2].strip() or (number < len(lines) and lines[number].strip()):
        problems.append("not separated from its neighbours by blank lines")
    return section, problems


def changelog(patch: patches.Patch, after: Path) -> Gate:
    """The patch's CHANGELOG entries, as Lightning's reviewers want them.

    - Every Lightning package whose ``src/`` the patch changes (pytorch, fabric) gets at least
      one entry in its ``CHANGELOG.md``; a patch with none fails.
    - Each added line is a ``- `` bullet (or blank), under ``## [unreleased]``, inside one of its
      ``### Added/Changed/Deprecated/Removed/Fixed`` sections, separated from its neighbours by
      blank lines as they are, and ends with ``([#N](https://github.com/Lightning-AI/
      pytorch-lightning/issues/N))`` (or ``pull/N``), or with ``PENDING``, the PR's own number before
      it exists (``nox -s pr -- PATCH --number N`` puts it in). A section it lands in keeps
      no bare ``-`` placeholder.
    - Section: ``Added`` when the patch adds public API (a public class or function, or a public
      parameter of one, in a public module; ``@override`` methods implement existing hooks and do
      not count); otherwise ``Fixed`` when its ``Bug:`` field names an issue; otherwise
      ``Changed``. An ``X-Changelog: <Section> ...`` field declares the section(s) instead. Each
      expected section gets an entry; a patch with a ``Bug:`` issue may also have ``Fixed``
      entries (the usual "Added X" + "Fixed Y" pair); any other section fails.
    """
    if patch.target != "lightning":
        return Gate("changelog", True, f"not checked: a {patch.target} patch")
    sections = patch.sections()
    touched = {p.split("/")[2] for p in sections
               if p.startswith("src/lightning/") and p.endswith(".py") and p.split("/")[2] in CHANGELOGS}
    api = added_public_api(patch, after)
    expected, why = _expected_sections(patch, api)
    allowed = expected | ({"Fixed"} if re.search(r"/issues/\d+", patch.headers.get("Bug", "")) else set())
    problems, seen = [], Counter()
    for package, path in CHANGELOGS.items():
        added = _added_lines(sections.get(path, ""))
        if package in touched and not any(text.startswith("- ") for _, text in added):
            problems.append(f"no entry in {path}")
        if not added:
            continue
        lines = (Path(after) / path).read_text().splitlines()
        for number, text in added:
            if not text.strip():
                continue
            where = f"{package} CHANGELOG line {number}"
            if not text.startswith("- "):
                problems.append(f"{where}: not a '- ' bullet: {_short(text, 60)!r}")
                continue
            section, wrong = _entry_problems(lines, number, text)
            problems += [f"{where}: {w}" for w in wrong]
            if section:
                seen[section] += 1
                if section not in allowed:
                    problems.append(f"{where}: under {section}, expected {'/'.join(sorted(expected))} "
                                    f"({why})")
                if _has_placeholder(lines, number):
                    problems.append(f"{where}: its {section} section still has the bare '-' placeholder")
    if not touched and not seen and not problems:
        problems.append("no CHANGELOG entry")
    missing = sorted(expected - set(seen))
    if seen and missing:
        problems.append(f"no {'/'.join(missing)} entry ({why})")
    if problems:
        return Gate("changelog", False, _short(problems[0], 160) +
                    (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""), "\n".join(problems))
    pending = any(text.rstrip().endswith(PENDING) for path in CHANGELOGS.values()
                  for _, text in _added_lines(sections.get(path, "")))
    return Gate("changelog", True, f"{', '.join(f'{n} {s}' for s, n in seen.items())} entry under unreleased"
                + ("; its link waits for the PR's number" if pending else ""),
                f"expected {'/'.join(sorted(expected))}: {why}")


def _has_placeholder(lines: list[str], number: int) -> bool:
    """Does the ``###`` section holding line ``number`` still have a bare ``-`` line?"""
    start = next((i for i in range(number - 2, -1, -1) if lines[i].startswith("#")), 0)
    end = next((i for i in range(number, len(lines)) if lines[i].startswith(("#", "---"))), len(lines))
    return any(line.strip() == "-" for line in lines[start + 1:end])
