"""Upstream's gates for one patch of the series: its tests against Lightning master in
worktrees (the new tests fail without the patch and pass with it, the existing ones still pass,
the flaky gate), types, lint, license and changelog (``tools/series/gates.py``), open upstream work,
and for a torch patch, torch's own tests on the cell's torch."""

from __future__ import annotations

import os
import re
import subprocess
from datetime import datetime
from pathlib import Path

from tools.core import results
from tools.environments import envs, index, matrix
from tools.launch.launcher import Launcher, Run
from tools.series import claims, patches, torch_host
from tools.series import upstream_tests as ut
from tools.series.patched import CACHE, patched_env, scratch, site_packages

TEST_TORCH = "2.13.0"  # the torch of the upstream test environment
# the oldest torch of Lightning's CPU CI (its ci-tests-pytorch workflow: "2.1"), newest patch release
OLDEST_TORCH = "2.1.2"
REPEAT = 5  # runs of each new multi-process test (the flaky gate)


# -- the gates: once per patch, on checkouts ----------------------------------------------------

GATES = ("upstream tests", "existing tests", "flaky", "oldest torch", "with torch's patches", "types", "lint",
         "license", "changelog", "open upstream work", "claims", "behaviour kept")
CELL_GATES = ("setups kept",)  # run in the cell's environments, per row (tools/series/kept.py)


OTHER_GATES = ("types", "lint", "license", "changelog")  # tools/series/gates.py's
SPARSE = ("/src/", "/requirements/", "/tests/", "/pyproject.toml", "/.pre-commit-config.yaml")
_UPSTREAM: dict[str, tuple[str, dict]] = {}  # per patch: the same answer for every cell
_TREES: dict[str, tuple] = {}


def upstream(patch: patches.Patch, cell: matrix.Cell, out: Path, repeat: int = REPEAT,
             log=print) -> tuple[str, dict[str, dict]]:
    """The checkout states and the gates of a patch (see ``GATES``), on two sparse worktrees of
    a Lightning checkout at master, both with the earlier Lightning patches of the series
    applied: *before* without the patch, *after* with it. A torch patch's own tests run on the
    cell's torch instead (no torch checkout here).

    - upstream tests: the patch's test changes alone must fail; the test files it names
      (``X-Tests``) must pass with it;
    - existing tests, flaky: ``tools/series/upstream_tests.py``;
    - types, lint, license, changelog: ``tools/series/gates.py`` (``other_gates``);
    - open upstream work: ``tools/series/open_work.py``;
    - claims, behaviour kept: ``tools/series/claims.py`` (each claim of the description backed by a
      test, a cited line, a recorded run or a commit; a patch that wraps again or restores state
      shows by a test what survives).
    """
    if patch.target == "torch":
        return "not checked: no torch checkout", torch_gates(patch, cell, out, repeat, log)
    if not os.environ.get("LIGHTNING_REPO"):
        return ("skipped: no Lightning checkout configured (LIGHTNING_REPO)",
                {name: ut.gate(True, "skipped: no LIGHTNING_REPO") for name in GATES})
    if patch.name not in _UPSTREAM:
        _UPSTREAM[patch.name] = lightning_gates(patch, out / "logs" / patch.name / "upstream", repeat, log)
    return _UPSTREAM[patch.name]


def worktrees(repo) -> tuple:
    """The *before* and *after* worktrees of the Lightning clone, each claimed for the life of
    this process (two validations at once take their own), with what the gates need checked out."""
    from tools.stages import gitrange

    if repo.git_dir not in _TREES:
        pair = tuple(gitrange.Worktree.claim(repo, CACHE / "worktrees" / f"upstream-{side}")
                     for side in ("before", "after"))
        for wt in pair:
            wt.git.sparse_checkout("set", "--no-cone", *SPARSE)
        _TREES[repo.git_dir] = pair
    return _TREES[repo.git_dir]


