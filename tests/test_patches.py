"""The patch series: parsing, checks against installed trees, and the torch patch for real."""

import contextlib
import difflib
import importlib.util
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import pytest
from conftest import patched_copy

from tools.environments import matrix
from tools.launch import harness
from tools.launch.preloaded import Runner
from tools.series import patches, series_gates

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
X-Repro: repro/finetuning_resume.py
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
    assert patch.files == ["torch/m.py"] and patch.repro == ["repro/finetuning_resume.py"]


@pytest.mark.parametrize("text, message", [
    (HEAD.replace("Bug: https://example.com/1\n", "") + DIFF, "missing field Bug"),
    (HEAD.replace("X-Base: v2.13.0\n", "") + DIFF, "missing field X-Base"),
    (HEAD, "no unified diff"),
    (HEAD.replace("X-Target: torch", "X-Target: numpy") + DIFF, "X-Target must be one of"),
    ("just words\n\n" + DIFF, "not a git format-patch file"),
    (HEAD.replace("Forwarded: no\n", "Forwarded: no\nnot a field\n") + DIFF, "not a field"),
    (HEAD.replace("Subject: [PATCH] a title that goes\n on the next line\n", "") + DIFF, "no Subject"),
    (HEAD + "--- a/x\n+++ b/x\n", "no file or no hunk"),
    # every field's value is checked when the patch is read, not minutes into its validation
    (HEAD.replace("X-Expect-Before: bad", "X-Expect-Before: maybe") + DIFF,
     "X-Expect-Before: 'maybe' is not one of good, bad, skip"),
    (HEAD.replace("X-Expect-After: good", "X-Expect-After: fixed") + DIFF, "X-Expect-After: 'fixed'"),
    (HEAD.replace("Last-Update: 2026-11-29", "Last-Update: yesterday") + DIFF, "is not a date"),
    (HEAD.replace("Forwarded: no", "Forwarded: maybe later") + DIFF, "Forwarded: 'maybe later'"),
    (HEAD.replace("Origin: other", "Origin: somewhere") + DIFF, "Origin: 'somewhere' does not start"),
    (HEAD.replace("Bug: https://example.com/1", "Bug: issue one") + DIFF, "Bug: 'issue one' is neither"),
    (HEAD.replace("X-Repro: repro/finetuning_resume.py", "X-Repro: repro/nope.py") + DIFF,
     "X-Repro: 'repro/nope.py' does not start with a repro script"),
    (HEAD.replace("X-Base: v2.13.0\n", "X-Base: v2.13.0\nX-Cells: pl9_9_torch9\n") + DIFF,
     "X-Cells: unknown cell 'pl9_9_torch9'"),
    (HEAD.replace("X-Base: v2.13.0\n", "X-Base: v2.13.0\nX-Changelog: Fixes\n") + DIFF,
     "X-Changelog: 'Fixes' is not one of"),
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
        state = patches.check(patch, copy, 4, patches.installable_for(patch, copy)).state
        assert state in ("applies", "drift"), patch.name
        patches.apply(patch, copy, 4, patches.installable_for(patch, copy))
    first = series[0]
    src = tmp_path / "git-apply"
    for rel in first.installable_files():
        target = src / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        mirror = (site / "pytorch_lightning" / Path(rel).relative_to("src/lightning/pytorch")).read_text()
        # the mirror's module names back to the source's (the reverse of Lightning's build)
        target.write_text(mirror.replace("pytorch_lightning", "lightning.pytorch").replace(
            "lightning_fabric", "lightning.fabric"))
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


def test_applied_code_runs_even_where_bytecode_is_not_checked_against_its_source(tmp_path):
    # a throwaway environment gets the cell's bytecode linked in (envs.link_bytecode); bytecode
    # compiled as "unchecked" would run the old code of a patched file: apply removes it
    import py_compile

    code = ORIGINAL.replace("line ", "# line ")
    diff = DIFF.replace(" line", " # line").replace("+inserted", "+PATCHED = True")
    patch = patches.parse(write(tmp_path, HEAD + diff))
    site = tree(tmp_path, code)
    (site / "torch" / "__init__.py").write_text("")
    for name in ("__init__.py", "m.py"):
        source = str(site / "torch" / name)
        py_compile.compile(source, cfile=importlib.util.cache_from_source(source),
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    patches.apply(patch, *patches.installed_root(site, patch))
    assert (site / "torch" / "__pycache__").is_dir()  # the unchanged file's bytecode stays
    assert list((site / "torch" / "__pycache__").glob("m.*.pyc")) == []
    seen = subprocess.run([sys.executable, "-c", "import torch.m; print(getattr(torch.m, 'PATCHED', 0))"],
                          cwd=site, capture_output=True, text=True)
    assert seen.stdout.strip() == "True", seen.stderr


def test_a_throwaway_environment_gets_the_cells_bytecode_linked_not_compiled(tmp_path):
    from tools.environments import envs

    cell, other = tmp_path / "cell", tmp_path / "other"
    for site in (cell, other):
        (site / "pkg" / "sub").mkdir(parents=True)
    (cell / "only_here").mkdir()
    for rel in ("pkg/__init__.py", "pkg/sub/__init__.py", "only_here/__init__.py"):
        (cell / rel).write_text("X = 1\n")
        if (other / rel).parent.is_dir():
            os.link(cell / rel, other / rel)  # as uv links both from its cache
    import compileall

    assert compileall.compile_dir(str(cell), quiet=1)
    assert envs.link_bytecode(cell, other) == 2
    for rel in ("pkg", "pkg/sub"):
        (pyc,) = (cell / rel / "__pycache__").iterdir()
        linked = other / rel / "__pycache__" / pyc.name
        assert linked.stat().st_ino == pyc.stat().st_ino
        # valid there: Python takes bytecode whose recorded source time and size are the source's
        flags, mtime, size = struct.unpack("<III", linked.read_bytes()[4:16])
        source = (other / rel / "__init__.py").stat()
        assert (flags, mtime, size) == (0, int(source.st_mtime) & 0xFFFFFFFF, source.st_size)
    assert not (other / "only_here").exists()  # a package the other one does not have


def test_lightning_paths_map_onto_either_installed_name(tmp_path):
    patch = patches.parse(write(tmp_path, HEAD.replace("X-Target: torch", "X-Target: lightning")
                                + DIFF.replace("torch/m.py", "src/lightning/pytorch/m.py")))
    (tmp_path / "a" / "pytorch_lightning").mkdir(parents=True)
    (tmp_path / "b" / "lightning" / "pytorch").mkdir(parents=True)
    assert patches.installed_root(tmp_path / "a", patch) == (tmp_path / "a" / "pytorch_lightning", 4)
    assert patches.installed_root(tmp_path / "b", patch) == (tmp_path / "b" / "lightning" / "pytorch", 4)
    with pytest.raises(patches.PatchError, match="no Lightning installed"):
        patches.installed_root(tmp_path / "c", patch)


def test_a_patch_that_also_changes_fabric_lands_in_both_packages(tmp_path):
    """Fabric's files land in ``lightning/fabric`` (the unified package) or in the
    ``lightning_fabric`` mirror next to ``pytorch_lightning``."""
    diff = (DIFF.replace("torch/m.py", "src/lightning/pytorch/m.py")
            + DIFF.replace("torch/m.py", "src/lightning/fabric/m.py"))
    patch = patches.parse(write(tmp_path, HEAD.replace("X-Target: torch", "X-Target: lightning") + diff))
    assert patch.touches_fabric
    layouts = {"unified": ("lightning/pytorch", "lightning/fabric"),
               "mirrors": ("pytorch_lightning", "lightning_fabric")}
    for name, folders in layouts.items():
        site = tmp_path / name
        for folder in folders:
            (site / folder).mkdir(parents=True)
            (site / folder / "m.py").write_text(ORIGINAL)
        root, level = patches.installed_root(site, patch)
        patches.apply(patch, root, level, patches.installable_for(patch, root))
        for folder in folders:
            assert "inserted" in (site / folder / "m.py").read_text(), (name, folder)


@pytest.mark.ddp
@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
def test_torch_patch_turns_the_raw_crash_into_the_clear_error(tmp_path):
    import torch as torch_module

    from tools.environments import envs

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
    envs.link_bytecode(Path(torch_module.__file__).parent.parent, Path(site))  # as validate_patches does
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


def run_repro(patch, runner: Runner, log_stem: Path):
    """The patch's repro as a fork of ``runner`` (judged as a new interpreter's run would be:
    tests/test_equivalence.py)."""
    script, *args = patch.repro
    return runner.run({"argv": [str(ROOT / script), *args], "timeout": 600, "log_stem": str(log_stem),
                       "signature": None})


@pytest.fixture(scope="session")
def on_series(tmp_path_factory):
    """``on_series(applied)``: a preloaded runner whose PYTHONPATH starts with a copy of the
    installed pytorch_lightning with ``applied`` patched in; made on first use and kept while a
    later test may need it, since the series' prefixes repeat (patch k's "before" is patch k-1's
    "after"): each patched copy is imported once."""
    made: dict[tuple[str, ...], Runner] = {}

    def get(applied: list) -> Runner:
        key = tuple(p.name for p in applied)
        if key not in made:
            for shorter in [k for k in made if len(k) < len(key) - 1]:  # no later test needs it
                made.pop(shorter).close()
            folder = patched_copy(tmp_path_factory.mktemp("series"), applied)
            made[key] = Runner(sys.executable, env={**os.environ, "PYTHONPATH": str(folder)},
                               stderr=folder / "runner.stderr")
        return made[key]

    yield get
    for runner in made.values():
        runner.close()


@pytest.mark.ddp
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", LIGHTNING_PATCHES)
def test_lightning_patch_on_top_of_the_series_fixes_its_bug_and_keeps_the_earlier_fixes(on_series, tmp_path,
                                                                                        name):
    """Patches 1..k-1 applied: patch k's repro is bad; with patch k too, it is good, and the
    repros of the earlier patches still give their fixed verdict (patch 1 + 2: the #20340 repro
    stays in sync and the re-wrap scenario of the stress test gives the clear error)."""
    series = [p for p in patches.series() if p.target == "lightning"]
    k = [p.name for p in series].index(name)
    patch, earlier = series[k], series[:k]
    cells = {c.id: c for c in matrix.load().cells}
    if metadata.version("pytorch_lightning") not in {cells[c].lightning for c in patch.cells}:
        pytest.skip(f"the installed Lightning is not a cell of {name}")
    before = run_repro(patch, on_series(earlier), tmp_path / "before")
    assert before.verdict == patch.headers["X-Expect-Before"], before.reason
    runner = on_series([*earlier, patch])
    after = run_repro(patch, runner, tmp_path / "after")
    assert after.verdict == patch.headers["X-Expect-After"], after.reason
    assert runner.forked, runner.stderr.read_text()  # the copy imported
    for e in earlier:
        still = run_repro(e, runner, tmp_path / f"after-{e.path.stem}")
        assert still.verdict == e.headers["X-Expect-After"], (e.name, still.reason)
    mine = Path(metadata.distribution("pytorch_lightning").locate_file("pytorch_lightning/strategies/ddp.py"))
    assert "_rewrap_if_trainable_changed" not in mine.read_text()  # the installed Lightning is untouched


def test_a_series_patch_splits_into_installable_sources_and_test_changes():
    (patch,) = patches.named("lightning-ddp-rewrap-on-trainable-change.patch")
    assert set(patch.sections()) == set(patch.files)
    installable = patch.installable_diff()
    assert "src/lightning/pytorch/strategies/ddp.py" in installable
    assert "CHANGELOG" not in installable and "tests/" not in installable
    tests = patch.test_changes()
    assert tests and all(path.startswith("tests/tests_pytorch/") for path in tests)
    changelog = patch.sections()["src/lightning/pytorch/CHANGELOG.md"]
    pending = re.escape("([#PR](https://github.com/Lightning-AI/pytorch-lightning/pull/PR))")
    assert re.search(rf"(?m)^\+- Fixed DDP replicas .*{pending}$", changelog)


def test_the_torch_patch_carries_a_test_in_torchs_layout():
    (patch,) = [p for p in patches.series() if p.target == "torch"]
    assert patch.test_changes() and all(path.startswith("test/") for path in patch.test_changes())
    assert patch.installable_files() == ["torch/nn/parallel/distributed.py"]


def test_unittest_counts_read_torch_style_test_files(tmp_path):
    from tools.series import series_gates

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
    counts = series_gates.unittest_counts(Path(sys.executable), tmp_path, ["t.py"])
    assert counts == {"passed": 1, "failed": 1, "error": 1, "skipped": 1}
    assert series_gates.unittest_counts(Path(sys.executable), tmp_path, ["broken.py"]) == {"error": 1}


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

    def earlier_patch_fails(patch, cell, out, earlier, log=print, repeat=5):
        raise patches.PatchError("lightning-x.patch does not apply: ['1 out of 2 hunks FAILED']")

    monkeypatch.setattr(validate_patches, "validate", earlier_patch_fails)
    (patch,) = [p for p in patches.series() if p.target == "torch"]
    assert validate_patches.main(["--patch", patch.name]) == 1
    rows = json.loads(next(tmp_path.glob("patches/*/summary.json")).read_text())
    assert [r["cell"] for r in rows] == patch.cells
    assert all(not r["ok"] and r["applies"].startswith("fails (lightning-x.patch") for r in rows)
    assert "| NO |" in capsys.readouterr().out


def test_pr_bundle_refuses_a_patch_that_has_not_validated(tmp_path, monkeypatch, capsys):
    from tools import pr_bundle
    from tools.core import results

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
    assert f"**{patch.headers['Description'].splitlines()[0]}**" in body
    assert "### What was wrong\n\n" in body and "### What changed\n\n" in body
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
    (b"ok.patch\nbad.patch\n",
     {"bad.patch": GOOD.replace(b"repro/finetuning_resume.py", b"repro/finetuning_resume.py 'a b")},
     "bad.patch: X-Repro is not a command line (No closing quotation)"),
], ids=["patch-not-utf8", "series-not-utf8", "directory", "missing", "hunk-header", "hunk-counts", "x-repro"])
def test_a_bad_series_is_one_line_and_exit_2_for_both_tools(tmp_path, monkeypatch, capsys, series, files,
                                                            message):
    """Read and checked up front, before any environment is made or anything is written."""
    from tools import pr_bundle, validate_patches
    from tools.core import results

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
    from tools.core import results

    rows = [{"patch": patch.name, "cell": c, "ok": True, "applies": "applies", "before": "bad",
             "after": "good", "after_detail": "in sync", "upstream_tests": "4 failed; 31 passed", **changes}
            for c in patch.cells]
    path = results_dir / "patches" / folder / "summary.json"
    results.write_json(path, rows)
    return path


@pytest.mark.parametrize("case", ["bisect-missing", "bisect-a-folder", "not-json", "not-a-list", "row-shape"])
def test_pr_bundle_checks_every_input_before_writing_anything(tmp_path, monkeypatch, capsys, case):
    from tools import pr_bundle
    from tools.core import results

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
    from tools import pr_bundle
    from tools.core import results

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
    from tools import pr_bundle
    from tools.core import results

    text = GOOD.replace(b"Bug: https://example.com/1", b"Bug: https://example.com/discussions/1")
    series_folder(tmp_path, monkeypatch, b"ok.patch\n", {"ok.patch": text})
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    (patch,) = patches.named("ok.patch")
    validated(tmp_path, patch)
    assert pr_bundle.main(["ok.patch"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: ok.patch: Bug is not an issue URL (.../issues/N), which `Fixes #N` needs"]
    assert not (tmp_path / "pr").exists()


@pytest.mark.parametrize("order", ["bug-first", "bug-last"])
def test_pr_bundle_of_a_torch_patch_is_a_commit_without_the_series_fields(tmp_path, monkeypatch, capsys,
                                                                          order):
    from tools import pr_bundle
    from tools.core import results

    bug = b"Bug: https://github.com/pytorch/pytorch/issues/123\n"
    text = GOOD.replace(b"Bug: https://example.com/1\n", b"" if order == "bug-last" else bug)
    fields_end = b"X-Cells: pl2_6_6_torch2_13_0\n" + (bug if order == "bug-last" else b"")
    text = text.replace(b"X-Base: v2.13.0\n", b"X-Base: v2.13.0\n" + fields_end)
    # a paragraph of the message that happens to start like a field
    text = text.replace(b"Why the change is needed.\n", b"Why the change is needed.\n\nBug: none of ours.\n")
    series_folder(tmp_path, monkeypatch, b"ok.patch\n", {"ok.patch": text})
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    monkeypatch.setattr(pr_bundle, "identity", lambda: ("A Person", "a.person@example.org"))
    (patch,) = patches.named("ok.patch")
    validated(tmp_path, patch)
    assert pr_bundle.main(["ok.patch"]) == 0, capsys.readouterr().err
    made = tmp_path / "pr" / "ok" / "ok.patch"
    message, _, diff = made.read_text().partition("\n---\n")
    assert message.endswith("Why the change is needed.\n\nBug: none of ours.\n\nFixes #123")
    assert not re.search(r"(?m)^(Bug: http|Forwarded|Origin|Last-Update|X-[\w-]+):?", message)
    assert diff == DIFF
    repo = tmp_path / "torch-checkout"
    (repo / "torch").mkdir(parents=True)
    (repo / "torch" / "m.py").write_text(ORIGINAL)
    git = ["git", "-c", "user.name=x", "-c", "user.email=x@example.org"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"], ["am", "-q", str(made)],
                 ["log", "-1", "--format=%an <%ae>%n%B"]):
        proc = subprocess.run([*git, *args], cwd=repo, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("A Person <a.person@example.org>\na title that goes on the next line\n\n"
                                   "Why the change is needed.\n\nBug: none of ours.\n\nFixes #123")


def test_pr_bundle_asks_for_the_issue_a_draft_becomes(tmp_path, monkeypatch, capsys):
    from tools import pr_bundle
    from tools.core import results

    text = GOOD.replace(b"Bug: https://example.com/1", b"Bug: patches/issues/some-bug.md")
    folder = series_folder(tmp_path, monkeypatch, b"ok.patch\n", {"ok.patch": text})
    (folder / "issues").mkdir()
    (folder / "issues" / "some-bug.md").write_text("# a draft of the issue\n")
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    (patch,) = patches.named("ok.patch")
    validated(tmp_path, patch)
    assert pr_bundle.main(["ok.patch"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: ok.patch: Bug names the draft patches/issues/some-bug.md: file that issue upstream, "
        "then put its URL in Bug"]


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


def still_uv(pid: int) -> bool:
    """Is ``pid`` still that uv: alive and installing, or a zombie nobody waited for? (On a busy
    machine its pid may already belong to another process: pid_max can be 32768.)"""
    try:
        comm, fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return comm.endswith("(uv") and (fields.split()[0] == "Z" or b"pip install" in cmd)


# (signal, to the whole process group as a terminal's Ctrl-C or to the tool only, seconds to wait)
KILL = [(signal.SIGTERM, "tool", 30)]
CTRL_C = [(signal.SIGINT, "group", 30)]
RUNNER_CTRL_C = [(signal.SIGINT, "group", 0), (signal.SIGINT, "tool", 30)]  # forwarded: tools/sessions.py
NOX_CTRL_C = [(signal.SIGINT, "group", 0.3), (signal.SIGTERM, "tool", 0.2), (signal.SIGKILL, "tool", 30)]


SECOND_SIGNAL = """
import os, signal, subprocess, sys
from tools.series import patched

class Term(Exception):
    pass

def raise_term(signum, frame):
    raise Term

signal.signal(signal.SIGTERM, raise_term)
real_wait = subprocess.Popen.wait
calls, reaped = [], []

def wait(self, timeout=None):
    calls.append(self.pid)
    if len(calls) == 1:  # the first wait: Ctrl-C arrives
        raise KeyboardInterrupt
    if len(calls) == 2:  # the second signal, in the middle of the kill's wait
        os.kill(os.getpid(), signal.SIGTERM)
    code = real_wait(self, timeout)
    reaped.append(len(calls))
    return code

subprocess.Popen.wait = wait
try:
    patched._uv(["sleep", "60"])
except (KeyboardInterrupt, Term) as err:
    print(type(err).__name__, reaped)
"""


@pytest.mark.timeout(60)
def test_a_second_signal_does_not_leave_uv_unreaped():
    """Ctrl-C, then (as plain nox does 0.3 s later) SIGTERM while uv is being killed: the kill's
    own wait still runs to its end before the interrupt goes on, so uv is gone before its folder
    is removed. In a process of one thread, as ``nox -s patches`` is (a signal another thread
    takes is handled whatever this one blocks)."""
    out = subprocess.run([sys.executable, "-c", SECOND_SIGNAL], cwd=ROOT, capture_output=True, text=True,
                         timeout=50)
    reaped = json.loads(out.stdout.split(None, 1)[1])  # the waits that ran to their end
    assert reaped[:1] == [2], (out.stdout, out.stderr)  # the kill's own, not only Popen's exit


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
        uv_left = still_uv(uv[0])
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
    started. Ignored signals stay ignored; once interrupted, later ones stay ignored to the exit
    (the handlers are put back only when no interrupt came)."""
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
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])


# -- the gates: existing tests, flakiness, tools/series/gates.py, the table --------------------------

OLD_TEXT = """import pytest


def test_old(tmp_path):
    assert True
""" + "".join(f"# {i}\n" for i in range(6, 20)) + """class TestThings:
    def test_kept(self):
        pass
"""
NEW_TEXT = OLD_TEXT.replace("    assert True\n", """    Trainer(devices=2, strategy="ddp_spawn")  # changed


@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp_fork"])
def test_new_two_ranks(strategy):
    Trainer(strategy=strategy)


def test_new_one_process():
    DDPStrategy(parallel_devices=[torch.device("cpu")], devices=1)
""") + """
    def test_new_method(self):
        start_processes(run, nprocs=2)

    def helper_new(self):
        Trainer(devices=4)
"""
TEST_PATH = "tests/tests_pytorch/strategies/test_s.py"
TEST_DIFF = "".join(difflib.unified_diff(OLD_TEXT.splitlines(True), NEW_TEXT.splitlines(True),
                                         f"a/{TEST_PATH}", f"b/{TEST_PATH}"))


def test_the_lines_a_diff_adds_are_numbered_as_in_the_new_file():
    from tools.series import upstream_tests as ut

    assert TEST_DIFF.count("@@ ") == 2  # two hunks
    added = ut.added_lines(TEST_DIFF)
    lines = NEW_TEXT.splitlines()
    assert {lines[n - 1] for n in added} == set(NEW_TEXT.splitlines()) - set(OLD_TEXT.splitlines()) | {""}
    assert min(added) == 5  # "def test_old" is context, its body line replaced
    # the same from a diff whose blank context lines lost their space (as some editors save them)
    assert ut.added_lines(TEST_DIFF.replace("\n \n", "\n\n")) == added


def test_new_tests_are_found_and_the_multi_process_ones_picked(tmp_path):
    from tools.series import upstream_tests as ut

    path = TEST_PATH
    found = ut.added_tests(path, TEST_DIFF, NEW_TEXT)
    assert list(found) == [f"{path}::test_new_two_ranks", f"{path}::test_new_one_process",
                           f"{path}::TestThings::test_new_method"]
    assert found[f"{path}::test_new_two_ranks"].startswith("@pytest.mark.parametrize")  # decorators too
    (tmp_path / path).parent.mkdir(parents=True)
    (tmp_path / path).write_text(NEW_TEXT)
    assert ut.multi_process_tests({path: TEST_DIFF}, tmp_path) == [
        f"{path}::test_new_two_ranks", f"{path}::TestThings::test_new_method"]


@pytest.mark.parametrize("source, several", [
    ('Trainer(accelerator="cpu", devices=2)', True),
    ("Trainer(devices=[0, 1])", True),
    ("Trainer(devices=16)", True),
    ('Trainer(strategy="ddp")', True),
    ("DDPStrategy(start_method='spawn')", True),
    ("mp.start_processes(f, nprocs=2)", True),
    ("init_process_group('gloo', rank=0, world_size=2)", True),
    ("Trainer(devices=1)", False),
    ("Trainer(devices=[0])", False),
    ('DDPStrategy(parallel_devices=[torch.device("cpu")])', False),
    ("init_process_group('gloo', store=HashStore(), rank=0, world_size=1)", False),
    ("def test_ddp_kwargs(): pass", False),
])
def test_the_multi_process_rule(source, several):
    from tools.series import upstream_tests as ut

    assert ut.is_multi_process(source) is several


def test_covering_tests_are_the_existing_test_modules_of_each_source_module(tmp_path):
    from tools.series import upstream_tests as ut

    for rel in ("strategies/test_ddp.py", "strategies/test_ddp_integration.py", "strategies/test_ddp_x.txt",
                "strategies/test_ddpx.py", "callbacks/test_finetuning_callback.py", "test_cli.py"):
        (tmp_path / "tests/tests_pytorch" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests/tests_pytorch" / rel).write_text("")
    files = ["src/lightning/pytorch/strategies/ddp.py", "src/lightning/pytorch/callbacks/finetuning.py",
             "src/lightning/pytorch/cli.py", "src/lightning/pytorch/CHANGELOG.md",
             "src/lightning/pytorch/strategies/__init__.py", "src/lightning/fabric/strategies/ddp.py",
             "tests/tests_pytorch/strategies/test_ddp.py"]
    assert ut.covering_tests(files, tmp_path) == [
        f"tests/tests_pytorch/{rel}"
        for rel in ("callbacks/test_finetuning_callback.py", "strategies/test_ddp.py",
                    "strategies/test_ddp_integration.py", "test_cli.py")]


CASE = ('<testcase classname="tests.tests_pytorch.test_a{cls}" name="{name}" '
        'file="tests/tests_pytorch/test_a.py">')
JUNIT = "\n".join([
    '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">',
    CASE.format(cls="", name="test_ok") + "</testcase>",
    CASE.format(cls="", name="test_p[x-1]") + '<failure message="assert 0"/></testcase>',
    CASE.format(cls=".TestC", name="test_m") + '<skipped message="GPU"/></testcase>',
    CASE.format(cls="", name="test_td") + "</testcase>",
    CASE.format(cls="", name="test_td") + '<error message="teardown"/></testcase>',
    '<testcase classname="" name="tests.tests_pytorch.test_b">'
    '<error message="collection failure"/></testcase>',
    "</testsuite></testsuites>"])


def test_a_junit_report_gives_one_outcome_per_node_id(tmp_path):
    from tools.series import upstream_tests as ut

    (tmp_path / "r.xml").write_text(JUNIT)
    assert ut.read_junit(tmp_path / "r.xml") == {
        "tests/tests_pytorch/test_a.py::test_ok": "passed",
        "tests/tests_pytorch/test_a.py::test_p[x-1]": "failed",
        "tests/tests_pytorch/test_a.py::TestC::test_m": "skipped",
        "tests/tests_pytorch/test_a.py::test_td": "error",  # passed, then its teardown failed
        "tests.tests_pytorch.test_b": "error"}


def test_regressions_compare_per_node_id_not_counts():
    from tools.series import upstream_tests as ut

    before = {"a": "passed", "b": "passed", "c": "failed", "d": "passed", "e": "passed", "f": "skipped"}
    after = {"a": "passed", "b": "failed", "c": "passed", "e": "skipped", "f": "failed", "new": "passed"}
    # same counts would hide it: 4 passed before, and a test that failed now passes
    assert ut.regressions(before, after) == {"b": "failed", "d": "missing", "e": "skipped"}
    assert ut.regressions(before, before) == {}


def fake_tree(root: Path, tests: dict[str, str]) -> Path:
    """A checkout-shaped folder: ``src/`` and ``tests/tests_pytorch/<files>``."""
    (root / "src").mkdir(parents=True)
    for rel, text in tests.items():
        (root / "tests/tests_pytorch" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "tests/tests_pytorch" / rel).write_text(text)
    return root


def test_the_existing_tests_gate_fails_when_a_test_that_passed_breaks(tmp_path):
    """Real pytest runs on two small trees; the per-test comparison, not the summary line."""
    from tools.series import upstream_tests as ut

    ok = "def test_one():\n    pass\n\ndef test_two():\n    pass\n\ndef test_three():\n    assert False\n"
    broken = ok.replace("def test_two():\n    pass", "def test_two():\n    assert False").replace(
        "def test_three():\n    assert False", "def test_three():\n    pass")  # 1 fails, 1 fixed
    files = ["tests/tests_pytorch/strategies/test_x.py"]
    runs = {}
    for name, text in (("before", ok), ("same", ok), ("broken", broken)):
        tree = fake_tree(tmp_path / name, {"strategies/test_x.py": text})
        runs[name] = ut.run_pytest(Path(sys.executable), tree, files, tmp_path / "logs" / name, timeout=120)
    assert runs["before"].counts() == {"passed": 2, "failed": 1}
    assert runs["broken"].counts() == runs["before"].counts()  # the summary line cannot tell
    failed = ut.existing_tests_gate(runs["before"], runs["broken"], files)
    assert not failed["ok"]
    assert failed["text"].endswith("1 of 2 that passed do not: test_x.py::test_two (failed)")
    passed = ut.existing_tests_gate(runs["before"], runs["same"], files)
    assert passed["ok"] and passed["text"].endswith("all 2 that passed still pass")
    crashed = ut.Report({}, -11, "Segmentation fault", reported=False)
    assert not ut.existing_tests_gate(runs["before"], crashed, files)["ok"]
    assert not ut.existing_tests_gate(crashed, runs["same"], files)["ok"]
    assert ut.existing_tests_gate(None, runs["same"], [])["ok"]


def test_a_child_that_died_is_named_in_the_test_gates():
    from tools.series import series_gates
    from tools.series import upstream_tests as ut

    file = "tests/tests_pytorch/strategies/test_x.py"
    before = ut.Report({f"{file}::test_a": "passed", f"{file}::test_b[1]": "passed"}, 0)
    output = "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGABRT"
    died = ut.Report({f"{file}::test_a": "passed", f"{file}::test_b[1]": "failed"}, 1, output)
    gate = ut.existing_tests_gate(before, died, [file])
    assert not gate["ok"]
    assert gate["text"].endswith("1 of 2 that passed do not: test_x.py::test_b[1] (failed); a child process "
                                 "died of SIGABRT (test_b[1])")
    tests = {file: "the diff"}
    gate = series_gates.upstream_tests_gate(tests, ut.Report({f"{file}::test_b[1]": "failed"}, 1), died,
                                                [file], [file])
    assert not gate["ok"]
    assert gate["text"] == ("master + its tests: 1 failed; patched: 1 passed, 1 failed (a child process died "
                            "of SIGABRT (test_b[1]))")
    assert series_gates.upstream_tests_gate(tests, ut.Report({f"{file}::test_b[1]": "failed"}, 1), before,
                                                [file], [file])["ok"]


FLAKY_TEST = '''
import os
import sys
from pathlib import Path

import torch.multiprocessing as mp

COUNTER = Path(__file__).with_name("runs")


def child(rank, abort):
    if abort and rank == 1:
        os.abort()  # as a child aborting at exit ("terminate called without an active exception")


def test_two_processes():
    run = int(COUNTER.read_text()) + 1 if COUNTER.exists() else 1
    COUNTER.write_text(str(run))
    mp.start_processes(child, args=(run == int(os.environ.get("ABORT_ON_RUN", 0)),), nprocs=2,
                       start_method="fork")
'''


@pytest.mark.timeout(300)
@pytest.mark.parametrize("abort_on", [0, 2], ids=["steady", "child-aborts-on-run-2"])
def test_the_flaky_gate_counts_failed_runs_and_names_a_childs_sigabrt(tmp_path, monkeypatch, abort_on):
    from tools.series import upstream_tests as ut

    tree = fake_tree(tmp_path / "tree", {"test_mp.py": FLAKY_TEST})
    node = "tests/tests_pytorch/test_mp.py::test_two_processes"
    section = "--- /dev/null\n+++ b/tests/tests_pytorch/test_mp.py\n@@ -0,0 +1,22 @@\n" + "".join(
        f"+{line}\n" for line in FLAKY_TEST.splitlines()[1:])
    assert ut.multi_process_tests({"tests/tests_pytorch/test_mp.py": section}, tree) == [node]
    monkeypatch.setenv("ABORT_ON_RUN", str(abort_on))
    result = ut.flaky_gate([node], 3, lambda i: ut.run_pytest(Path(sys.executable), tree, [node],
                                                               tmp_path / f"run-{i}", timeout=120))
    if abort_on:
        assert not result["ok"]
        assert result["text"] == ("1/3 failed (1 tests: test_two_processes): run 2: a child process died "
                                  "of SIGABRT (test_two_processes)")
        assert [r["failed"] for r in result["details"]["runs"]] == [False, True, False]
    else:
        assert result["ok"] and result["text"] == "0/3 failed (1 tests: test_two_processes)"
    nothing = ut.flaky_gate([], 3, lambda i: pytest.fail("nothing to run"))
    assert nothing == {"ok": True, "text": "no new multi-process test"}


@pytest.mark.parametrize("returncode, output, failing, expected", [
    (-6, "", [], "the test process died of SIGABRT"),
    (1, "ProcessExitedException: process 1 terminated with signal SIGSEGV", ["t::x"],
     "a child process died of SIGSEGV (x)"),
    (1, "AssertionError: child exit code -6", ["t::x"], "a child process died of SIGABRT (x)"),
    (1, "terminate called without an active exception\nAborted (core dumped)", [],
     "a process aborted (SIGABRT)"),
    (1, "assert 1 == 2", ["t::x", "t::y[a]"], "failed: x, y[a]"),
    (4, "ERROR: file or directory not found", [], "exit 4, no report"),
])
def test_a_failed_run_says_how_it_failed(returncode, output, failing, expected):
    from tools.series import upstream_tests as ut

    report = ut.Report({node: "failed" for node in failing}, returncode, output, reported=bool(failing))
    assert ut.run_failed(report)
    assert ut.describe(report) == expected
    assert ut.describe(ut.Report({}, -9, "", timed_out=True)) == "timed out; its processes were killed"


def test_torch_style_tests_repeat_by_class_and_name(tmp_path, monkeypatch):
    from tools.series import series_gates
    from tools.series import upstream_tests as ut

    test = tmp_path / "test" / "distributed" / "test_t.py"
    test.parent.mkdir(parents=True)
    test.write_text("import os, unittest\n\nclass T(unittest.TestCase):\n"
                    "    def test_a(self):\n        self.assertFalse(os.environ.get('FAIL'))\n\n"
                    "    def test_b(self):\n        pass\n\n"
                    "if __name__ == '__main__':\n    unittest.main()\n")
    node = "test/distributed/test_t.py::T::test_a"
    ok = series_gates.torch_run(Path(sys.executable), tmp_path, [node], tmp_path / "ok")
    assert ok.returncode == 0 and "Ran 1 test" in ok.output and not ut.run_failed(ok)
    monkeypatch.setenv("FAIL", "1")
    bad = series_gates.torch_run(Path(sys.executable), tmp_path, [node], tmp_path / "bad")
    assert ut.run_failed(bad) and ut.describe(bad) == "exit 1"


def fake_gates(monkeypatch, **results):
    """A ``tools.series.gates`` of the agreed API whose gates answer ``results`` (name -> ok, or an
    exception to raise)."""
    import types as pytypes

    from tools import validate_patches

    module = pytypes.ModuleType("tools.series.gates")
    module.Gate = lambda name, ok, text, details="": pytypes.SimpleNamespace(name=name, ok=ok, text=text,
                                                                             details=details)
    calls = {}

    def answer(name, *args, **kwargs):
        calls[name] = args
        if isinstance(results[name], Exception):
            raise results[name]
        return module.Gate(name, results[name], f"{name} {'clean' if results[name] else 'broken'}",
                           f"full {name} output")

    module.typecheck = lambda before, after, files, log=print: answer("types", before, after, files)
    module.lint = lambda after, changed, log=print, before=None: answer("lint", after, changed, before)
    module.license_headers = lambda after, added: answer("license", after, added)
    module.changelog = lambda patch, after: answer("changelog", patch, after)
    import tools.series

    monkeypatch.setitem(sys.modules, "tools.series.gates", module)
    monkeypatch.setattr(tools.series, "gates", module, raising=False)
    return validate_patches, calls


def test_the_gates_of_tools_gates_plug_in_fail_and_pass(tmp_path, monkeypatch):
    (patch,) = [p for p in patches.series() if p.target == "lightning"][:1]
    validate_patches, calls = fake_gates(monkeypatch, types=True, lint=False, license=True,
                                         changelog=RuntimeError("no CHANGELOG.md"))
    gates = series_gates.other_gates(patch, tmp_path / "before", tmp_path / "after", tmp_path / "logs")
    assert {name: (g["ok"], g["text"]) for name, g in gates.items()} == {
        "types": (True, "types clean"), "lint": (False, "lint broken"), "license": (True, "license clean"),
        "changelog": (False, "could not run: RuntimeError: no CHANGELOG.md")}
    assert (tmp_path / "logs" / "lint.txt").read_text() == "full lint output\n"
    assert calls["types"][2] == [f for f in patch.files if f.endswith(".py")]
    assert calls["license"][1] == series_gates.added_files(patch)
    assert calls["lint"][2] == tmp_path / "before"


def test_a_torch_patch_without_a_test_fails_and_so_does_one_whose_test_change_cannot_be_run(
        tmp_path, monkeypatch):
    from tools import validate_patches
    from tools.series import series_gates

    monkeypatch.setattr(validate_patches.envs, "install_args", lambda *a: pytest.fail("an env was made"))
    cell = matrix.load().cells[0]
    untested = patches.parse(write(tmp_path, HEAD + DIFF))
    gates = series_gates.torch_gates(untested, cell, tmp_path, 5)
    assert not gates["upstream tests"]["ok"]
    assert gates["upstream tests"]["text"].startswith("the patch adds no test")
    own_test = DIFF.replace("torch/m.py", "test/test_m.py")
    own = patches.parse(write(tmp_path, HEAD + DIFF + own_test, "own.patch"))
    gates = series_gates.torch_gates(own, cell, tmp_path, 5)  # a change, but no test method
    assert not gates["upstream tests"]["ok"]
    assert gates["upstream tests"]["text"].startswith("its test changes cannot be run here: ")


def test_the_files_a_patch_creates(tmp_path):
    from tools.series import series_gates

    new = ("diff --git a/torch/new.py b/torch/new.py\nnew file mode 100644\n--- /dev/null\n"
           "+++ b/torch/new.py\n@@ -0,0 +1 @@\n+x = 1\n")
    patch = patches.parse(write(tmp_path, HEAD + "diff --git a/torch/m.py b/torch/m.py\n" + DIFF + new))
    assert patch.files == ["torch/m.py", "torch/new.py"]
    assert series_gates.added_files(patch) == ["torch/new.py"]


def test_without_tools_gates_its_gates_say_so(tmp_path, monkeypatch):
    import tools.series
    from tools.series import series_gates

    monkeypatch.setitem(sys.modules, "tools.series.gates", None)
    monkeypatch.delattr(tools.series, "gates", raising=False)
    (patch,) = [p for p in patches.series() if p.target == "lightning"][:1]
    gates = series_gates.other_gates(patch, tmp_path, tmp_path, tmp_path)
    assert set(gates) == {"types", "lint", "license", "changelog"}
    assert all(g == {"ok": True, "text": "not run: no tools/series/gates.py"} for g in gates.values())


def test_one_failed_gate_fails_the_row_the_table_shows_every_gate_and_pr_reads_it(tmp_path, monkeypatch,
                                                                                   capsys):
    from tools import pr_bundle, validate_patches

    monkeypatch.setenv("REPRO_RESULTS", str(tmp_path))
    (patch,) = [p for p in patches.series() if p.target == "lightning"][:1]
    gates = {name: {"ok": True, "text": f"{name} fine"} for name in series_gates.GATES}
    flaky = "1/5 failed (1 tests: test_x): run 3: a child process died of SIGABRT"
    gates["flaky"] = {"ok": False, "text": flaky}
    monkeypatch.setattr(validate_patches, "upstream", lambda *a, **k: ("base: applies", gates))
    monkeypatch.setattr(validate_patches.kept, "kept_gate",
                        lambda *a, **k: {"ok": True, "text": "setups fine"})
    monkeypatch.setattr(validate_patches, "patched_env",
                        lambda args, folder, applied, like=None: Path(sys.executable))
    monkeypatch.setattr(validate_patches, "site_packages", lambda python: tmp_path / "site")
    monkeypatch.setattr(patches, "installed_root", lambda site, p: (site, 4))
    monkeypatch.setattr(patches, "check", lambda *a: patches.Check("applies"))
    monkeypatch.setattr(validate_patches.envs, "ensure", lambda *a, **k: Path(sys.executable))
    monkeypatch.setattr(validate_patches.envs, "install_args", lambda *a: [])
    verdicts = iter(["bad", "good"] * 20)
    monkeypatch.setattr(validate_patches, "run", lambda p, python, stem: harness.RunResult(
        0, next(verdicts), None, 1.0, 0))
    assert validate_patches.main(["--patch", patch.name, "--cell", patch.cells[0]]) == 1
    table = capsys.readouterr().out.split("\n| patch |", 1)[1].splitlines()
    for name in (*series_gates.GATES, *series_gates.CELL_GATES):
        assert f" {name} |" in table[0]
    assert f"| FAILS: {flaky} |" in table[2] and table[2].endswith("| NO |")
    summary = next(tmp_path.glob("patches/*/summary.json"))
    (row,) = pr_bundle.read_summary(summary)
    assert row["gates"]["flaky"]["ok"] is False and row["ok"] is False
    assert row["upstream_tests"] == "upstream tests fine"


FLAKY_EXIT = """import os, signal, sys
from pathlib import Path
count = Path(sys.argv[0]).with_suffix(".count")
n = int(count.read_text()) + 1 if count.exists() else 1
count.write_text(str(n))
print("run", n, flush=True)
if n <= int(os.environ["DIE_RUNS"]):
    os.kill(os.getpid(), signal.SIGSEGV if n % 2 else signal.SIGABRT)  # after its work, as it exits
sys.exit(int(os.environ["THEN"]))
"""


@pytest.mark.parametrize("die, then, want", [(1, 0, ("good", 2)), (2, 0, ("good", 3)), (5, 0, ("skip", 3)),
                                             (0, 1, ("skip", 1)), (0, 0, ("good", 1))])
def test_a_users_script_that_dies_of_a_signal_is_run_again_and_an_error_is_not(tmp_path, monkeypatch, die,
                                                                                then, want):
    """A run killed by a signal of its own (as torch 2.13 + gloo now and then aborts at exit) is
    made again, at most ``TRIES`` runs; an exit 1 without the signature (the script's error) is not.
    Each run keeps its logs."""
    from tools import validate_patches

    path = tmp_path / "flaky.py"
    path.write_text(FLAKY_EXIT)
    monkeypatch.setenv("DIE_RUNS", str(die))
    monkeypatch.setenv("THEN", str(then))
    script = validate_patches.Script(path, "the bug", ("a-cell",))
    r, runs = validate_patches.judged_run(script, Path(sys.executable), tmp_path / "logs" / "after")
    assert (r.verdict, runs) == want, r.reason
    assert int((tmp_path / "flaky.count").read_text()) == runs
    stems = ["after", *(f"after-{n}" for n in range(2, runs + 1))]
    assert [(tmp_path / "logs" / f"{s}.stdout").read_text() for s in stems] == [
        f"run {n}\n" for n in range(1, runs + 1)]


@pytest.mark.parametrize("argv, message", [
    (["--script", "no-such-script.py", "--signature", "x"], "--script no-such-script.py: not found"),
    (["--script", "repro", "--signature", "x"], "--script repro is a directory, not a script"),
    (["--script", "README.md", "--signature", "x"],
     "--script README.md: cannot tell how to run it (not a .py file, no #! line)"),
    (["--script", "tests/fixtures/not_executable.sh", "--signature", "x"],
     "--script tests/fixtures/not_executable.sh has a #! line but is not executable (chmod +x)"),
    (["--script", "repro/backbone_finetuning_ddp.py"],
     "--script needs --signature REGEX (what its output shows when the bug is there), --check-replicas for "
     "a silent divergence, or --verdict-line if it prints the contract's verdict line"),
    (["--script", "repro/backbone_finetuning_ddp.py", "--signature", "("],
     "--signature '(' is not a valid regex: missing ), unterminated subpattern at position 0"),
    (["--signature", "x"], "--signature, --verdict-line and --check-replicas go with --script"),
    (["--check-replicas"], "--signature, --verdict-line and --check-replicas go with --script"),
    (["--script", "repro/backbone_finetuning_ddp.py", "--verdict-line", "--cell", "pl0_0_0_torch0_0_0"],
     "no patch of the series targets cell 'pl0_0_0_torch0_0_0'"),
    (["--repeat", "0"], "--repeat takes a number >= 1"),
    (["--repeat", "many"], "argument --repeat: invalid int value: 'many'"),
], ids=["missing", "directory", "plain-text", "not-executable", "no-signature", "bad-regex",
        "signature-alone", "check-replicas-alone", "unknown-cell", "repeat-0", "repeat-nan"])
def test_script_and_repeat_input_errors_are_one_line_and_exit_2_before_anything_is_made(
        tmp_path, monkeypatch, capsys, argv, message):
    from tools import validate_patches

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("REPRO_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(validate_patches.envs, "ensure", lambda *a, **k: pytest.fail("an env was made"))
    monkeypatch.setattr(validate_patches, "validate", lambda *a, **k: pytest.fail("validation started"))
    assert validate_patches.main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {message}"]
    assert not (tmp_path / "results").exists()


@pytest.mark.ddp
@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
def test_a_users_script_is_bad_without_the_series_and_good_with_it(tmp_path, monkeypatch, capsys):
    """The #20340 repro run as a user's own script (judged by a signature regex, not its verdict
    line) in one cell: the cell's release as is, then with every patch that targets the cell."""
    from tools import validate_patches

    monkeypatch.setenv("REPRO_RESULTS", str(tmp_path))
    cell = "lightning2_6_6_torch2_13_0"
    if not any(cell in p.cells for p in patches.series()):
        pytest.skip(f"no patch of the series targets {cell}")
    # the patch rows are validated elsewhere: only the script's rows here
    monkeypatch.setattr(validate_patches, "validate", lambda p, c, out, earlier, log=print, repeat=5: {
        "patch": p.name, "cell": c.id, "on_top_of": [], "applies": "applies", "checkouts": "-",
        "before": "bad", "after": "good", "after_detail": None, "series_still_fixed": {},
        "upstream_tests": "-", "gates": {}, "ok": True})
    script = ROOT / "repro" / "backbone_finetuning_ddp.py"
    code = validate_patches.main(["--cell", cell, "--script", str(script),
                                  "--signature", r"replicas out of sync from epoch \d+"])
    out = capsys.readouterr().out
    rows = json.loads(next(tmp_path.glob("patches/*/summary.json")).read_text())
    (row,) = [r for r in rows if r["patch"].startswith("(your script)")]
    assert (row["patch"], row["cell"]) == ("(your script) backbone_finetuning_ddp.py", cell)
    assert row["before"] == "bad", row.get("before_detail") or row["applies"]
    assert row["before_detail"].startswith("signature /replicas out of sync")
    assert row["after"] == "good", row["after_detail"]
    assert row["on_top_of"] == [p.name for p in patches.series() if cell in p.cells]
    assert row["ok"] and code == 0
    assert f"| (your script) backbone_finetuning_ddp.py | {cell} |" in out


@pytest.mark.ddp
@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
def test_a_silent_divergence_in_a_users_script_is_bad_without_the_series_and_good_with_it(
        tmp_path, monkeypatch, capsys):
    """A user's script in the #20340 situation with no check of its own, judged by the replica
    check (``--check-replicas``) in the unified ``lightning`` package's cell (its
    ``lightning.pytorch.callbacks_factory`` entry point): diverged as released, in step with the
    series."""
    from tools import validate_patches

    monkeypatch.setenv("REPRO_RESULTS", str(tmp_path))
    cell = "lightning2_6_6_torch2_13_0"
    if not any(cell in p.cells for p in patches.series()):
        pytest.skip(f"no patch of the series targets {cell}")
    monkeypatch.setattr(validate_patches, "validate", lambda p, c, out, earlier, log=print, repeat=5: {
        "patch": p.name, "cell": c.id, "on_top_of": [], "applies": "applies", "checkouts": "-",
        "before": "bad", "after": "good", "after_detail": None, "series_still_fixed": {},
        "upstream_tests": "-", "gates": {}, "ok": True})
    script = ROOT / "tests" / "fixtures" / "replicas" / "finetune.py"
    code = validate_patches.main(["--cell", cell, "--script", str(script), "--check-replicas"])
    capsys.readouterr()
    rows = json.loads(next(tmp_path.glob("patches/*/summary.json")).read_text())
    (row,) = [r for r in rows if r["patch"].startswith("(your script)")]
    assert row["before"] == "bad", row.get("before_detail") or row["applies"]
    assert row["before_detail"].startswith("replicas diverged at step 12 (epoch 2): 4 of 8 parameters "
                                           "differ: backbone.0.bias")
    assert row["after"] == "good", row["after_detail"]
    assert row["after_detail"].startswith("replicas agree: 4 checks of 2 ranks (Lightning callback)")
    assert row["ok"] and code == 0


def test_the_mirror_package_gets_its_own_module_names(tmp_path):
    """``pytorch_lightning`` is Lightning's source with its module names rewritten: a hunk that
    names ``lightning.pytorch`` (context or added lines) lands there only with the same rewrite."""
    (patch,) = [p for p in patches.series() if "lightning.pytorch" in p.installable_diff()][:1]
    mirror = patches.installable_for(patch, tmp_path / "pytorch_lightning")
    unified = patches.installable_for(patch, tmp_path / "pytorch")
    assert unified == patch.installable_diff()
    assert "lightning.pytorch" not in mirror and "pytorch_lightning" in mirror
    assert "src/lightning/pytorch/" in mirror  # paths are not module names


@pytest.mark.parametrize(("verdict", "expected", "holds"), [
    ("good", "good", True), ("bad", "good", False), ("skip", "good", False),
    ("bad", "bad", True), ("good", "bad", True), ("skip", "bad", False),
])
def test_an_earlier_patch_holds_when_its_repro_is_as_promised_or_better(verdict, expected, holds):
    from tools import validate_patches

    assert validate_patches.holds(verdict, expected) is holds


FREED_WRAPPER_TESTS = '''
import gc

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def freed_output(tmp_path):
    if not dist.is_initialized():
        store = dist.FileStore(str(tmp_path / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    out = DistributedDataParallel(torch.nn.Linear(4, 2), find_unused_parameters=True)(torch.rand(3, 4))
    gc.collect()  # the wrapper is gone; its output's graph holds it by weak reference only
    return out


def test_expects_the_old_error(tmp_path):
    with pytest.raises(AttributeError, match="no attribute 'reducer'"):
        freed_output(tmp_path).sum().backward()


def test_takes_either_error(tmp_path):
    with pytest.raises((AttributeError, RuntimeError)):
        freed_output(tmp_path).sum().backward()
'''


@pytest.mark.timeout(600)
def test_a_lightning_test_that_expects_torchs_old_error_fails_once_the_series_patches_torch(tmp_path):
    """The series together across targets: the gate runs a Lightning patch's new tests on a
    torch with the series' torch patch, which turns the AttributeError into a RuntimeError."""
    from tools.series import series_gates
    from tools.series import upstream_tests as ut

    tree = tmp_path / "tree"
    (tree / "tests" / "tests_pytorch").mkdir(parents=True)
    (tree / "tests" / "tests_pytorch" / "test_freed.py").write_text(FREED_WRAPPER_TESTS)
    node = "tests/tests_pytorch/test_freed.py::"
    added = {node + name: f"def {name}(tmp_path): ..." for name in
             ("test_expects_the_old_error", "test_takes_either_error")}
    python = Path(sys.executable)
    released = ut.run_tests(python, tree, added, tmp_path / "released")
    assert released.counts() == {"passed": 2}, released.output[-2000:]  # on torch as released
    series = patches.series(ROOT / "patches")
    assert any(p.target == "torch" for p in series)
    gate = series_gates.torch_series_gate(series, python, tree, added, tmp_path / "logs" / "x",
                                              log=lambda msg: None)
    assert gate["ok"] is False, gate
    assert "1 passed, 1 failed" in gate["text"] and "test_expects_the_old_error" in gate["text"], gate
    alone = {k: v for k, v in added.items() if k.endswith("either_error")}
    assert series_gates.torch_series_gate([p for p in series if p.target == "lightning"], python, tree,
                                              alone, tmp_path / "logs" / "y")["text"] == \
        "no torch patch in the series"


def test_an_interrupt_after_a_row_keeps_both_tables(tmp_path, monkeypatch, capsys):
    """The rows done before Ctrl-C are kept in summary.json and summary.md (what `nox -s findings
    -- --record` reads), not only in the JSON."""
    from tools import validate_patches
    from tools.core import results

    monkeypatch.setenv("REPRO_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(results, "_MADE", {})
    done = []

    def validate(s, cell, out, earlier, repeat):
        if done:
            raise KeyboardInterrupt
        done.append(cell.id)
        return {"patch": s.name, "cell": cell.id, "on_top_of": [], "applies": "applies", "checkouts": "-",
                "before": "bad", "after": "good", "after_detail": "fixed", "series_still_fixed": {},
                "upstream_tests": "-", "gates": {}, "ok": True}

    monkeypatch.setattr(validate_patches, "validate", validate)
    assert validate_patches.main(["--patch", "lightning-finetuning-equal-params.patch"]) == 130
    (run,) = [p for p in (tmp_path / "results" / "patches").iterdir() if not p.is_symlink()]
    assert [r["cell"] for r in json.loads((run / "summary.json").read_text())] == done
    assert done[0] in (run / "summary.md").read_text()
    assert "1 of 2 rows kept in" in capsys.readouterr().err


def test_after_an_interrupt_a_late_second_one_is_still_ignored():
    """The second Ctrl-C of a forwarded pair can come after the cleanup (a busy machine: found by a
    fresh-clone pass beside two CPU-bound processes, exit -2 instead of 130): once interrupted,
    the program ignores them to its exit; without an interrupt its handlers are put back."""
    code = ("import os, signal, sys\nsys.path.insert(0, sys.argv[1])\n"
            "from tools.validate_patches import interrupts_unwind\n"
            "with interrupts_unwind():\n    pass\n"
            "print('untouched', signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n"
            "try:\n    with interrupts_unwind():\n        os.kill(os.getpid(), signal.SIGINT)\n"
            "        signal.pause()\nexcept KeyboardInterrupt:\n    pass\n"
            "os.kill(os.getpid(), signal.SIGINT)  # the late one\nprint('still here')\nsys.exit(130)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, proc.stderr
    assert proc.stdout.split() == ["untouched", "True", "still", "here"]


@pytest.mark.parametrize(("outcomes", "returncode", "ok"), [
    ({"t.py::a": "passed", "t.py::b": "passed"}, 0, True),
    ({"t.py::a": "passed", "t.py::b": "failed"}, 1, False),
    ({"t.py::a": "skipped", "t.py::b": "skipped"}, 0, False),  # nothing shown on that torch
])
def test_the_oldest_torch_gate_runs_the_added_tests_on_the_oldest_torch_of_lightnings_ci(
        tmp_path, monkeypatch, outcomes, returncode, ok):
    from datetime import datetime

    from tools.series import upstream_tests as ut

    asked = []
    monkeypatch.setattr(series_gates.envs, "era_args", lambda reqs, torch, moment: [f"torch=={torch}", *reqs])
    monkeypatch.setattr(series_gates.envs, "ensure",
                        lambda name, args, log=None: asked.append(args) or tmp_path)
    monkeypatch.setattr(series_gates.ut, "run_tests", lambda python, tree, tests, stem: ut.Report(
        {n: outcomes[n] for n in tests}, returncode))
    added = {"t.py::a": "def test_a(): ...", "t.py::b": "def test_b(): ..."}
    gate = series_gates.oldest_torch_gate(["tqdm"], datetime(2026, 7, 1), tmp_path, added,
                                          tmp_path / "logs" / "p" / "upstream", log=lambda msg: None)
    assert gate["ok"] is ok, gate["text"]
    assert gate["text"].startswith(f"on torch {series_gates.OLDEST_TORCH}: ")
    assert asked == [[f"torch=={series_gates.OLDEST_TORCH}", "tqdm", "pytest"]]
    assert series_gates.oldest_torch_gate([], datetime(2026, 7, 1), tmp_path, {}, tmp_path)["ok"]
