"""Lightning's own tests on patched checkouts, for ``nox -s patches``.

What this module knows: which existing test modules cover a patch, which test functions a patch
adds and which of those start several processes, a pytest run read test by test from its JUnit
XML report, and two gates built on them:

- **existing tests**: the test modules covering the files the patch touches run without the
  patch and with it; every test that passed without it must pass with it (compared per test
  node id, not by the summary line's counts).
- **flaky**: each test function the patch adds that starts several processes runs K times; any
  failed run fails the gate, and the table says how it failed (a child's SIGABRT at exit
  included).

A gate is ``{"ok": bool, "text": str}`` (plus ``"details"`` when there is more to keep).
"""

from __future__ import annotations

import ast
import os
import re
import signal
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tools.launch.launcher import Launcher, Run

TESTS = "tests/tests_pytorch"  # where Lightning's pytest runs start (its conftest lives there)
SOURCE = re.compile(r"^src/lightning/pytorch/(?:(.+)/)?(\w+)\.py$")
HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
# a test that starts several processes mentions one of: devices=N with N >= 2 (or a list of
# several), a "ddp..." strategy name, start_method=, nprocs=, world_size=N with N >= 2
MULTI_PROCESS = re.compile(r"""\bdevices\s*=\s*(?:[2-9]\b|[1-9]\d+\b|\[[^\]]*,)"""
                           r"""|["']ddp\w*["']|\bstart_method\s*=|\bnprocs\s*="""
                           r"""|\bworld_size\s*=\s*(?:[2-9]\b|[1-9]\d+\b)""")
BAD = ("failed", "error")
# Lightning's RunIf(standalone=True): skipped unless PL_RUN_STANDALONE_TESTS=1, and then run one
# test per process, as its CI's standalone script does (a test that initializes a process group
# in pytest's own process)
STANDALONE = re.compile(r"\bstandalone\s*=\s*True\b")


def gate(ok: bool, text: str, **details) -> dict:
    return {"ok": bool(ok), "text": text, **({"details": details} if details else {})}


# -- what a patch touches and adds ----------------------------------------------------------

def covering_tests(files: list[str], tree: Path) -> list[str]:
    """The existing test modules of ``tree`` for the Lightning source files among ``files``:
    for ``src/lightning/pytorch/<pkg>/<mod>.py``, ``tests/tests_pytorch/<pkg>/test_<mod>.py`` and
    ``test_<mod>_*.py``."""
    found = set()
    for path in files:
        match = SOURCE.match(path)
        if not match or match.group(2).startswith("_"):
            continue
        folder = Path(tree) / TESTS / (match.group(1) or "")
        mod = match.group(2)
        for test in [folder / f"test_{mod}.py", *folder.glob(f"test_{mod}_*.py")]:
            if test.is_file():
                found.add(str(test.relative_to(tree)))
    return sorted(found)


def added_lines(section: str) -> set[int]:
    """Line numbers, in the new file, of the lines a one-file piece of a diff adds."""
    added: set[int] = set()
    lines = section.split("\n")
    i = 0
    while i < len(lines):
        match = HUNK.match(lines[i])
        i += 1
        if not match:
            continue
        old, new = int(match[1] or 1), int(match[3] or 1)
        line = int(match[2])
        while (old > 0 or new > 0) and i < len(lines):
            kind = lines[i][:1]
            if kind == "+":
                added.add(line)
                line, new = line + 1, new - 1
            elif kind == "-":
                old -= 1
            elif kind != "\\":  # context (an empty line is context whose blank was stripped)
                line, old, new = line + 1, old - 1, new - 1
            i += 1
    return added


