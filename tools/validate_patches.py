"""``nox -s patches``: does each patch apply, and does it turn its bug from bad into good?

The series is quilt's: patch k is validated on top of patches 1..k-1. For every patch and every
matrix cell it names (``X-Cells``): the cell's era-correct environment with the earlier patches
that target the cell applied is the *before*; the same plus this patch is the *after* (both are
throwaway uv environments, cheap from uv's cache; the cached cell environment is never modified).
The patch's repro runs in both through the harness, and the earlier patches' repros run again in
the *after* environment: the series must stay fixed.

Then the gates, once per patch (``GATES``; each ``{"ok", "text"}``, any failed gate fails the
row). With a Lightning checkout (``LIGHTNING_REPO``) each Lightning patch is applied to worktrees
at its ``X-Base`` and at master, and Lightning's own tests run at master: the patch's new tests
must fail without it and its test files pass with it; the existing tests covering what it changes
must still pass (``upstream_tests.py``); its new multi-process tests must pass ``--repeat`` times;
types, lint, license headers and the CHANGELOG entry come from ``tools/gates.py``; the
unmerged PRs that change the same files or name the issue from ``tools/open_work.py``; the
claims of the description and their evidence from ``tools/claims.py``.

    nox -s patches [-- --patch NAME] [--cell ID] [--repeat K]
                   [--script PATH (--signature REGEX | --verdict-line | --check-replicas)]

``--script``: a user's own script, unmodified, in each cell the series targets (or ``--cell``)
without any patch and with every patch that targets the cell: extra rows, as required when it is
bad before and good after.

Writes ``results/patches/<time>/summary.md`` and ``summary.json``; exit 1 when a row is not as
required, 2 for bad input (a malformed patch, an unknown cell, a missing script; before anything
is made), 130 when interrupted (Ctrl-C or SIGTERM: the rows done are kept, the throwaway
environments removed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tools import claims, contract, envs, harness, index, matrix, patches, results, torch_host
from tools import upstream_tests as ut
from tools.launcher import How, Launcher, Run

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
TEST_TORCH = "2.13.0"  # the torch of the upstream test environment
REPEAT = 5  # runs of each new multi-process test (the flaky gate)
TRIES = 3  # runs of a user's script that keeps dying of a signal before its row says "skip"


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def interrupts_unwind():
    """SIGINT and SIGTERM raise KeyboardInterrupt, so that ``finally`` blocks run: ``scratch``
    removes the throwaway environments (~800 MB each), the harness kills the repro's ranks.

    A Ctrl-C comes more than once (from the terminal, then forwarded by the noxfile's runner; plain
    ``session.run`` sends SIGTERM 0.3 s after it): once the first interrupt is on its way, later
    ones are ignored, or they would cut that cleanup short, and they stay ignored to the exit.
    A signal ignored when we started (a job started in the background) stays ignored.
    """
    def interrupted(signum, frame):
        fired.append(signum)
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    # None: a handler not installed from Python, which could not be put back
    previous = {sig: handler for sig in INTERRUPTS
                if (handler := signal.getsignal(sig)) not in (signal.SIG_IGN, None)}
    fired: list[int] = []
    for sig in previous:
        signal.signal(sig, interrupted)
    try:
        yield
    finally:
        # once interrupted the program is ending: a late second Ctrl-C (a forwarded one, on a busy
        # machine) must not turn the exit 130 into a death by SIGINT
        for sig, handler in previous.items() if not fired else ():
            signal.signal(sig, handler)


@contextlib.contextmanager
def scratch(prefix: str):
    """A temporary folder for throwaway environments, removed however the block ends.

    The removal runs in a session of its own and is waited for: neither a Ctrl-C nor a kill of
    this process stops it halfway (removing a torch environment takes about 0.4 s; plain nox
    SIGKILLs a command 0.5 s after Ctrl-C).
    """
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        subprocess.Popen(["rm", "-rf", "--", str(folder)], start_new_session=True).wait()


def _uv(cmd: list[str], **kwargs) -> None:
    """``subprocess.run(cmd, check=True)``; when interrupted, uv is killed and waited for: it
    must be gone before the folder it writes into is removed, or it writes on into the removal."""
    with subprocess.Popen(cmd, **kwargs) as proc:
        try:
            code = proc.wait()
        except BaseException:
            # a second signal (plain nox sends SIGTERM 0.3 s after Ctrl-C) must not cut this
            # wait short: uv would be left unreaped, perhaps still writing, while the folder goes
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                proc.kill()
                proc.wait()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            raise
    if code:
        raise subprocess.CalledProcessError(code, cmd)


def throwaway(args: list[str], folder: Path, like: Path | None = None) -> Path:
    """A new environment in ``folder`` (in a ``scratch`` folder: removed even on an interrupt).
    ``like``: the Python of an environment made from the same requirements (the cell's): its
    bytecode is linked in rather than compiled again."""
    python = folder / "bin" / "python"
    _uv([index.uv(), "venv", "--quiet", "--python", "3.11", str(folder)])
    if like is None:
        _uv([index.uv(), "pip", "install", "--quiet", "--python", str(python), *args], env=envs.uv_env())
    else:
        _uv([index.uv(), "pip", "install", "--quiet", "--no-compile-bytecode", "--python", str(python),
             *args])
        envs.link_bytecode(site_packages(like), site_packages(python))
    return python


def run(patch: patches.Patch, python: Path, log_stem: Path) -> harness.RunResult:
    script, *rest = patch.repro
    return Launcher().run(Run((str(ROOT / script), *rest), python, log_stem=log_stem))


def patched_env(args: list[str], folder: Path, applied: list[patches.Patch],
                like: Path | None = None) -> Path:
    """A throwaway environment of the cell with ``applied`` patched into its installed files
    (``like``: see ``throwaway``)."""
    python = throwaway(args, folder, like)
    for p in applied:
        root, level = patches.installed_root(site_packages(python), p)
        patches.apply(p, root, level, patches.installable_for(p, root))
    return python


def validate(patch: patches.Patch, cell: matrix.Cell, out: Path, earlier: list[patches.Patch],
             log=print, repeat: int = REPEAT) -> dict:
    """``earlier``: the patches before this one in the series that target this cell."""
    args = envs.install_args(cell.package, cell.lightning, cell.torch)
    cell_py = envs.ensure(f"{cell.package}-{cell.lightning}-torch{cell.torch}", args, log=log)
    row = {"patch": patch.name, "cell": cell.id, "on_top_of": [e.name for e in earlier]}
    logs = out / "logs" / patch.name / cell.id
    with scratch("patched-") as tmp:
        before_py = patched_env(args, tmp / "before", earlier, cell_py) if earlier else cell_py
        root, level = patches.installed_root(site_packages(before_py), patch)
        checked = patches.check(patch, root, level, patches.installable_for(patch, root))
        row["applies"] = checked.state + (f" ({checked.detail})" if checked.detail else "")
        before = run(patch, before_py, logs / "before")
        fixed = earlier + ([patch] if checked.state in ("applies", "drift") else [])
        after_py = patched_env(args, tmp / "after", fixed, cell_py)
        after = run(patch, after_py, logs / "after")
        still = {e.name: run(e, after_py, logs / f"after-{e.path.stem}").verdict for e in earlier}
    row["before"], row["after"] = before.verdict, after.verdict
    row["after_detail"] = detail(after)
    row["series_still_fixed"] = still
    row["checkouts"], row["gates"] = upstream(patch, cell, out, repeat, log)
    row["upstream_tests"] = row["gates"]["upstream tests"]["text"]  # what `nox -s pr` quotes
    row["ok"] = ("fails" not in row["checkouts"]
                 and checked.state in ("applies", "drift")
                 and before.verdict == patch.headers["X-Expect-Before"]
                 and after.verdict == patch.headers["X-Expect-After"]
                 and all(holds(still[e.name], e.headers["X-Expect-After"]) for e in earlier)
                 and all(g["ok"] for g in row["gates"].values()))
    failed = [name for name, g in row["gates"].items() if not g["ok"]]
    log(f"  {patch.name} x {cell.id}: {row['applies']}; before {row['before']}, "
        f"after {row['after']} ({row['after_detail']}); earlier patches still: {still or '-'}; "
        f"gates failed: {', '.join(failed) or 'none'}")
    return row


def holds(verdict: str, expected: str) -> bool:
    """An earlier patch's repro in a later patch's environment: what it promised, or better (a
    patch that only explains a crash expects bad after; a later one may fix it)."""
    return verdict in (expected, "good")


def detail(result: harness.RunResult) -> str | None:
    return ((result.record or {}).get("details") or {}).get("summary") or result.reason


# -- the gates: once per patch, on checkouts ----------------------------------------------------

GATES = ("upstream tests", "existing tests", "flaky", "with torch's patches", "types", "lint", "license",
         "changelog", "open upstream work", "claims", "behaviour kept")
OTHER_GATES = ("types", "lint", "license", "changelog")  # tools/gates.py's
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
    - existing tests, flaky: ``tools/upstream_tests.py``;
    - types, lint, license, changelog: ``tools/gates.py`` (``other_gates``);
    - open upstream work: ``tools/open_work.py``;
    - claims, behaviour kept: ``tools/claims.py`` (each claim of the description backed by a
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
    from tools import gitrange

    if repo.git_dir not in _TREES:
        pair = tuple(gitrange.Worktree.claim(repo, CACHE / "worktrees" / f"upstream-{side}")
                     for side in ("before", "after"))
        for wt in pair:
            wt.git.sparse_checkout("set", "--no-cone", *SPARSE)
        _TREES[repo.git_dir] = pair
    return _TREES[repo.git_dir]


def lightning_gates(patch: patches.Patch, logs: Path, repeat: int, log=print) -> tuple[str, dict]:
    from tools import gitrange

    series = patches.series(patch.path.parent)  # read again: its files may have changed, find it by name
    names = [p.name for p in series]
    k = names.index(patch.name) if patch.name in names else 0
    earlier = [p for p in series[:k] if p.target == "lightning"]
    repo = gitrange.open_repo(os.environ["LIGHTNING_REPO"], CACHE / "repos")
    before_wt, after_wt = worktrees(repo)
    states = checkout_states(patch, repo, after_wt, earlier)
    master = gitrange.resolve(repo, "master")
    before = on_top_of(before_wt, master, earlier)
    python = envs.ensure(f"upstream-tests-{master[:12]}",
                         envs.era_args([*before_wt.requirements(), "pytest"], TEST_TORCH,
                                       datetime.fromisoformat(gitrange.commit_info(repo, master).date)),
                         log=log)
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
    """The unmerged PRs that change the patch's files or name its issue (``tools/open_work.py``)."""
    from tools import open_work

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
    counts = report.counts()
    ok = report.reported and counts.get("passed", 0) > 0 and not ut.run_failed(report)
    how = "" if ok else f" ({ut.describe(report)})"
    return ut.gate(ok, f"on torch with {names}: {ut.fmt(counts)}{how}")


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
    """THE PLACE where the gates of ``tools/gates.py`` plug in: types, lint, license headers and
    the CHANGELOG entry, on the *before* and *after* trees. Without that module they are not run;
    a gate that raises fails, with the error as its text. A gate's full output goes to
    ``logs/<gate>.txt``."""
    try:
        from tools import gates
    except ModuleNotFoundError as err:
        if err.name != "tools.gates":
            raise
        return {name: ut.gate(True, "not run: no tools/gates.py") for name in OTHER_GATES}
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
    checkout can be had here) run in a stand-in of their class (``tools/torch_host.py``)."""
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
    from tools import gitrange

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
            *GATES, "ok"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        still = ", ".join(f"{n.split('.')[0]}: {v}" for n, v in r["series_still_fixed"].items()) or "-"
        before = r["before"] + (f": {r['before_detail']}" if r.get("before_detail") else "")
        gates = r.get("gates") or {}
        cells = [r["patch"], r["cell"], f"{r['applies']}; {r['checkouts']}", before,
                 f"{r['after']}: {r['after_detail']}", still, *(gate_text(gates.get(n)) for n in GATES),
                 "yes" if r["ok"] else "NO"]
        lines.append("| " + " | ".join(str(c).replace("|", "/").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def gate_text(g: dict | None) -> str:
    if g is None:
        return "-"
    return g["text"] if g["ok"] else f"FAILS: {g['text']}"


def plan(patch: str | None, cell: str | None) -> tuple[list[patches.Patch], dict, list[tuple]]:
    """The whole series, the matrix cells, and the (patch, cell id) pairs to validate: every
    input read and checked (a PatchError) before the first environment is made."""
    everything = patches.series()
    chosen = patches.named(patch)
    cells = {c.id: c for c in matrix.load().cells}
    for s in chosen:
        unknown = [c for c in s.cells if c not in cells]
        if unknown:
            raise patches.PatchError(f"{s.name}: unknown cell {unknown[0]}")
    work = [(s, c) for s in chosen for c in s.cells if cell in (None, c)]
    if not work:
        raise patches.PatchError(f"no patch of the series targets cell {cell!r}")
    claims.load()  # a malformed patches/claims.toml is bad input, before anything is made
    return everything, cells, work


# -- a user's own script, with and without the series ------------------------------------------

@dataclass(frozen=True)
class Script:
    path: Path
    signature: str | None
    cells: tuple[str, ...]  # the cells it runs in: every cell the series targets, or --cell
    kind: str = "python"  # how it runs (harness.how_to_run)
    check_replicas: str | None = None  # the replica check injected (--check-replicas)
    sandbox: bool | str = False  # the launcher's sandbox (a triaged issue's script: untrusted)
    nodes: tuple[int, int] = (1, 1)  # a job of N nodes with R ranks each (tools.nodes)


def check_script(script: str, signature: str | None, verdict_line: bool,
                 check_replicas: str | None = None) -> Path:
    """The rule of ``nox -s repro -- --script``: an existing file, judged by ``--signature`` (a
    valid regex) or the replica check, unless it prints the contract's verdict line."""
    path = Path(script)
    harness.how_to_run(path, "--script", script)  # the bisect's rule: a file that can be run
    if not (signature or verdict_line or check_replicas):
        raise contract.BadInput("--script needs --signature REGEX (what its output shows when the bug is "
                                "there), --check-replicas for a silent divergence, or --verdict-line "
                                "if it prints the contract's verdict line")
    contract.check_signature(signature)
    return path.resolve()


