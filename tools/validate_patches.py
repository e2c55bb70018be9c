"""``nox -s patches``: does each patch apply, and does it turn its bug from bad into good?

For every patch of ``patches/series`` and every matrix cell it names (``X-Cells``): the cell's
era-correct environment is the *before*; a throwaway copy of it (a new uv environment, cheap from
uv's cache) with the patch applied to the installed files is the *after*. The patch's repro runs
in both through the harness. The user's environments are never modified.

    nox -s patches [-- --patch NAME] [--cell ID]

Writes ``results/patches/<time>/summary.md`` and ``summary.json``; exit 1 when a patch does not
apply or does not fix its bug in a cell, 2 for a malformed patch or an unknown cell.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from tools import contract, envs, harness, matrix, patches, results

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
TEST_TORCH = "2.13.0"  # the torch of the upstream test environment


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def throwaway(args: list[str], folder: Path) -> Path:
    subprocess.run(["uv", "venv", "--quiet", "--python", "3.11", str(folder)], check=True)
    subprocess.run(["uv", "pip", "install", "--quiet", "--python", str(folder / "bin" / "python"),
                    *args], check=True)
    return folder / "bin" / "python"


def run(patch: patches.Patch, python: Path, log_stem: Path) -> harness.RunResult:
    script, *rest = patch.repro
    return harness.run([str(python), str(ROOT / script), *rest], timeout=600, log_stem=log_stem)


def validate(patch: patches.Patch, cell: matrix.Cell, out: Path, log=print) -> dict:
    args = envs.install_args(cell.package, cell.lightning, cell.torch)
    before_py = envs.ensure(f"{cell.package}-{cell.lightning}-torch{cell.torch}", args, log=log)
    root, level = patches.installed_root(site_packages(before_py), patch)
    row = {"patch": patch.name, "cell": cell.id}
    installable = patch.installable_diff()
    checked = patches.check(patch, root, level, installable)
    row["applies"] = checked.state + (f" ({checked.detail})" if checked.detail else "")
    before = run(patch, before_py, out / "logs" / patch.name / cell.id / "before")
    row["before"] = before.verdict
    with tempfile.TemporaryDirectory(prefix="patched-") as tmp:
        after_py = throwaway(args, Path(tmp) / "venv")
        if checked.state in ("applies", "drift"):
            patches.apply(patch, *patches.installed_root(site_packages(after_py), patch), installable)
        after = run(patch, after_py, out / "logs" / patch.name / cell.id / "after")
    row["after"] = after.verdict
    row["after_detail"] = ((after.record or {}).get("details") or {}).get("summary") or after.reason
    row["upstream_tests"] = upstream_tests(patch, log)
    row["ok"] = ("NOT as required" not in row["upstream_tests"]
                 and checked.state in ("applies", "drift")
                 and before.verdict == patch.headers["X-Expect-Before"]
                 and after.verdict == patch.headers["X-Expect-After"])
    log(f"  {patch.name} x {cell.id}: {row['applies']}; before {row['before']}, "
        f"after {row['after']} ({row['after_detail']})")
    return row


_UPSTREAM: dict[str, str] = {}  # per patch: the same answer for every cell


def upstream_tests(patch: patches.Patch, log=print) -> str:
    """Lightning's own tests on a patched checkout of master: the patch's new tests must fail
    without it, and every test file it names (``X-Tests``) must pass with it."""
    if patch.target == "torch":
        return "not run: torch's own test suite is out of scope here"
    source = os.environ.get("LIGHTNING_REPO")
    if not source:
        return "skipped: no Lightning checkout configured (LIGHTNING_REPO)"
    if patch.name in _UPSTREAM:
        return _UPSTREAM[patch.name]
    from tools import gitrange

    repo = gitrange.open_repo(source, CACHE / "repos")
    master = gitrange.resolve(repo, "master")
    wt = gitrange.Worktree(repo, CACHE / "worktrees" / "upstream-tests",
                           sparse=("src", "requirements", "tests"))
    path = wt.checkout(master)
    python = envs.ensure(f"upstream-tests-{master[:12]}",
                         envs.era_args([*wt.requirements(), "pytest"], TEST_TORCH,
                                       datetime.fromisoformat(gitrange.commit_info(repo, master).date)),
                         log=log)
    new = patch.new_tests()
    named = patch.headers.get("X-Tests", "").split() or [f for f in patch.files if f.startswith("tests/")]
    # without the fix: only the new test files, applied alone, must fail
    patches.apply(patch, path, 1, "".join(new.values()))
    before = pytest_counts(python, path, list(new))
    wt.checkout(master)
    patches.apply(patch, path, 1)
    after = pytest_counts(python, path, named)
    wt.checkout(master)
    ok = before.get("failed", 0) > 0 and not after.get("failed") and not after.get("error")
    text = (f"master + new tests: {_fmt(before)}; patched: {_fmt(after)}"
            f"{'' if ok else ' (NOT as required)'}")
    _UPSTREAM[patch.name] = text
    return text


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
    lines = ["| patch | cell | applies | before | after | upstream tests | ok |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['patch']} | {r['cell']} | {r['applies']} | {r['before']} | "
                     f"{r['after']}: {r['after_detail']} | {r['upstream_tests']} | "
                     f"{'yes' if r['ok'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nox -s patches --")
    p.add_argument("--patch", help="only this patch of the series")
    p.add_argument("--cell", help="only this matrix cell")
    a = p.parse_args(argv)
    try:
        chosen = patches.named(a.patch)
        cells = {c.id: c for c in matrix.load().cells}
        for s in chosen:
            unknown = [c for c in s.cells if c not in cells]
            if unknown:
                raise patches.PatchError(f"{s.name}: unknown cell {unknown[0]}")
    except patches.PatchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = results.run_dir("patches")
    rows = []
    for s in chosen:
        for cell_id in s.cells:
            if a.cell and cell_id != a.cell:
                continue
            rows.append(validate(s, cells[cell_id], out))
            results.write_json(out / "summary.json", rows)
    table = summary(rows)
    results.write_atomic(out / "summary.md", table)
    print(table)
    print(f"results: {out}")
    return contract.GOOD if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