def added_tests(path: str, section: str, text: str) -> dict[str, str]:
    """The test functions the diff ``section`` adds to ``path`` (whose new content is ``text``):
    node id -> source, decorators included. A test is added when its ``def`` line is."""
    added = added_lines(section)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    lines = text.splitlines()
    found = {}

    def take(node, prefix: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test") \
                and node.lineno in added:
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            found[f"{prefix}::{node.name}"] = "\n".join(lines[first - 1:node.end_lineno])

    for node in tree.body:
        take(node, path)
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                take(member, f"{path}::{node.name}")
    return found


def is_multi_process(source: str) -> bool:
    return MULTI_PROCESS.search(source) is not None


def is_standalone(source: str) -> bool:
    return STANDALONE.search(source) is not None


def patch_tests(test_changes: dict[str, str], tree: Path) -> dict[str, str]:
    """Every test function the patch adds (node id -> source), read from the patched ``tree``."""
    out: dict[str, str] = {}
    for path, section in test_changes.items():
        file = Path(tree) / path
        if path.endswith(".py") and file.is_file():
            out.update(added_tests(path, section, file.read_text(encoding="utf-8", errors="replace")))
    return out


def multi_process_tests(test_changes: dict[str, str], tree: Path) -> list[str]:
    """Node ids of the test functions the patch adds (``test_changes``: path -> its part of the
    diff) that start several processes, read from the patched ``tree``."""
    out = []
    for path, section in test_changes.items():
        file = Path(tree) / path
        if path.endswith(".py") and file.is_file():
            tests = added_tests(path, section, file.read_text(encoding="utf-8", errors="replace"))
            out += [node for node, source in tests.items() if is_multi_process(source)]
    return out


# -- one pytest run, read per test ----------------------------------------------------------

@dataclass
class Report:
    outcomes: dict[str, str]  # node id (from the checkout's root) -> passed | failed | error | skipped
    returncode: int | None
    output: str = ""
    timed_out: bool = False
    log: str | None = None
    reported: bool = True  # False: pytest wrote no report (it crashed, was killed, timed out)

    def counts(self, files: list[str] | None = None) -> dict[str, int]:
        out: dict[str, int] = {}
        for node, outcome in self.outcomes.items():
            if files is None or node.split("::")[0] in files:
                out[outcome] = out.get(outcome, 0) + 1
        return {k: out[k] for k in ("passed", "failed", "error", "skipped") if k in out}

    def failing(self) -> list[str]:
        return [node for node, outcome in self.outcomes.items() if outcome in BAD]


SEVERITY = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


def read_junit(path: Path) -> dict[str, str]:
    """Outcome per test node id from pytest's JUnit XML (``-o junit_family=xunit1``, which writes
    each test's file). A test listed twice (a failed call, then a teardown error) keeps its worst
    outcome. A collection error is listed under its module."""
    outcomes: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        file, classname, name = case.get("file") or "", case.get("classname") or "", case.get("name") or ""
        module = file.removesuffix(".py").replace("/", ".")
        classes = classname[len(module) + 1:] if file and classname.startswith(module + ".") else ""
        node = "::".join(part for part in (file or classname, classes, name) if part)
        tags = {child.tag for child in case}
        outcome = ("error" if "error" in tags else "failed" if "failure" in tags
                   else "skipped" if "skipped" in tags else "passed")
        if SEVERITY[outcome] >= SEVERITY[outcomes.get(node, "passed")]:
            outcomes[node] = outcome
    return outcomes


def pytest_command(python: Path, tree: Path, targets: list[str], junit: Path) -> list[str]:
    """pytest in ``tree/tests/tests_pytorch`` as Lightning's CI runs it (the checkout's
    ``pyproject.toml`` is its configuration), node ids from the checkout's root."""
    rel = []
    for target in targets:  # relative to where pytest starts
        file, sep, rest = target.partition("::")
        rel.append(os.path.relpath(file, TESTS) + sep + rest)
    return [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--color=no",
            f"--rootdir={tree}", "-o", "junit_family=xunit1", f"--junitxml={junit}", *rel]


def run_pytest(python: Path, tree: Path, targets: list[str], log_stem: Path, timeout: float = 1800,
               env: dict[str, str] | None = None) -> Report:
    """One pytest run over ``targets`` (files or node ids from the checkout's root) in its own
    process group (the harness: the processes the tests start are killed with it, on a timeout
    and on Ctrl-C); stdout and stderr kept at ``log_stem``; ``env``: more variables."""
    tree, log_stem = Path(tree), Path(log_stem)
    junit = Path(f"{log_stem}.xml")
    junit.unlink(missing_ok=True)
    env = {"PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree / 'tests'}", **(env or {})}
    # peer_grace = timeout: the processes a test starts end on their own, test after test
    res = Launcher().run(Run(tuple(pytest_command(python, tree, targets, junit)), kind="exec", env=env,
                             cwd=tree / TESTS, timeout=timeout, peer_grace=timeout, log_stem=log_stem))
    output = "".join(Path(p).read_text(errors="replace") for p in (res.stdout_path, res.stderr_path) if p)
    timed_out = (res.reason or "").startswith("timed out")
    try:
        outcomes, reported = read_junit(junit), True
    except (OSError, ET.ParseError):
        outcomes, reported = {}, False
    return Report(outcomes, res.returncode, output, timed_out, str(log_stem), reported)


def run_tests(python: Path, tree: Path, tests: dict[str, str], log_stem: Path) -> Report:
    """``tests`` (node id -> source) as Lightning's CI runs them: the plain ones in one pytest,
    each standalone one in a pytest of its own with ``PL_RUN_STANDALONE_TESTS=1``; one report."""
    plain = [n for n, source in tests.items() if not is_standalone(source)]
    runs = [run_pytest(python, tree, plain, Path(f"{log_stem}-plain"))] if plain else []
    for i, node in enumerate(n for n in tests if n not in plain):
        runs.append(run_pytest(python, tree, [node], Path(f"{log_stem}-standalone-{i}"),
                               env={"PL_RUN_STANDALONE_TESTS": "1"}))
    merged = Report({}, 0, log=str(log_stem))
    for r in runs:
        merged.outcomes.update(r.outcomes)
        merged.output += r.output
        merged.timed_out = merged.timed_out or r.timed_out
        merged.reported = merged.reported and r.reported
        if merged.returncode == 0:
            merged.returncode = r.returncode
    return merged


def fmt(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in counts.items()) or "no test ran"


# -- the existing-tests gate ------------------------------------------------------------------

def regressions(before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    """The tests that passed before and do not pass after: node id -> what they did after
    (failed, error, skipped, or missing: gone, or not collected)."""
    return {node: after.get(node, "missing") for node, outcome in before.items()
            if outcome == "passed" and after.get(node) != "passed"}


def existing_tests_gate(before: Report | None, after: Report, files: list[str]) -> dict:
    """Every test of ``files`` that passed without the patch passes with it."""
    if not files:
        return gate(True, "no existing test module covers the files it changes")
    if not before.reported:
        return gate(False, f"without the patch pytest wrote no report ({describe(before)})")
    after_outcomes = {n: o for n, o in after.outcomes.items() if n.split("::")[0] in files}
    broken = regressions(before.outcomes, after_outcomes)
    passed = sum(o == "passed" for o in before.outcomes.values())
    text = (f"{len(files)} modules: {fmt(before.counts())} without it; "
            f"{fmt(after.counts(files))} with it")
    if not after.reported:
        return gate(False, f"{text}; with the patch pytest wrote no report ({describe(after)})",
                    broken=broken)
    if broken:
        shown = ", ".join(f"{node.rsplit('/', 1)[-1]} ({outcome})"
                          for node, outcome in list(broken.items())[:3])
        more = f" and {len(broken) - 3} more" if len(broken) > 3 else ""
        how = describe(after)
        how = "" if how.startswith("failed:") else f"; {how}"  # a process that died is named
        return gate(False, f"{text}: {len(broken)} of {passed} that passed do not: {shown}{more}{how}",
                    broken=broken)
    return gate(True, f"{text}: all {passed} that passed still pass")


# -- the flakiness gate -----------------------------------------------------------------------

SIGNALLED = re.compile(r"terminated with signal (SIG[A-Z]+)")
EXIT_CODE = re.compile(r"exit ?code[ =:]+(-\d+)", re.I)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe(report: Report) -> str:
    """How a run failed, in a few words: a process that died of a signal (a child's SIGABRT at
    exit, "terminate called without an active exception", a segfault) is named, never hidden
    behind "failed"; then the tests that failed."""
    text, rc = report.output, report.returncode
    names = ", ".join(node.rsplit("::", 1)[-1] for node in report.failing())
    if report.timed_out:
        how = "timed out; its processes were killed"
    elif rc is not None and rc < 0:
        how = f"the test process died of {signal_name(-rc)}"
    elif match := SIGNALLED.search(text):
        how = f"a child process died of {match.group(1)}"
    elif match := EXIT_CODE.search(text):
        how = f"a child process died of {signal_name(-int(match.group(1)))}"
    elif re.search(r"\bAborted\b|core dumped|terminate called", text):
        how = "a process aborted (SIGABRT)"
    elif "Segmentation fault" in text:
        how = "a process crashed (SIGSEGV)"
    elif names:
        return f"failed: {names}"
    else:
        return f"exit {rc}" + ("" if report.reported else ", no report")
    return f"{how} ({names})" if names else how


def run_failed(report: Report) -> bool:
    return report.returncode != 0 or bool(report.failing()) or not report.reported


def flaky_gate(tests: list[str], repeat: int, run_once: Callable[[int], Report]) -> dict:
    """Run ``tests`` (node ids) ``repeat`` times, ``run_once(i)`` each (i from 1); any failed run
    fails the gate. The text counts the failed runs and says how each failed."""
    if not tests:
        return gate(True, "no new multi-process test")
    runs = []
    for i in range(1, repeat + 1):
        report = run_once(i)
        failed = run_failed(report)
        runs.append({"run": i, "failed": failed, "returncode": report.returncode,
                     "how": describe(report) if failed else "passed", "log": report.log,
                     "outcomes": report.outcomes})
    bad = [r for r in runs if r["failed"]]
    names = ", ".join(t.rsplit("::", 1)[-1] for t in tests)
    text = f"{len(bad)}/{repeat} failed ({len(tests)} tests: {names})"
    if bad:
        text += ": " + "; ".join(f"run {r['run']}: {r['how']}" for r in bad)
    elif all(r["outcomes"] and set(r["outcomes"].values()) == {"skipped"} for r in runs):
        text += ", but skipped in every run"
    return gate(not bad, text, tests=tests, runs=runs)