def lightning_gates(patch: patches.Patch, logs: Path, repeat: int, log=print) -> tuple[str, dict]:
    from tools.stages import gitrange

    series = patches.series(patch.path.parent)  # read again: its files may have changed, find it by name
    names = [p.name for p in series]
    k = names.index(patch.name) if patch.name in names else 0
    earlier = [p for p in series[:k] if p.target == "lightning"]
    repo = gitrange.open_repo(os.environ["LIGHTNING_REPO"], CACHE / "repos")
    before_wt, after_wt = worktrees(repo)
    states = checkout_states(patch, repo, after_wt, earlier)
    master = gitrange.resolve(repo, "master")
    before = on_top_of(before_wt, master, earlier)
    moment = datetime.fromisoformat(gitrange.commit_info(repo, master).date)
    python = envs.ensure(f"upstream-tests-{master[:12]}",
                         envs.era_args([*before_wt.requirements(), "pytest"], TEST_TORCH, moment), log=log)
    tests = patch.test_changes()
    named = patch.headers.get("X-Tests", "").split() or list(tests)
    alone = None
    if tests:  # without the fix: only the patch's test changes, applied alone, must fail
        patches.apply(patch, on_top_of(after_wt, master, earlier), 1, "".join(tests.values()))
        alone = ut.run_pytest(python, after_wt.path, list(tests), logs / "its-tests-without-the-fix")
    after = on_top_of(after_wt, master, earlier)
    patches.apply(patch, after, 1)
    gates = other_gates(patch, before, after, logs, log)  # on trees no test has run in yet
    covering = ut.covering_tests(patch.files, before)
    existing = sorted({*covering, *(f for f in named if (before / f).is_file())})
    present = [f for f in named if (after / f).is_file()]
    log(f"  {patch.name}: existing tests ({len(existing)} modules) without and with it")
    without = ut.run_pytest(python, before, existing, logs / "existing-without") if existing else None
    targets = sorted({*existing, *present})  # (no target at all would be the whole test suite)
    with_it = ut.run_pytest(python, after, targets, logs / "with") if targets else ut.Report({}, 0)
    gates["upstream tests"] = upstream_tests_gate(tests, alone, with_it, named, present)
    gates["existing tests"] = ut.existing_tests_gate(without, with_it, existing)
    added = ut.patch_tests(tests, after)
    several = ut.multi_process_tests(tests, after)
    if several:
        log(f"  {patch.name}: {len(several)} new multi-process tests, {repeat} runs")
    gates["flaky"] = ut.flaky_gate(several, repeat, lambda i: ut.run_tests(
        python, after, {n: added[n] for n in several}, logs / f"flaky-{i}"))
    gates["oldest torch"] = oldest_torch_gate(before_wt.requirements(), moment, after, added, logs, log)
    gates["with torch's patches"] = torch_series_gate(series, python, after, added, logs, log)
    gates["open upstream work"] = open_upstream_work(patch, repo, master, log)
    runs = [with_it.outcomes, *(r["outcomes"] for r in gates["flaky"].get("details", {}).get("runs", []))]
    gates["claims"] = claims.gate(patch.name, patch.headers["Description"], claims.load().get(patch.name, []),
                                  set(added), runs, None, site_packages(python), repo, master)
    gates["behaviour kept"] = claims.kept_gate(patch, gates["claims"])
    for wt in (before_wt, after_wt):
        wt.checkout(master)
    return states, {name: gates[name] for name in GATES}


def open_upstream_work(patch: patches.Patch, repo, master: str, log=print) -> dict:
    """The unmerged PRs that change the patch's files or name its issue (``tools/series/open_work.py``)."""
    from tools.series import open_work

    log(f"  {patch.name}: the unmerged PRs that change its files")
    issue = open_work.issue_number(patch.headers["Bug"])
    return open_work.gate(patch.headers["Description"], issue,
                          open_work.related(repo, master, patch.files, issue, patch.diff))


