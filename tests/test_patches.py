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

from tools import harness, patches

ROOT = Path(__file__).resolve().parent.parent
HEAD = """Description: d
Bug: https://example.com/1
X-Target: torch
X-Repro: repro/x.py
X-Expect-Before: bad
X-Expect-After: good

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


@pytest.mark.parametrize("text, message", [
    (HEAD.replace("Bug: https://example.com/1\n", "") + DIFF, "missing header Bug"),
    (HEAD, "no unified diff"),
    (HEAD.replace("X-Target: torch", "X-Target: numpy") + DIFF, "X-Target must be one of"),
    ("just words\n\n" + DIFF, "header line without a field"),
    (HEAD + "--- a/x\n+++ b/x\n", "no file or no hunk"),
])
def test_malformed_patches_are_one_line_errors(tmp_path, text, message):
    with pytest.raises(patches.PatchError, match=message):
        patches.parse(write(tmp_path, text))


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
    assert patches.check(patch, root, level).state in ("applies", "drift")
    patches.apply(patch, root, level)
    after = harness.run([str(venv / "bin" / "python"), *cmd, "--out", str(tmp_path / "after")],
                        timeout=300)
    assert after.verdict == "good", after.reason
    run = json.loads((tmp_path / "after" / "runs.jsonl").read_text().splitlines()[0])
    assert run["outcomes"] == ["clear_error", "clear_error"]
    assert "no longer exists" in run["errors"][0]
    mine = Path(metadata.distribution("torch").locate_file("torch/nn/parallel/distributed.py"))
    assert "no longer exists" not in mine.read_text()  # the test environment is untouched


def test_a_series_patch_splits_into_installable_sources_and_new_tests():
    (patch,) = [p for p in patches.series() if p.target == "lightning"]
    assert set(patch.sections()) == set(patch.files)
    installable = patch.installable_diff()
    assert "src/lightning/pytorch/strategies/ddp.py" in installable
    assert "CHANGELOG" not in installable and "tests/" not in installable
    assert list(patch.new_tests()) == ["tests/tests_pytorch/strategies/test_ddp_trainable_change.py"]
    changelog = patch.sections()["src/lightning/pytorch/CHANGELOG.md"]
    assert re.search(r"(?m)^\+- Fixed DDP replicas .*\(\[#20340\]", changelog)


def test_pr_bundle_refuses_a_patch_that_has_not_validated(tmp_path, monkeypatch, capsys):
    from tools import pr_bundle, results

    monkeypatch.setattr(results, "RESULTS", tmp_path)
    (patch,) = [p for p in patches.series() if p.target == "lightning"]
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
    assert (tmp_path / "pr" / patch.path.stem / "branch.txt").read_text().startswith("bugfix/20340_")
