"""Real two-rank runs of repro/backbone_finetuning_ddp.py on the installed torch and Lightning."""

import json
import re
import subprocess
import sys

import pytest

from tools.launch import harness

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(300)]


@pytest.fixture
def run(repro):
    return lambda *args: repro("backbone_finetuning_ddp", *args)


def test_unpatched_lightning_diverges_at_the_unfreeze_epoch(run):
    r = run()
    assert (r.code, r.verdict) == (1, "bad"), r.reason
    details = r.record["details"]
    assert details["first_diverging_epoch"] == 3
    assert "backbone.weight" in details["diverging_params"]
    assert "layer.weight" not in details["diverging_params"]  # the head stays synced by DDP
    assert details["sync_by_epoch"][:3] == ["in sync"] * 3
    assert r.record["versions"]["torch"] and r.record["versions"]["lightning"]


def test_control_without_the_callback_stays_in_sync(run):
    r = run("--no-callback")
    assert (r.code, r.verdict) == (0, "good"), r.reason
    assert r.record["details"]["sync_by_epoch"] == ["in sync"] * 5


def test_unfreezing_later_moves_the_divergence(root, tmp_path):
    # ddp_spawn starts new interpreters for its ranks anyway: run it as a user would. (In a
    # preloaded runner, 2 of 23 such runs ended with a spawned rank aborting at exit, "terminate
    # called without an active exception", after training; 0 of 24 from a new interpreter.)
    cmd = [sys.executable, str(root / "repro" / "backbone_finetuning_ddp.py"), "--unfreeze-epoch",
           "1", "--epochs", "3", "--strategy", "ddp_spawn"]
    r = harness.run(cmd, timeout=240, log_stem=tmp_path / "run")
    assert r.code == 1, r.reason
    assert r.record["details"]["first_diverging_epoch"] == 1


def test_bad_option_is_a_one_line_error_that_stops_a_bisect(run):
    r = run("--epochs", "2")
    assert r.code == 128
    assert open(r.stderr_path).read().strip().splitlines() == [
        "error: --epochs must be greater than --unfreeze-epoch (nothing to compare after it)"]


def test_under_torchrun_every_rank_exits_bad_and_one_verdict_line(root, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(root / "repro" / "backbone_finetuning_ddp.py"), "--epochs", "4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1 and lines[0]["verdict"] == "bad"
    # torchrun's failure table lists each failed rank with its exit code: both ranks exited 1
    failed = dict(re.findall(r"rank\s*:\s*(\d+) \(local_rank.*\n\s*exitcode\s*:\s*(\d+)", proc.stderr))
    assert failed == {"0": "1", "1": "1"}, proc.stderr[-2000:]
