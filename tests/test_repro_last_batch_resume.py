"""repro/last_batch_resume.py on the installed torch and Lightning (single process)."""

import json
from types import SimpleNamespace

import pytest
from conftest import load_repro

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def run(repro):
    return lambda *args: repro("last_batch_resume", *args)


def test_unpatched_lightning_skips_the_epoch_start_after_a_last_batch_checkpoint(run):
    r = run()
    assert r.verdict == "bad", r.reason
    details = r.record["details"]
    # epoch 1 is not skipped: its batches run, but without on_train_epoch_start, so the
    # finetuning callback never unfreezes and fails at the start of epoch 2
    assert details["fit2_batches_per_epoch"] == {"1": 4}
    assert details["fit2_epoch_starts"] == []
    assert details["signatures"] == ["epoch 1 trained without on_train_epoch_start",
                                     "BackboneFinetuning TypeError at epoch 2"]
    assert "NoneType" in details["fit2_error"]
    assert json.loads(open(r.stdout_path).read().strip().splitlines()[-1])["exit_code"] == 1


def test_without_finetuning_the_hook_is_still_skipped_and_no_epoch_is_lost(run):
    r = run("--no-finetuning", "--ckpt-epoch", "1")
    assert r.verdict == "bad", r.reason
    details = r.record["details"]
    assert details["signatures"] == ["epoch 2 trained without on_train_epoch_start"]
    assert details["fit2_epoch_starts"] == [3]
    assert details["fit2_batches_per_epoch"] == {"2": 4, "3": 4}


@pytest.mark.parametrize("checkpoint", ["mid-epoch", "epoch-end"])
def test_control_checkpoints_resume_with_every_epoch_started(run, checkpoint):
    r = run("--checkpoint", checkpoint)
    assert r.verdict == "good", r.reason
    details = r.record["details"]
    assert details["fit2_epoch_starts"] == [1, 2]
    assert details["fit2_batches_per_epoch"]["1"] == details["fit2_batches_per_epoch"]["2"] == 4
    assert r.record["exit_code"] == 0


def test_bad_option_is_a_one_line_error_that_stops_a_bisect(run):
    r = run("--batches", "1")
    assert r.code == 128
    assert open(r.stderr_path).read().strip().splitlines() == [
        "error: --ckpt-epoch must be >= 0, --more-epochs >= 1 and --batches >= 2"]


class _Frames(TypeError):
    pass


def judge(starts, batches, error=None, finetuning_frame=False, error_epoch=None, checkpoint="last-batch"):
    module = load_repro("last_batch_resume")
    args = SimpleNamespace(ckpt_epoch=0, batches=4, more_epochs=2, checkpoint=checkpoint)
    second = {"starts": starts, "batches": batches, "error": error, "finetuning_frame": finetuning_frame,
              "error_epoch": error_epoch}
    return module.judge(args, second)


NONE_LR = TypeError("unsupported operand type(s) for *: 'float' and 'NoneType'")


@pytest.mark.parametrize("starts, batches, error, frame, code", [
    ([1, 2], {1: 4, 2: 4}, None, False, 0),
    ([0, 1, 2], {0: 1, 1: 4, 2: 4}, None, False, 0),  # older releases: a replayed batch, not this bug
    ([2], {1: 4, 2: 4}, None, False, 1),  # epoch 1 without its start hook
    ([2], {2: 4}, None, False, 1),  # epoch 1 never trained
    ([], {}, None, False, 1),  # the fit finished without training epochs 1 and 2
    ([], {1: 4}, NONE_LR, True, 1),  # the finetuning TypeError (and the skipped hook)
    ([1], {1: 4}, NONE_LR, True, 1),  # the finetuning TypeError alone
    ([1], {1: 4}, NONE_LR, False, 125),  # a TypeError from elsewhere is not the signature
    ([1], {1: 4}, RuntimeError("boom"), False, 125),  # crashed before epoch 2: not reached, not skipped
    ([1, 2], {1: 4, 2: 3}, None, False, 125),  # a wrong batch count is another problem
])
def test_only_the_signature_is_bad(starts, batches, error, frame, code):
    got, signature, details = judge(starts, batches, error, frame, error_epoch=2 if error else None)
    assert got == code, details
    assert (signature is not None) == (code == 1)


def test_mid_epoch_remainder_is_not_a_replay():
    code, _, details = judge([1, 2], {0: 2, 1: 4, 2: 4}, checkpoint="mid-epoch")
    assert code == 0 and "note" not in details
    code, _, details = judge([0, 1, 2], {0: 1, 1: 4, 2: 4})
    assert code == 0 and details["note"] == "1 batch(es) of epoch 0 trained again after the resume"


def test_the_saved_epochs_end_and_validation_never_run_after_a_last_batch_resume(run):
    """The follow-up of the epoch-start bug: in fit 1 epoch 0's on_train_epoch_end and
    validation ran after the last-batch checkpoint; the fit resumed from it never runs them."""
    r = run("--check", "epoch-end", "--val", "--no-finetuning")
    assert r.verdict == "bad", r.reason
    details = r.record["details"]
    assert details["fit1_epoch_ends"] == details["fit1_validated"] == [0]
    assert details["fit2_epoch_ends"] == details["fit2_validated"] == [1, 2]
    assert r.record["signature"] == "epoch 0's on_train_epoch_end and validation never ran after the resume"


def test_a_mid_epoch_resume_still_ends_the_saved_epoch(run):
    r = run("--check", "epoch-end", "--val", "--no-finetuning", "--checkpoint", "mid-epoch")
    assert r.verdict == "good", r.reason
    assert r.record["details"]["fit2_epoch_ends"][0] == r.record["details"]["fit2_validated"][0] == 0


def test_the_epoch_end_judge_needs_fit_1_as_its_control_and_fit_2_past_the_epoch():
    module = load_repro("last_batch_resume")
    args = SimpleNamespace(ckpt_epoch=0, val=True, checkpoint="last-batch")
    done = {"ends": [0], "validated": [0]}
    code, _, details = module.judge_epoch_end(args, {"ends": [0], "validated": []}, done)
    assert code == 125
    assert details["reason"] == "fit 1 did not run epoch 0's end itself: nothing to compare with"
    failed = {"ends": [], "validated": [], "batches": {0: 1}, "error": RuntimeError("boom")}
    code, _, details = module.judge_epoch_end(args, done, failed)
    assert code == 125 and details["reason"] == "fit 2 failed: RuntimeError: boom"
    later = {"ends": [1], "validated": [], "batches": {1: 4}, "error": TypeError("late")}
    code, signature, _ = module.judge_epoch_end(args, done, later)
    assert code == 1 and signature == "epoch 0's on_train_epoch_end and validation never ran after the resume"
    assert module.judge_epoch_end(args, done, {**done, "batches": {1: 4}})[0] == 0
    crashed = {**done, "batches": {1: 4}, "error": TypeError("late")}
    code, _, details = module.judge_epoch_end(args, done, crashed)
    assert code == 0 and details["fit2_error"] == "TypeError: late"  # good for this check, the crash said