def script_row(script: Script, cell: matrix.Cell, everything: list[patches.Patch], out: Path,
               log=print) -> dict:
    """The script in the cell's environment (before) and with every patch of the series that
    targets the cell applied (after): as required when it is bad before and good after."""
    applied = [p for p in everything if cell.id in p.cells]
    args = envs.install_args(cell.package, cell.lightning, cell.torch)
    cell_py = envs.ensure(f"{cell.package}-{cell.lightning}-torch{cell.torch}", args, log=log)
    logs = out / "logs" / "script" / cell.id
    with scratch("script-") as tmp:
        before, before_runs = judged_run(script, cell_py, logs / "before")
        after, after_runs = judged_run(script, patched_env(args, tmp / "after", applied, cell_py),
                                       logs / "after")
    row = {"patch": f"(your script) {script.path.name}", "cell": cell.id,
           "on_top_of": [p.name for p in applied], "applies": "-", "checkouts": "-",
           "before": before.verdict, "before_detail": before.reason, "after": after.verdict,
           "after_detail": detail(after), "before_runs": before_runs, "after_runs": after_runs,
           "series_still_fixed": {}, "upstream_tests": "-", "gates": {},
           "ok": before.verdict == "bad" and after.verdict == "good"}
    runs = "" if before_runs == after_runs == 1 else f" (runs: {before_runs} before, {after_runs} after)"
    log(f"  {row['patch']} x {cell.id}: before {before.verdict} ({before.reason}), after {after.verdict} "
        f"({row['after_detail']}) with {len(applied)} patches{runs}")
    return row


