"""``nox -s patches``: does each patch apply, and does it turn its bug from bad into good?

The series is quilt's: patch k is validated on top of patches 1..k-1. For every patch and every
matrix cell it names (``X-Cells``): the cell's era-correct environment with the earlier patches
that target the cell applied is the *before*; the same plus this patch is the *after* (both are
throwaway uv environments, cheap from uv's cache; the cached cell environment is never modified).
The patch's repro runs in both through the harness, and the earlier patches' repros run again in
the *after* environment: the series must stay fixed. With a Lightning checkout (``LIGHTNING_REPO``)
each Lightning patch is also applied to worktrees at its ``X-Base`` and at master, and Lightning's
own tests run there: the patch's new tests must fail without it and its test files pass with it.

    nox -s patches [-- --patch NAME] [--cell ID]

Writes ``results/patches/<time>/summary.md`` and ``summary.json``; exit 1 when a patch does not
apply or does not fix its bug in a cell, 2 for a malformed patch or an unknown cell, 130 when
interrupted (Ctrl-C or SIGTERM: the rows done are kept, the throwaway environments removed).
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
from datetime import datetime
from pathlib import Path

from tools import contract, envs, harness, index, matrix, patches, results

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
TEST_TORCH = "2.13.0"  # the torch of the upstream test environment


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
    ones are ignored, or they would cut that cleanup short. A signal ignored when we started (a
    job started in the background) stays ignored.
    """
    def interrupted(signum, frame):
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    # None: a handler not installed from Python, which could not be put back
    previous = {sig: handler for sig in INTERRUPTS
                if (handler := signal.getsignal(sig)) not in (signal.SIG_IGN, None)}
    for sig in previous:
        signal.signal(sig, interrupted)
    try:
        yield
    finally:
        for sig, handler in previous.items():
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
            proc.kill()
            proc.wait()
            raise
    if code:
        raise subprocess.CalledProcessError(code, cmd)


def throwaway(args: list[str], folder: Path) -> Path:
    """A new environment in ``folder`` (in a ``scratch`` folder: removed even on an interrupt)."""
    _uv([index.uv(), "venv", "--quiet", "--python", "3.11", str(folder)])
    _uv([index.uv(), "pip", "install", "--quiet", "--python", str(folder / "bin" / "python"), *args],
        env=envs.uv_env())
    return folder / "bin" / "python"


def run(patch: patches.Patch, python: Path, log_stem: Path) -> harness.RunResult:
    script, *rest = patch.repro
    return harness.run([str(python), str(ROOT / script), *rest], timeout=600, log_stem=log_stem)


def patched_env(args: list[str], folder: Path, applied: list[patches.Patch]) -> Path:
    """A throwaway environment of the cell with ``applied`` patched into its installed files."""
    python = throwaway(args, folder)
    for p in applied:
        patches.apply(p, *patches.installed_root(site_packages(python), p), p.installable_diff())
    return python


