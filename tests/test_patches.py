"""The patch series: parsing, checks against installed trees, and the torch patch for real."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
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
    (["--cell", "pl0_0_0-torch0_0_0"], "error: no patch of the series targets cell 'pl0_0_0-torch0_0_0'"),
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