def torch_series_gate(series: list[patches.Patch], python: Path, after: Path, added: dict[str, str],
                      logs: Path, log=print) -> dict:
    """The series together across targets: the tests a Lightning patch adds also pass on a torch
    with every torch patch of the series applied (a throwaway copy of the upstream test
    environment whose installed torch files are patched), as they will once both are merged."""
    torch_series = [p for p in series if p.target == "torch"]
    if not torch_series:
        return ut.gate(True, "no torch patch in the series")
    if not added:
        return ut.gate(True, "the patch adds no test")
    names = ", ".join(p.name for p in torch_series)
    log(f"  {logs.parent.name}: its {len(added)} tests on torch with {names}")
    with scratch("torch-series-") as tmp:
        try:
            python = patched_env(["--requirements", str(freeze(python, tmp / "requirements.txt"))],
                                 tmp / "env", torch_series, python)
        except subprocess.CalledProcessError as err:
            return ut.gate(False, f"cannot copy the test environment ({' '.join(err.cmd[:3])} failed)")
        report = ut.run_tests(python, after, added, logs / "with-torch-patches")
    return added_tests_gate(report, f"on torch with {names}")


def oldest_torch_gate(requirements: list[str], moment: datetime, after: Path, added: dict[str, str],
                      logs: Path, log=print) -> dict:
    """The tests the patch adds also pass on the oldest torch of Lightning's CPU CI
    (``OLDEST_TORCH``), in an environment of master's requirements as of its date."""
    if not added:
        return ut.gate(True, "the patch adds no test")
    log(f"  {logs.parent.name}: its {len(added)} tests on torch {OLDEST_TORCH}")
    python = envs.ensure(f"upstream-tests-torch{OLDEST_TORCH}",
                         envs.era_args([*requirements, "pytest"], OLDEST_TORCH, moment), log=log)
    report = ut.run_tests(python, after, added, logs / f"torch-{OLDEST_TORCH}")
    return added_tests_gate(report, f"on torch {OLDEST_TORCH}")


def added_tests_gate(report: ut.Report, where: str) -> dict:
    """The patch's added tests, run somewhere else: at least one passed, none failed."""
    counts = report.counts()
    ok = report.reported and counts.get("passed", 0) > 0 and not ut.run_failed(report)
    how = "" if ok else f" ({ut.describe(report)})"
    return ut.gate(ok, f"{where}: {ut.fmt(counts)}{how}")


def freeze(python: Path, path: Path) -> Path:
    """What ``python``'s environment holds, pinned, as a requirements file (the same packages in a
    copy, from uv's cache)."""
    out = subprocess.run([index.uv(), "pip", "freeze", "--python", str(python)], capture_output=True,
                         text=True, check=True).stdout
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out)
    return path


def upstream_tests_gate(tests: dict, alone, with_it, named: list[str], present: list[str]) -> dict:
    """The patch's test changes fail on master without the fix; the files of ``X-Tests`` pass
    with it."""
    if not tests:
        return ut.gate(False, "the patch adds no test (a PR needs one that fails without the fix)")
    before, after = alone.counts(), with_it.counts(present)
    missing = [f for f in named if f not in present]
    ok = (before.get("failed", 0) > 0 and after.get("passed", 0) > 0 and not after.get("failed")
          and not after.get("error") and not missing)
    failing = [n for n in with_it.failing() if n.split("::")[0] in present]
    how = f" ({ut.describe(with_it)})" if failing or not with_it.reported else ""
    return ut.gate(ok, f"master + its tests: {_fmt(before)}; patched: {_fmt(after)}{how}"
                       + (f"; X-Tests names missing files: {', '.join(missing)}" if missing else ""))


def added_files(patch: patches.Patch) -> list[str]:
    """The files the patch creates."""
    return [path for path, text in patch.sections().items()
            if re.search(r"(?m)^(new file mode |--- /dev/null)", text)]