def validate(patch: patches.Patch, cell: matrix.Cell, out: Path, earlier: list[patches.Patch],
             log=print) -> dict:
    """``earlier``: the patches before this one in the series that target this cell."""
    args = envs.install_args(cell.package, cell.lightning, cell.torch)
    cell_py = envs.ensure(f"{cell.package}-{cell.lightning}-torch{cell.torch}", args, log=log)
    row = {"patch": patch.name, "cell": cell.id, "on_top_of": [e.name for e in earlier]}
    logs = out / "logs" / patch.name / cell.id
    installable = patch.installable_diff()
    with scratch("patched-") as tmp:
        before_py = patched_env(args, tmp / "before", earlier) if earlier else cell_py
        checked = patches.check(patch, *patches.installed_root(site_packages(before_py), patch), installable)
        row["applies"] = checked.state + (f" ({checked.detail})" if checked.detail else "")
        before = run(patch, before_py, logs / "before")
        fixed = earlier + ([patch] if checked.state in ("applies", "drift") else [])
        after_py = patched_env(args, tmp / "after", fixed)
        after = run(patch, after_py, logs / "after")
        still = {e.name: run(e, after_py, logs / f"after-{e.path.stem}").verdict for e in earlier}
    row["before"], row["after"] = before.verdict, after.verdict
    row["after_detail"] = ((after.record or {}).get("details") or {}).get("summary") or after.reason
    row["series_still_fixed"] = still
    row["checkouts"], row["upstream_tests"] = upstream(patch, cell, log)
    row["ok"] = ("NOT as required" not in row["upstream_tests"]
                 and "fails" not in row["checkouts"]
                 and checked.state in ("applies", "drift")
                 and before.verdict == patch.headers["X-Expect-Before"]
                 and after.verdict == patch.headers["X-Expect-After"]
                 and all(still[e.name] == e.headers["X-Expect-After"] for e in earlier))
    log(f"  {patch.name} x {cell.id}: {row['applies']}; before {row['before']}, "
        f"after {row['after']} ({row['after_detail']}); earlier patches still: {still or '-'}")
    return row


_UPSTREAM: dict[str, tuple[str, str]] = {}  # per patch: the same answer for every cell


def upstream(patch: patches.Patch, cell: matrix.Cell, log=print) -> tuple[str, str]:
    """On worktrees of a Lightning checkout, the earlier Lightning patches of the series applied:
    does the patch apply at its ``X-Base`` and at master; do its new tests fail on master without
    it, and do the test files it names (``X-Tests``) pass with it? A torch patch's own tests run
    on the cell's torch instead (no torch checkout here)."""
    if patch.target == "torch":
        return "not checked: no torch checkout", torch_tests(patch, cell, log)
    source = os.environ.get("LIGHTNING_REPO")
    if not source:
        reason = "skipped: no Lightning checkout configured (LIGHTNING_REPO)"
        return reason, reason
    if patch.name in _UPSTREAM:
        return _UPSTREAM[patch.name]
    from tools import gitrange

    series = patches.series(patch.path.parent)
    earlier = [p for p in series[:series.index(patch)] if p.target == "lightning"]
    repo = gitrange.open_repo(source, CACHE / "repos")
    wt = gitrange.Worktree(repo, CACHE / "worktrees" / "upstream-tests",
                           sparse=("src", "requirements", "tests"))

    def at(sha: str) -> Path:
        return on_top_of(wt, sha, earlier)

    states = checkout_states(patch, repo, wt, earlier)
    master = gitrange.resolve(repo, "master")
    path = at(master)
    python = envs.ensure(f"upstream-tests-{master[:12]}",
                         envs.era_args([*wt.requirements(), "pytest"], TEST_TORCH,
                                       datetime.fromisoformat(gitrange.commit_info(repo, master).date)),
                         log=log)
    tests = patch.test_changes()
    named = patch.headers.get("X-Tests", "").split() or list(tests)
    # without the fix: only the patch's test changes, applied alone, must fail
    patches.apply(patch, path, 1, "".join(tests.values()))
    before = pytest_counts(python, path, list(tests))
    path = at(master)
    patches.apply(patch, path, 1)
    after = pytest_counts(python, path, named)
    wt.checkout(master)
    ok = before.get("failed", 0) > 0 and not after.get("failed") and not after.get("error")
    text = (f"master + its tests: {_fmt(before)}; patched: {_fmt(after)}"
             f"{'' if ok else ' (NOT as required)'}")
    _UPSTREAM[patch.name] = states, text
    return _UPSTREAM[patch.name]