def judged_run(script: Script, python: Path, log_stem: Path,
               tries: int = TRIES) -> tuple[harness.RunResult, int]:
    """``run_script``, made again (at most ``tries`` runs) while the script's process dies of a
    signal on its own: torch 2.13 + gloo now and then aborts as the interpreter exits, after
    training. Such a run cannot test the bug (as a bisect's skip, it is tried again); a timeout
    or an error of the script is not retried. The last run, and how many were made."""
    for n in range(1, tries + 1):
        r = run_script(script, python, log_stem if n == 1 else log_stem.with_name(f"{log_stem.name}-{n}"))
        if r.final or not (r.reason or "").startswith(contract.KILLED):
            break
    return r, n


def run_script(script: Script, python: Path, log_stem: Path) -> harness.RunResult:
    how = How(nodes=script.nodes[0], ranks_per_node=script.nodes[1])
    return Launcher(how).run(Run((str(script.path),), python, kind=script.kind, log_stem=log_stem,
                              signature=script.signature, check_replicas=script.check_replicas,
                              sandbox=script.sandbox))


def parser() -> contract.Parser:
    """The program's options (its ``--help``)."""
    p = contract.Parser(prog="nox -s patches --", description=__doc__.split("\n\n")[0])
    p.add_argument("--patch", help="only this patch of the series (default: every patch)")
    p.add_argument("--cell", help="only this matrix cell, by its name (e.g. pl2_6_6_torch2_13_0, as nox -s "
                                  "repro -k takes it; default: every cell a patch names)")
    p.add_argument("--repeat", type=int, default=REPEAT,
                   help=f"runs of each new multi-process test (the flaky gate; default {REPEAT})")
    p.add_argument("--script", help="also run this script of yours without and with the series")
    contract.add_judges(p, "--script")
    contract.add_repo(p, "upstream's gates (the series applied to master)", "no upstream gates")
    return p