def other_gates(patch: patches.Patch, before: Path, after: Path, logs: Path, log=print) -> dict[str, dict]:
    """THE PLACE where the gates of ``tools/series/gates.py`` plug in: types, lint, license headers and
    the CHANGELOG entry, on the *before* and *after* trees. Without that module they are not run;
    a gate that raises fails, with the error as its text. A gate's full output goes to
    ``logs/<gate>.txt``."""
    try:
        from tools.series import gates
    except ModuleNotFoundError as err:
        if err.name != "tools.series.gates":
            raise
        return {name: ut.gate(True, "not run: no tools/series/gates.py") for name in OTHER_GATES}
    python_files = [f for f in patch.files if f.endswith(".py")]
    calls = {"types": lambda: gates.typecheck(before, after, python_files, log),
             "lint": lambda: gates.lint(after, patch.files, log, before=before),
             "license": lambda: gates.license_headers(after, added_files(patch)),
             "changelog": lambda: gates.changelog(patch, after)}
    out = {}
    for name, call in calls.items():
        try:
            result = call()
        except Exception as err:  # noqa: BLE001  (a gate that cannot run fails, it does not stop the rest)
            out[name] = ut.gate(False, f"could not run: {type(err).__name__}: {err}")
            continue
        out[name] = ut.gate(result.ok, result.text)
        if result.details:
            results.write_atomic(logs / f"{name}.txt", f"{result.details}\n")
            out[name]["log"] = str(logs / f"{name}.txt")
    return out


def torch_gates(patch: patches.Patch, cell: matrix.Cell, out: Path, repeat: int, log=print) -> dict:
    """A torch patch's new test files (torch's own style: ``python test/...py``) on the cell's
    torch, in two throwaway environments (torch's test helpers need ``expecttest``): they must
    fail without the fix and pass with it; its new multi-process tests run ``repeat`` times with
    it. Test methods it adds to torch's existing test files (not in the wheel, and no torch
    checkout can be had here) run in a stand-in of their class (``tools/series/torch_host.py``)."""
    gates = {name: ut.gate(True, "not run: no torch checkout") for name in GATES}
    gates["claims"] = ut.gate(True, "not checked: no torch checkout (the claims of a torch patch are read)")
    gates["behaviour kept"] = claims.kept_gate(patch, {})
    tests = patch.test_changes()
    if not tests:
        gates["upstream tests"] = ut.gate(False, "the patch adds no test (a PR needs one that fails "
                                                 "without the fix)")
        return gates
    new = {path: text for path, text in tests.items() if path in added_files(patch)}
    existing = [path for path in tests if path not in new]
    try:  # torch's own test files are not here: the methods added to them run in a stand-in class
        stand_ins = {path: torch_host.host(patch, path) for path in existing}
    except torch_host.HostError as err:
        gates["upstream tests"] = ut.gate(False, f"its test changes cannot be run here: {err}")
        return gates
    args = [*envs.install_args(cell.package, cell.lightning, cell.torch), "expecttest"]
    logs = out / "logs" / patch.name / cell.id
    with scratch("torch-tests-") as tmp:
        tree = tmp / "tree"
        tree.mkdir()
        if new:
            patches.apply(patch, tree, 1, "".join(new.values()))
        hosted = []
        for path, (source, ids) in stand_ins.items():
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            (tree / path).write_text(source)
            hosted += [f"{path}::{test.replace('.', '::')}" for test in ids]
        before = unittest_counts(patched_env(args, tmp / "before", []), tree, list(tests))
        after_py = patched_env(args, tmp / "after", [patch])
        after = unittest_counts(after_py, tree, list(tests))
        several = ut.multi_process_tests(new, tree) + hosted  # a stand-in host runs two ranks
        gates["flaky"] = ut.flaky_gate(several, repeat,
                                       lambda i: torch_run(after_py, tree, several, logs / f"flaky-{i}"))
    ok = (before.get("failed", 0) + before.get("error", 0)) > 0 and after.get("passed") and \
        not after.get("failed") and not after.get("error")
    where = f" (the methods it adds to {', '.join(existing)}, in a stand-in class)" if existing else ""
    gates["upstream tests"] = ut.gate(ok, f"its tests on torch {cell.torch}{where}: {_fmt(before)}; "
                                          f"patched: {_fmt(after)}")
    return gates


