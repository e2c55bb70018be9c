"""repro/finetuning_resume.py on the installed torch and Lightning (single process)."""

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import load_repro

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def run(repro):
    return lambda *args: repro("finetuning_resume", *args)


def test_unpatched_lightning_leaves_the_backbone_frozen_after_resuming(run):
    r = run("--unfreeze-epoch", "2")
    assert r.verdict == "bad", r.reason
    details = r.record["details"]
    assert details["fit1_backbone_trained"] and details["resumed_at_epoch"] == 3
    assert details["backbone_trainable_after_resume"] is False
    assert json.loads(open(r.stdout_path).read().strip().splitlines()[-1])["exit_code"] == 1


def test_bad_option_is_a_one_line_error_that_stops_a_bisect(run):
    r = run("--more-epochs", "0")
    assert r.code == 128
    assert open(r.stderr_path).read().strip().splitlines() == [
        "error: --unfreeze-epoch must be >= 0 and --more-epochs >= 1"]


def judge(trainable, trained):
    module = load_repro("finetuning_resume")
    before, after = [torch.zeros(2)], [torch.ones(2)]
    first = {"start": before, "end": after}
    second = {"start": before, "end": after if trained else before, "trainable": trainable, "first_epoch": 2}
    return module.judge(SimpleNamespace(unfreeze_epoch=1), first, second)[0]


@pytest.mark.parametrize("trainable, trained, code", [
    (False, False, 1),  # the signature: frozen again
    (True, True, 0),
    (True, False, 125),  # trainable but not moving: some other problem, not this bug
    (False, True, 125),
])
def test_only_a_frozen_backbone_is_bad(trainable, trained, code):
    assert judge(trainable, trained) == code
