"""The patch series: parsing, checks against installed trees, and the torch patch for real."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import pytest

from tools import harness, matrix, patches

ROOT = Path(__file__).resolve().parent.parent
HEAD = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: someone <someone@example.invalid>
Subject: [PATCH] a title that goes
 on the next line

Why the change is needed.

Bug: https://example.com/1
Forwarded: no
Origin: other
Last-Update: 2026-11-29
X-Target: torch
X-Base: v2.13.0
X-Repro: repro/x.py
X-Expect-Before: bad
X-Expect-After: good
---
"""
ORIGINAL = "".join(f"line {i}\n" for i in range(1, 21))
DIFF = """--- a/torch/m.py
+++ b/torch/m.py
@@ -10,2 +10,3 @@
 line 10
+inserted
 line 11
"""


def write(tmp_path, text, name="p.patch"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_series_parses():
    found = patches.series()
    assert found and all(p.files and p.repro for p in found)


def test_a_format_patch_message_gives_the_fields(tmp_path):
    patch = patches.parse(write(tmp_path, HEAD + DIFF))
    assert patch.headers["Description"] == "a title that goes on the next line\nWhy the change is needed."
    assert patch.headers["X-Base"] == "v2.13.0" and patch.headers["Author"].startswith("someone")
    assert patch.files == ["torch/m.py"] and patch.repro == ["repro/x.py"]


@pytest.mark.parametrize("text, message", [
    (HEAD.replace("Bug: https://example.com/1\n", "") + DIFF, "missing field Bug"),
    (HEAD.replace("X-Base: v2.13.0\n", "") + DIFF, "missing field X-Base"),
    (HEAD, "no unified diff"),
    (HEAD.replace("X-Target: torch", "X-Target: numpy") + DIFF, "X-Target must be one of"),
    ("just words\n\n" + DIFF, "not a git format-patch file"),
    (HEAD.replace("Forwarded: no\n", "Forwarded: no\nnot a field\n") + DIFF, "not a field"),
    (HEAD.replace("Subject: [PATCH] a title that goes\n on the next line\n", "") + DIFF, "no Subject"),
    (HEAD + "--- a/x\n+++ b/x\n", "no file or no hunk"),
])
def test_malformed_patches_are_one_line_errors(tmp_path, text, message):
    with pytest.raises(patches.PatchError, match=message):
        patches.parse(write(tmp_path, text))


def test_git_am_takes_a_patch_file_as_is(tmp_path):
    repo = tmp_path / "repo"
    (repo / "torch").mkdir(parents=True)
    (repo / "torch" / "m.py").write_text(ORIGINAL)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    diff = "diff --git a/torch/m.py b/torch/m.py\n" + DIFF
    subprocess.run([*git, "am", "-q", str(write(tmp_path, HEAD + diff))], check=True)
    log = subprocess.run([*git, "log", "-1", "--format=%s%n%b"], capture_output=True, text=True).stdout
    assert log.startswith("a title that goes on the next line\n") and "X-Base: v2.13.0" in log
    assert "inserted" in (repo / "torch" / "m.py").read_text()


def test_the_lightning_patches_stack_on_the_installed_lightning(tmp_path):
    """Each Lightning patch applies on top of the ones before it (quilt's series) onto a copy of
    the installed sources (made against master, so offsets are allowed); ``git apply`` takes the
    files too."""
    site = Path(metadata.distribution("pytorch_lightning").locate_file(""))
    series = [p for p in patches.series() if p.target == "lightning"]
    copy = tmp_path / "pytorch_lightning"
    shutil.copytree(site / "pytorch_lightning", copy)
    cells = {c.id: c for c in matrix.load().cells}
    for patch in series:
        if metadata.version("pytorch_lightning") not in {cells[c].lightning for c in patch.cells}:
            pytest.skip(f"the installed Lightning is not a cell of {patch.name}")
        state = patches.check(patch, copy, 4, patch.installable_diff()).state
        assert state in ("applies", "drift"), patch.name
        patches.apply(patch, copy, 4, patch.installable_diff())
    first = series[0]
    src = tmp_path / "git-apply"
    for rel in first.installable_files():
        target = src / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(site / "pytorch_lightning" / Path(rel).relative_to("src/lightning/pytorch"), target)
    proc = subprocess.run(["git", "apply", "--check", *(f"--include={f}" for f in first.installable_files()),
                           str(first.path)], cwd=src, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def tree(tmp_path, body=ORIGINAL):
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "m.py").write_text(body)
    return site


def test_applies_drifts_already_applied_and_fails(tmp_path):
    patch = patches.parse(write(tmp_path, HEAD + DIFF))
    site = tree(tmp_path)
    root, level = patches.installed_root(site, patch)
    assert patches.check(patch, root, level).state == "applies"
    (site / "torch" / "m.py").write_text("new\nnew\n" + ORIGINAL)
    drift = patches.check(patch, root, level)
    assert (drift.state, drift.detail) == ("drift", "offset 2 lines")
    patches.apply(patch, root, level)
    assert "inserted" in (site / "torch" / "m.py").read_text()
    assert patches.check(patch, root, level).state == "already-applied"
    (site / "torch" / "m.py").write_text("something else entirely\n")
    assert patches.check(patch, root, level).state == "fails"


def test_apply_never_writes_through_a_hard_link(tmp_path):
    patch = patches.parse(write(tmp_path, HEAD + DIFF))
    site = tree(tmp_path)
    cache_copy = tmp_path / "cache.py"
    os.link(site / "torch" / "m.py", cache_copy)  # as uv links files from its cache
    patches.apply(patch, *patches.installed_root(site, patch))
    assert cache_copy.read_text() == ORIGINAL


def test_lightning_paths_map_onto_either_installed_name(tmp_path):
    patch = patches.parse(write(tmp_path, HEAD.replace("X-Target: torch", "X-Target: lightning")
                                + DIFF.replace("torch/m.py", "src/lightning/pytorch/m.py")))
    (tmp_path / "a" / "pytorch_lightning").mkdir(parents=True)
    (tmp_path / "b" / "lightning" / "pytorch").mkdir(parents=True)
    assert patches.installed_root(tmp_path / "a", patch) == (tmp_path / "a" / "pytorch_lightning", 4)
    assert patches.installed_root(tmp_path / "b", patch) == (tmp_path / "b" / "lightning" / "pytorch", 4)
    with pytest.raises(patches.PatchError, match="no Lightning installed"):
        patches.installed_root(tmp_path / "c", patch)


@pytest.mark.ddp
@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
def test_torch_patch_turns_the_raw_crash_into_the_clear_error(tmp_path):
    (patch,) = [p for p in patches.series() if p.target == "torch"]
    script, *args = patch.repro
    cmd = [str(ROOT / script), *args]
    before = harness.run([sys.executable, *cmd, "--out", str(tmp_path / "before")], timeout=300)
    assert before.verdict == "bad", before.reason
    # a throwaway environment with this one's torch and Lightning; this one is not touched
    torch = metadata.version("torch").split("+")[0]
    lightning = metadata.version("pytorch-lightning")
    venv = Path(tempfile.mkdtemp(dir=tmp_path)) / "venv"
    subprocess.run(["uv", "venv", "-q", "-p", "3.11", str(venv)], check=True)
    subprocess.run(["uv", "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                    f"torch=={torch}", f"pytorch-lightning=={lightning}"], check=True)
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    root, level = patches.installed_root(Path(site), patch)
    assert patches.check(patch, root, level, patch.installable_diff()).state in ("applies", "drift")
    patches.apply(patch, root, level, patch.installable_diff())
    assert not (Path(site) / "test").exists()  # the patch's own test file is not installed
    after = harness.run([str(venv / "bin" / "python"), *cmd, "--out", str(tmp_path / "after")],
                        timeout=300)
    assert after.verdict == "good", after.reason
    run = json.loads((tmp_path / "after" / "runs.jsonl").read_text().splitlines()[0])
    assert run["outcomes"] == ["clear_error", "clear_error"]
    assert "no longer exists" in run["errors"][0]
    mine = Path(metadata.distribution("torch").locate_file("torch/nn/parallel/distributed.py"))
    assert "no longer exists" not in mine.read_text()  # the test environment is untouched


LIGHTNING_PATCHES = [p.name for p in patches.series() if p.target == "lightning"]


def patched_copy(folder: Path, applied: list) -> Path:
    """A copy of the installed pytorch_lightning with ``applied`` patched in, to put first on
    PYTHONPATH (every DDP rank the launcher starts inherits it); the installed one is untouched."""
    site = Path(metadata.distribution("pytorch_lightning").locate_file(""))
    shutil.copytree(site / "pytorch_lightning", folder / "pytorch_lightning")
    for p in applied:
        patches.apply(p, folder / "pytorch_lightning", 4, p.installable_diff())
    return folder


def run_repro(patch, pythonpath: Path, log_stem: Path):
    script, *args = patch.repro
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return harness.run([sys.executable, str(ROOT / script), *args], timeout=600, env=env, log_stem=log_stem)


@pytest.mark.ddp
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", LIGHTNING_PATCHES)
def test_lightning_patch_on_top_of_the_series_fixes_its_bug_and_keeps_the_earlier_fixes(tmp_path, name):
    """Patches 1..k-1 applied: patch k's repro is bad; with patch k too, it is good, and the
    repros of the earlier patches still give their fixed verdict (patch 1 + 2: the #20340 repro
    stays in sync and the re-wrap scenario of the stress test gives the clear error)."""
    series = [p for p in patches.series() if p.target == "lightning"]
    k = [p.name for p in series].index(name)
    patch, earlier = series[k], series[:k]
    cells = {c.id: c for c in matrix.load().cells}
    if metadata.version("pytorch_lightning") not in {cells[c].lightning for c in patch.cells}:
        pytest.skip(f"the installed Lightning is not a cell of {name}")
    before = run_repro(patch, patched_copy(tmp_path / "before", earlier), tmp_path / "before")
    assert before.verdict == patch.headers["X-Expect-Before"], before.reason
    after_path = patched_copy(tmp_path / "after", [*earlier, patch])
    after = run_repro(patch, after_path, tmp_path / "after")
    assert after.verdict == patch.headers["X-Expect-After"], after.reason
    for e in earlier:
        still = run_repro(e, after_path, tmp_path / f"after-{e.path.stem}")
        assert still.verdict == e.headers["X-Expect-After"], (e.name, still.reason)
    mine = Path(metadata.distribution("pytorch_lightning").locate_file("pytorch_lightning/strategies/ddp.py"))
    assert "_rewrap_if_trainable_changed" not in mine.read_text()  # the installed Lightning is untouched


def test_a_series_patch_splits_into_installable_sources_and_test_changes():
    (patch,) = patches.named("lightning-ddp-rewrap-on-trainable-change.patch")
    assert set(patch.sections()) == set(patch.files)
    installable = patch.installable_diff()
    assert "src/lightning/pytorch/strategies/ddp.py" in installable
    assert "CHANGELOG" not in installable and "tests/" not in installable
    assert list(patch.test_changes()) == ["tests/tests_pytorch/strategies/test_ddp_trainable_change.py"]
    changelog = patch.sections()["src/lightning/pytorch/CHANGELOG.md"]
    assert re.search(r"(?m)^\+- Fixed DDP replicas .*\(\[#20340\]", changelog)


def test_the_torch_patch_carries_a_test_in_torchs_layout():
    (patch,) = [p for p in patches.series() if p.target == "torch"]
    assert list(patch.test_changes()) == ["test/distributed/test_ddp_sink_freed_module.py"]
    assert patch.installable_files() == ["torch/nn/parallel/distributed.py"]


def test_unittest_counts_read_torch_style_test_files(tmp_path):
    from tools import validate_patches

    (tmp_path / "t.py").write_text(
        "import unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_ok(self): pass\n"
        "    def test_no(self): self.fail()\n"
        "    def test_err(self): raise KeyError\n"
        "    @unittest.skip('x')\n"
        "    def test_skip(self): pass\n"
        "unittest.main()\n")
    (tmp_path / "broken.py").write_text("import no_such_module_here\n")
    counts = validate_patches.unittest_counts(Path(sys.executable), tmp_path, ["t.py"])
    assert counts == {"passed": 1, "failed": 1, "error": 1, "skipped": 1}
    assert validate_patches.unittest_counts(Path(sys.executable), tmp_path, ["broken.py"]) == {"error": 1}


@pytest.mark.parametrize("argv, message", [
    (["--cell", "pl0_0_0_torch0_0_0"], "error: no patch of the series targets cell 'pl0_0_0_torch0_0_0'"),
    (["--patch", "nope.patch"], "error: no patch 'nope.patch' in the series"),
])
def test_validation_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    from tools import validate_patches

    assert validate_patches.main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]


def test_a_row_that_cannot_be_built_is_a_failed_row_not_a_crash(tmp_path, monkeypatch, capsys):
    from tools import validate_patches

    monkeypatch.setenv("REPRO_RESULTS", str(tmp_path))

    def earlier_patch_fails(patch, cell, out, earlier, log=print):
        raise patches.PatchError("lightning-x.patch does not apply: ['1 out of 2 hunks FAILED']")

    monkeypatch.setattr(validate_patches, "validate", earlier_patch_fails)
    (patch,) = [p for p in patches.series() if p.target == "torch"]
    assert validate_patches.main(["--patch", patch.name]) == 1
    rows = json.loads(next(tmp_path.glob("patches/*/summary.json")).read_text())
    assert [r["cell"] for r in rows] == patch.cells
    assert all(not r["ok"] and r["applies"].startswith("fails (lightning-x.patch") for r in rows)
    assert "| NO |" in capsys.readouterr().out


def test_pr_bundle_refuses_a_patch_that_has_not_validated(tmp_path, monkeypatch, capsys):
    from tools import pr_bundle, results

    monkeypatch.setattr(results, "RESULTS", tmp_path)
    (patch,) = patches.named("lightning-ddp-rewrap-on-trainable-change.patch")
    assert pr_bundle.main([patch.name]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {patch.name} has not validated: run `nox -s patches` first"]
    rows = [{"patch": patch.name, "cell": c, "ok": True, "applies": "applies", "before": "bad",
             "after": "good", "after_detail": "in sync", "upstream_tests": "4 failed; 31 passed"}
            for c in patch.cells]
    results.write_json(tmp_path / "patches" / "1" / "summary.json", rows)
    monkeypatch.delenv("LIGHTNING_REPO", raising=False)
    assert pr_bundle.main([patch.name]) == 0
    body = (tmp_path / "pr" / patch.path.stem / "body.md").read_text()
    assert body.startswith("## What does this PR do?\n\nFixes #20340")
    assert "### What was wrong\n\ntorch's DistributedDataParallel decides once" in body
    assert "### What changed\n\nThe strategy now remembers which parameters" in body
    assert (tmp_path / "pr" / patch.path.stem / "branch.txt").read_text().startswith("bugfix/20340_")


GOOD = (HEAD + DIFF).encode()


def series_folder(tmp_path, monkeypatch, series: bytes, files: dict[str, bytes]) -> Path:
    """A patches/ folder of its own, used by both tools in place of the workspace's."""
    folder = tmp_path / "patches"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "series").write_bytes(series)
    monkeypatch.setattr(patches, "PATCHES", folder)
    return folder


@pytest.mark.parametrize("series, files, message", [
    (b"ok.patch\nbad.patch\n", {"bad.patch": GOOD.replace(b"needed.", b"needed \xff.")},
     "bad.patch: not UTF-8 (line 6)"),
    (b"ok.patch\n# caf\xe9\n", {}, "patches/series: not UTF-8 (line 2)"),
    (b"ok.patch\nsub\n", {}, "patches/series names sub, which is a directory, not a patch file"),
    (b"ok.patch\ngone.patch\n", {}, "patches/series names gone.patch, which does not exist"),
    (b"ok.patch\nbad.patch\n", {"bad.patch": GOOD.replace(b"@@ -10,2 +10,3 @@", b"@@ -12,x +12,3 @@")},
     "bad.patch: line 20: malformed hunk header '@@ -12,x +12,3 @@'"),
    (b"ok.patch\nbad.patch\n", {"bad.patch": GOOD.replace(b"@@ -10,2 +10,3 @@", b"@@ -10,2 +10,4 @@")},
     "bad.patch: line 20: malformed hunk '@@ -10,2 +10,4 @@': its line counts do not match its body"),
    (b"ok.patch\nbad.patch\n", {"bad.patch": GOOD.replace(b"repro/x.py", b"repro/x.py 'a b")},
     "bad.patch: X-Repro is not a command line (No closing quotation)"),
], ids=["patch-not-utf8", "series-not-utf8", "directory", "missing", "hunk-header", "hunk-counts", "x-repro"])
def test_a_bad_series_is_one_line_and_exit_2_for_both_tools(tmp_path, monkeypatch, capsys, series, files,
                                                            message):
    """Read and checked up front, before any environment is made or anything is written."""
    from tools import pr_bundle, results, validate_patches

    folder = series_folder(tmp_path, monkeypatch, series, {"ok.patch": GOOD, **files})
    (folder / "sub").mkdir()
    monkeypatch.setattr(results, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(validate_patches, "validate", lambda *a, **k: pytest.fail("validation started"))
    assert validate_patches.main(["--patch", "ok.patch"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {message}"]
    assert pr_bundle.main(["ok.patch"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {message}"]
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("diff, message", [
    (DIFF.replace("@@ -10,2 +10,3 @@", "@@ -12,x +12,3 @@"),
     "line 20: malformed hunk header '@@ -12,x +12,3 @@'"),
    (DIFF + DIFF.replace("@@ -10,2 +10,3 @@", "@@ -10 +10,3 +3 @@"),
     "line 26: malformed hunk header '@@ -10 +10,3 +3 @@'"),
    (DIFF.replace("@@ -10,2 +10,3 @@", "@@ -10,2 +10,4 @@"), "line 20: malformed hunk '@@ -10,2 +10,4 @@'"),
    (DIFF.replace("@@ -10,2 +10,3 @@", "@@ -10,2 +10,2 @@"), "line 20: malformed hunk '@@ -10,2 +10,2 @@'"),
    (DIFF.replace("@@ -10,2 +10,3 @@", "@@ -10,3 +10,4 @@"), "line 20: malformed hunk '@@ -10,3 +10,4 @@'"),
    (DIFF.replace(" line 11\n", "@@ -30,1 +31,1 @@\n line 11\n"),
     "line 20: malformed hunk '@@ -10,2 +10,3 @@'"),
], ids=["not-a-number", "three-ranges", "body-too-short", "body-too-long", "old-count", "header-in-body"])
def test_a_malformed_hunk_is_an_error_at_parse_time(tmp_path, diff, message):
    """GNU patch refuses these only when it applies the patch, minutes into a validation."""
    with pytest.raises(patches.PatchError, match="^" + re.escape(f"p.patch: {message}")):
        patches.parse(write(tmp_path, HEAD + diff))


@pytest.mark.parametrize("diff", [
    DIFF + "-- \n2.43.0\n\n",  # git format-patch's signature
    DIFF.replace(" line 11\n", " line 11\n\\ No newline at end of file\n"),
    DIFF.replace("@@ -10,2 +10,3 @@\n line 10\n", "@@ -10,2 +10,3 @@\n\n"),  # an empty context line
    DIFF.replace("@@ -10,2 +10,3 @@\n line 10\n+inserted\n line 11\n", "@@ -0,0 +1,2 @@\n+a\n+b\n"),
    DIFF + "@@ -15 +16,2 @@\n line 15\n+more\n",  # counts left out are 1
], ids=["signature", "no-newline-at-end", "empty-context-line", "new-file", "second-hunk"])
def test_hunks_as_git_and_diff_write_them_parse(tmp_path, diff):
    patch = patches.parse(write(tmp_path, HEAD + diff))
    assert patch.files == ["torch/m.py"]


def validated(results_dir: Path, patch, folder: str = "1", **changes) -> Path:
    """A summary.json of ``nox -s patches`` in which every cell of ``patch`` is as required."""
    from tools import results

    rows = [{"patch": patch.name, "cell": c, "ok": True, "applies": "applies", "before": "bad",
             "after": "good", "after_detail": "in sync", "upstream_tests": "4 failed; 31 passed", **changes}
            for c in patch.cells]
    path = results_dir / "patches" / folder / "summary.json"
    results.write_json(path, rows)
    return path


@pytest.mark.parametrize("case", ["bisect-missing", "bisect-a-folder", "not-json", "not-a-list", "row-shape"])
def test_pr_bundle_checks_every_input_before_writing_anything(tmp_path, monkeypatch, capsys, case):
    from tools import pr_bundle, results

    monkeypatch.setattr(results, "RESULTS", tmp_path)
    monkeypatch.delenv("LIGHTNING_REPO", raising=False)
    (patch,) = patches.named("lightning-ddp-rewrap-on-trainable-change.patch")
    summary = validated(tmp_path, patch)
    last = tmp_path / "pr" / patch.path.stem
    results.write_atomic(last / "branch.txt", "the last bundle\n")
    argv = [patch.name]
    if case == "bisect-missing":
        argv += ["--bisect", str(tmp_path / "missing.md")]
        message = f"--bisect {tmp_path / 'missing.md'}: cannot read it (No such file or directory)"
    elif case == "bisect-a-folder":
        argv += ["--bisect", str(tmp_path)]
        message = f"--bisect {tmp_path}: cannot read it (Is a directory)"
    elif case == "not-json":
        summary.write_text('[{"patch": ')
        message = f"{summary}: not a summary of `nox -s patches` (not JSON: Expecting value at line 1)"
    elif case == "not-a-list":
        summary.write_text('{"rows": []}')
        message = f"{summary}: not a summary of `nox -s patches` (not a list of rows)"
    else:
        validated(tmp_path, patch, after_detail=None, upstream_tests=["4 failed"], ok="yes")
        rows = json.loads(summary.read_text())
        del rows[0]["before"]
        summary.write_text(json.dumps(rows))
        message = f"{summary}: not a summary of `nox -s patches` (row 1: no valid before, ok, upstream_tests)"
    assert pr_bundle.main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {message}"]
    assert [p.name for p in last.iterdir()] == ["branch.txt"]  # the last bundle, as it was
    assert (last / "branch.txt").read_text() == "the last bundle\n"


def test_pr_bundle_reads_only_the_runs_it_needs(tmp_path, monkeypatch, capsys):
    """The newest run has every cell: an older, broken summary is not read."""
    from tools import pr_bundle, results

    monkeypatch.setattr(results, "RESULTS", tmp_path)
    monkeypatch.delenv("LIGHTNING_REPO", raising=False)
    (patch,) = patches.named("lightning-ddp-rewrap-on-trainable-change.patch")
    validated(tmp_path, patch, folder="20261129-120000")
    (tmp_path / "patches" / "20261128-120000").mkdir()
    (tmp_path / "patches" / "20261128-120000" / "summary.json").write_text("{")
    assert pr_bundle.main([patch.name]) == 0
    assert sorted(p.name for p in (tmp_path / "pr" / patch.path.stem).iterdir()) == [
        "body.md", "branch.txt", patch.name]


def test_pr_bundle_needs_an_issue_to_fix(tmp_path, monkeypatch, capsys):
    from tools import pr_bundle, results

    text = GOOD.replace(b"Bug: https://example.com/1", b"Bug: https://example.com/discussions/1")
    series_folder(tmp_path, monkeypatch, b"ok.patch\n", {"ok.patch": text})
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    (patch,) = patches.named("ok.patch")
    validated(tmp_path, patch)
    assert pr_bundle.main(["ok.patch"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: ok.patch: Bug is not an issue URL (.../issues/N), which `Fixes #N` needs"]
    assert not (tmp_path / "pr").exists()


def children(pid: int) -> list[tuple[int, str]]:
    """The processes whose parent is ``pid``, with their command lines (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                out.append((int(stat.parent.name), cmd))
        except (OSError, IndexError, ValueError):
            continue
    return out


# (signal, to the whole process group as a terminal's Ctrl-C or to the tool only, seconds to wait)
KILL = [(signal.SIGTERM, "tool", 30)]
CTRL_C = [(signal.SIGINT, "group", 30)]
RUNNER_CTRL_C = [(signal.SIGINT, "group", 0), (signal.SIGINT, "tool", 30)]  # forwarded: tools/sessions.py
NOX_CTRL_C = [(signal.SIGINT, "group", 0.3), (signal.SIGTERM, "tool", 0.2), (signal.SIGKILL, "tool", 30)]


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
@pytest.mark.parametrize("signals", [KILL, CTRL_C, RUNNER_CTRL_C, NOX_CTRL_C],
                         ids=["SIGTERM", "Ctrl-C", "Ctrl-C-forwarded", "Ctrl-C-plain-nox"])
def test_an_interrupt_removes_the_throwaway_environment(tmp_path, signals):
    """A real ``nox -s patches`` process, interrupted while uv installs into its throwaway
    environment (tests/fixtures/patch_interrupt_driver.py): the temporary folder is removed, also
    when the Ctrl-C comes twice (the noxfile's runner forwards it), and when plain nox's
    ``session.run`` SIGKILLs the tool 0.5 s after it (removing a real environment takes ~0.4 s)."""
    # two patches for one cell: the second is validated on top of the first, in a throwaway env
    cell = matrix.load().cells[0].id
    text = HEAD.replace("X-Base: v2.13.0\n", f"X-Base: v2.13.0\nX-Cells: {cell}\n").encode() + DIFF.encode()
    folder = tmp_path / "patches"
    folder.mkdir()
    (folder / "first.patch").write_bytes(text)
    (folder / "second.patch").write_bytes(text)
    (folder / "series").write_text("first.patch\nsecond.patch\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
    env.update(TMPDIR=str(tmp), REPRO_RESULTS=str(tmp_path / "results"), UV_PYTHON_DOWNLOADS="never",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fixtures" / "patch_interrupt_driver.py"),
                             str(folder), "--patch", "second.patch"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not (uv := [pid for pid, cmd in children(proc.pid) if "pip install" in cmd]):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "uv pip install never started"
            time.sleep(0.05)
        assert list(tmp.glob("patched-*/before/bin/python"))  # uv installs into the throwaway env
        for sig, to, wait in signals:
            os.killpg(proc.pid, sig) if to == "group" else proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(wait)
                break
        out, err = proc.communicate(timeout=30)
        uv_left = Path(f"/proc/{uv[0]}").exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode != -signal.SIGKILL:  # nox did not have to kill it
        assert proc.returncode == 130, err
        assert err.splitlines() == ["interrupted: 0 of 1 rows finished, nothing kept; the throwaway "
                                    "environments were removed"]
        assert not uv_left  # killed and waited for, not left installing
    deadline = time.monotonic() + 10
    while list(tmp.glob("patched-*")):  # once the tool is killed, the removal may still be under way
        assert time.monotonic() < deadline, "the throwaway environment was left behind"
        time.sleep(0.05)


def test_after_the_first_interrupt_the_cleanup_is_not_cut_short():
    """nox sends SIGTERM 0.3 s after the Ctrl-C: it must not interrupt the removal the first one
    started. Ignored signals stay ignored; the handlers are restored afterwards."""
    from tools import validate_patches

    before = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.getsignal(signal.SIGTERM)
    try:
        with validate_patches.interrupts_unwind():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # as in a background job
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            os.kill(os.getpid(), signal.SIGTERM)  # nox's, during the cleanup: ignored
            time.sleep(0.1)
        assert signal.getsignal(signal.SIGTERM) is before[1]
    finally:
        signal.signal(signal.SIGINT, before[0])
