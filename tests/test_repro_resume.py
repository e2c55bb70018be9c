"""repro/finetuning_resume.py on the installed torch and Lightning (single process)."""

import json
import sys

import pytest

from tools import harness

pytestmark = pytest.mark.timeout(300)


def run(root, tmp_path, *args):
    cmd = [sys.executable, str(root / "repro" / "finetuning_resume.py"), *args]
    return harness.run(cmd, timeout=240, log_stem=tmp_path / "run")


def test_unpatched_lightning_leaves_the_backbone_frozen_after_resuming(root, tmp_path):
    r = run(root, tmp_path, "--unfreeze-epoch", "2")
    assert r.verdict == "bad", r.reason
    details = r.record["details"]
    assert details["fit1_backbone_trained"] and details["resumed_at_epoch"] == 3
    assert details["backbone_trainable_after_resume"] is False
    assert json.loads(open(r.stdout_path).read().strip().splitlines()[-1])["exit_code"] == 1


def test_bad_option_is_a_one_line_error_that_stops_a_bisect(root, tmp_path):
    r = run(root, tmp_path, "--more-epochs", "0")
    assert r.code == 128
    assert open(r.stderr_path).read().strip().splitlines() == [
        "error: --unfreeze-epoch must be >= 0 and --more-epochs >= 1"]