def torch_run(python: Path, tree: Path, nodes: list[str], log_stem: Path) -> ut.Report:
    """One run of torch-style tests (``file::Class::test`` node ids), a process per file."""
    by_file: dict[str, list[str]] = {}
    for node in nodes:
        file, *names = node.split("::")
        by_file.setdefault(file, []).append(".".join(names))
    code, output = 0, ""
    for n, (file, names) in enumerate(by_file.items()):
        res = Launcher().run(Run((str(tree / file), *names), python, cwd=tree, timeout=1800,
                                 log_stem=Path(f"{log_stem}-{n}")))
        output += "".join(Path(p).read_text(errors="replace") for p in (res.stdout_path, res.stderr_path))
        code = code or res.returncode
        if (res.reason or "").startswith("timed out"):
            return ut.Report({}, res.returncode, output, timed_out=True, log=str(log_stem), reported=False)
    return ut.Report({}, code, output, log=str(log_stem))


def unittest_counts(python: Path, tree: Path, files: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for rel in files:
        proc = subprocess.run([str(python), str(tree / rel)], cwd=tree, capture_output=True, text=True,
                              timeout=1800)
        ran = re.search(r"^Ran (\d+) tests?", proc.stderr, re.M)
        bad = {k: int(n) for k, n in re.findall(r"(failures|errors|skipped)=(\d+)", proc.stderr)}
        n = int(ran.group(1)) if ran else 0
        failed, error, skipped = bad.get("failures", 0), bad.get("errors", 0), bad.get("skipped", 0)
        if not ran:  # did not even start: count the file as one error
            error += 1
        for key, value in (("passed", n - failed - error - skipped), ("failed", failed),
                           ("error", error), ("skipped", skipped)):
            if value > 0:
                counts[key] = counts.get(key, 0) + value
    return counts


def on_top_of(wt, sha: str, earlier: list[patches.Patch]) -> Path:
    """The worktree at ``sha`` with ``earlier`` patches applied (any change left before is dropped)."""
    path = wt.checkout(sha)
    for e in earlier:
        patches.apply(e, path, 1)
    return path


def checkout_states(patch: patches.Patch, repo, wt, earlier: list[patches.Patch]) -> str:
    """Does the patch apply on top of ``earlier`` at its ``X-Base`` and at master?"""
    from tools.stages import gitrange

    states = []
    for label, ref in (("base", patch.headers["X-Base"]), ("master", "master")):
        try:
            checked = patches.check(patch, on_top_of(wt, gitrange.resolve(repo, ref), earlier), 1)
            states.append(f"{label}: {checked.state}" + (f" ({checked.detail})" if checked.detail else ""))
        except (gitrange.BadInput, patches.PatchError) as err:
            states.append(f"{label}: fails ({err})")
    return "; ".join(states)


def _fmt(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in counts.items()) or "no result"


def summary(rows: list[dict]) -> str:
    head = ["patch", "cell", "applies (wheel; checkouts)", "before", "after", "earlier patches still",
            *GATES, *CELL_GATES, "ok"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        still = ", ".join(f"{n.split('.')[0]}: {v}" for n, v in r["series_still_fixed"].items()) or "-"
        before = r["before"] + (f": {r['before_detail']}" if r.get("before_detail") else "")
        gates = r.get("gates") or {}
        cells = [r["patch"], r["cell"], f"{r['applies']}; {r['checkouts']}", before,
                 f"{r['after']}: {r['after_detail']}", still,
                 *(gate_text(gates.get(n)) for n in (*GATES, *CELL_GATES)),
                 "yes" if r["ok"] else "NO"]
        lines.append("| " + " | ".join(str(c).replace("|", "/").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def gate_text(g: dict | None) -> str:
    if g is None:
        return "-"
    return g["text"] if g["ok"] else f"FAILS: {g['text']}"