def torch_tests(patch: patches.Patch, cell: matrix.Cell, log=print) -> str:
    """The torch patch's test files (torch's own style: ``python test/...py``) on the cell's torch,
    in two throwaway environments (torch's test helpers need ``expecttest``): they must fail
    without the fix and pass with it."""
    tests = patch.test_changes()
    if not tests:
        return "not run: the patch has no test"
    args = [*envs.install_args(cell.package, cell.lightning, cell.torch), "expecttest"]
    with scratch("torch-tests-") as tmp:
        tree = tmp / "tree"
        tree.mkdir()
        patches.apply(patch, tree, 1, "".join(tests.values()))
        before = unittest_counts(patched_env(args, tmp / "before", []), tree, list(tests))
        after = unittest_counts(patched_env(args, tmp / "after", [patch]), tree, list(tests))
    ok = (before.get("failed", 0) + before.get("error", 0)) > 0 and after.get("passed") and \
        not after.get("failed") and not after.get("error")
    return (f"its tests on torch {cell.torch}: {_fmt(before)}; patched: {_fmt(after)}"
            f"{'' if ok else ' (NOT as required)'}")


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


def pytest_counts(python: Path, checkout: Path, files: list[str]) -> dict[str, int]:
    rel = [str(Path(f).relative_to("tests/tests_pytorch")) for f in files]
    env = {**os.environ, "PYTHONPATH": f"{checkout / 'src'}:{checkout / 'tests'}"}
    proc = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--color=no",
                           *rel], cwd=checkout / "tests" / "tests_pytorch", env=env,
                          capture_output=True, text=True, timeout=1800)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", last)}


def _fmt(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in counts.items()) or "no result"


def summary(rows: list[dict]) -> str:
    lines = ["| patch | cell | applies (wheel; checkouts) | before | after | earlier patches still |"
             " upstream tests | ok |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        still = ", ".join(f"{n.split('.')[0]}: {v}" for n, v in r["series_still_fixed"].items()) or "-"
        lines.append(f"| {r['patch']} | {r['cell']} | {r['applies']}; {r['checkouts']} | {r['before']} | "
                     f"{r['after']}: {r['after_detail']} | {still} | {r['upstream_tests']} | "
                     f"{'yes' if r['ok'] else 'NO'} |")
    return "\n".join(lines) + "\n"


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
    return everything, cells, work


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nox -s patches --")
    p.add_argument("--patch", help="only this patch of the series")
    p.add_argument("--cell", help="only this matrix cell")
    a = p.parse_args(argv)
    with interrupts_unwind():
        try:
            everything, cells, work = plan(a.patch, a.cell)
        except patches.PatchError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted: before any work; nothing made, nothing kept", file=sys.stderr)
            return 130
        return validate_all(everything, cells, work)


def validate_all(everything: list[patches.Patch], cells: dict, work: list[tuple]) -> int:
    out = results.run_dir("patches")
    rows: list[dict] = []
    try:
        for i, (s, cell_id) in enumerate(work, 1):
            print(f"[{i}/{len(work)}] {s.name} x {cell_id}", flush=True)
            earlier = [e for e in everything[:everything.index(s)] if cell_id in e.cells]
            try:
                rows.append(validate(s, cells[cell_id], out, earlier))
            except patches.PatchError as err:  # e.g. an earlier patch of the series fails here
                print(f"  {s.name} x {cell_id}: {err}", flush=True)
                rows.append({"patch": s.name, "cell": cell_id, "on_top_of": [e.name for e in earlier],
                             "applies": f"fails ({err})", "checkouts": "-", "before": "-", "after": "-",
                             "after_detail": "not run", "series_still_fixed": {}, "upstream_tests": "-",
                             "ok": False})
            results.write_json(out / "summary.json", rows)  # a row at a time: an interrupt keeps them
    except KeyboardInterrupt:
        kept = (f"{len(rows)} of {len(work)} rows kept in {out / 'summary.json'}" if rows else
                f"0 of {len(work)} rows finished, nothing kept")
        print(f"interrupted: {kept}; the throwaway environments were removed", file=sys.stderr)
        return 130
    table = summary(rows)
    results.write_atomic(out / "summary.md", table)
    print(table)
    print(f"results: {out}")
    return contract.GOOD if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