def parse_args(argv) -> argparse.Namespace:
    p = parser()
    a = p.parse_args(argv)
    if a.repo != os.environ.get("LIGHTNING_REPO"):  # --repo given: read where the repository is used
        os.environ["LIGHTNING_REPO"] = a.repo
    if a.repeat < 1:
        raise contract.BadInput("--repeat takes a number >= 1")
    if a.script:
        a.script = check_script(a.script, a.signature, a.verdict_line, a.check_replicas)
    elif a.signature or a.verdict_line or a.check_replicas:
        raise contract.BadInput("--signature, --verdict-line and --check-replicas go with --script")
    return a


def main(argv=None) -> int:
    with interrupts_unwind():
        try:
            a = parse_args(argv)
            everything, cells, work = plan(a.patch, a.cell)
            script = None
            if a.script:
                targeted = {c for p in everything for c in p.cells}
                script = Script(a.script, a.signature,
                                tuple(c for c in cells if c in targeted and a.cell in (None, c)),
                                harness.how_to_run(a.script, "--script"), a.check_replicas)
        except contract.BadInput as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted: before any work; nothing made, nothing kept", file=sys.stderr)
            return 130
        return validate_all(everything, cells, work, a.repeat, script)


def validate_all(everything: list[patches.Patch], cells: dict, work: list[tuple], repeat: int = REPEAT,
                 script: Script | None = None) -> int:
    out = results.run_dir("patches")
    rows: list[dict] = []
    jobs = [*work, *((None, c) for c in (script.cells if script else ()))]
    try:
        for i, (s, cell_id) in enumerate(jobs, 1):
            name = s.name if s else f"(your script) {script.path.name}"
            print(f"[{i}/{len(jobs)}] {name} x {cell_id}", flush=True)
            earlier = [e for e in everything[:everything.index(s)] if cell_id in e.cells] if s else []
            try:
                rows.append(validate(s, cells[cell_id], out, earlier, repeat=repeat) if s else
                            script_row(script, cells[cell_id], everything, out))
            except patches.PatchError as err:  # e.g. an earlier patch of the series fails here
                print(f"  {name} x {cell_id}: {err}", flush=True)
                rows.append({"patch": name, "cell": cell_id, "on_top_of": [e.name for e in earlier],
                             "applies": f"fails ({err})", "checkouts": "-", "before": "-", "after": "-",
                             "after_detail": "not run", "series_still_fixed": {}, "upstream_tests": "-",
                             "gates": {}, "ok": False})
            # a row at a time: an interrupt keeps them, both tables
            results.write_json(out / "summary.json", rows)
            results.write_atomic(out / "summary.md", summary(rows))
    except KeyboardInterrupt:
        kept = (f"{len(rows)} of {len(jobs)} rows kept in {out / 'summary.json'} and summary.md" if rows else
                f"0 of {len(jobs)} rows finished, nothing kept")
        print(f"interrupted: {kept}; the throwaway environments were removed", file=sys.stderr)
        return 130
    table = summary(rows)
    results.write_atomic(out / "summary.md", table)
    print(table)
    print(f"results: {out}")
    return contract.GOOD if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
