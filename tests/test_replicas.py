"""The replica check (``--check-replicas``, tools/inject/workspace_replicas.py): a silent
divergence of DDP replicas in a user's unmodified script becomes a signature.

The multi-process tests run real two-rank CPU jobs: a Lightning script in the #20340 situation
without a check of its own (tests/fixtures/replicas/finetune.py) and a plain torch DDP script
(tests/fixtures/replicas/torch_ddp.py), each bad where its ranks go apart and good where they
stay together, through ``python -m tools.run``, as a user runs it.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tools.core import contract
from tools.launch.launcher import INJECT

FIXTURES = "tests/fixtures/replicas"


def check(root, script, *args, every="epoch", timeout=240):
    """``python -m tools.run --check-replicas=EVERY -- python SCRIPT ARGS``: its JSON result."""
    cmd = [sys.executable, "-m", "tools.run", f"--check-replicas={every}", "--timeout", str(timeout),
           "--", sys.executable, f"{FIXTURES}/{script}", *args]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout + 60)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == result["code"], proc.stderr[-2000:]
    return result


def injected():
    spec = importlib.util.spec_from_file_location("workspace_replicas", INJECT / "workspace_replicas.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- without ranks --------------------------------------------------------------------------

def test_the_line_the_check_prints_is_the_contracts_signature():
    assert injected().SIGNATURE == contract.REPLICAS_SIGNATURE
    line = "replicas diverged at step 48 (epoch 3): 2 of 4 parameters differ: a, b; trainable masks agree"
    import re

    assert re.search(contract.REPLICAS_SIGNATURE, line)


@pytest.mark.parametrize("code, report, want", [
    (contract.GOOD, None, contract.SKIP),  # never wrote a report: never checked
    (contract.GOOD, {"checks": 0, "why": "one process: no replicas to compare"}, contract.SKIP),
    (contract.GOOD, {"checks": 3, "world": 2, "step": 8, "epoch": None, "mechanism": "m"}, contract.GOOD),
    (contract.BAD, {"checks": 2, "diverged": "replicas diverged at step 4: ..."}, contract.BAD),
    (contract.GOOD, {"checks": 2, "diverged": "replicas diverged at step 4: ..."}, contract.BAD),
    (contract.SKIP, None, contract.SKIP),
    (contract.BAD, None, contract.BAD),  # the user's own signature, with the check on too
])
def test_a_pass_needs_a_check_that_compared_replicas(code, report, want):
    got, reason = contract.judge_replicas(code, "r", report)
    assert got == want
    if want == contract.SKIP and code == contract.GOOD:
        assert reason.startswith("the replica check never ran")


def test_digests_are_exact():
    import torch

    digests = injected()._digests
    a = torch.linspace(0, 1, 1000)
    b = a.clone()
    b[500] = torch.nextafter(b[500], torch.tensor(2.0))  # one ulp
    assert digests([a])[0] == digests([a.clone()])[0]
    assert digests([a])[0] != digests([b])[0]
    assert digests([a.view(10, 100)])[0] != digests([a])[0]  # the shape is part of it
    assert digests([a.bfloat16()])[0] != digests([a])[0]
    assert len(set(digests([a.t() if a.dim() > 1 else a, torch.zeros(0), torch.tensor(3)]))) == 3


def test_a_script_without_ddp_is_cannot_test_never_good(root):
    cmd = [sys.executable, "-m", "tools.run", "--check-replicas", "--",
           sys.executable, "-c", "import torch; print(torch.ones(2).sum())"]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=120)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (proc.returncode, result["verdict"]) == (contract.SKIP, "skip")
    assert result["reason"] == contract.NEVER_CHECKED


def test_bad_interval_is_one_line_exit_129(root):
    proc = subprocess.run([sys.executable, "-m", "tools.run", "--check-replicas=0", "--", "true"],
                          cwd=root, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 129
    assert proc.stderr.strip().splitlines() == [
        "error: argument --check-replicas: takes 'epoch' or a number of steps >= 1, not '0'"]


# -- Lightning: the #20340 situation, without the script's own check ---------------------------

@pytest.mark.ddp
@pytest.mark.timeout(400)
def test_backbone_finetuning_diverges_at_the_unfreeze_epoch(root):
    r = check(root, "finetune.py")
    assert r["verdict"] == "bad", r
    assert r["reason"].startswith("replicas diverged at step 12 (epoch 2): 4 of 8 parameters differ: "
                                  "backbone.0.bias (max |diff| "), r["reason"]
    assert r["reason"].endswith("; trainable masks agree")
    assert "head" not in r["reason"]  # the head was trainable all along: DDP synced it


@pytest.mark.ddp
@pytest.mark.timeout(400)
def test_a_finetuning_callback_of_ones_own_that_unfreezes_in_phases_diverges(root):
    r = check(root, "finetune.py", "--phases")
    assert r["verdict"] == "bad", r
    assert r["reason"].startswith("replicas diverged at step 8 (epoch 1): 2 of 8 parameters differ: "
                                  "backbone.0.bias"), r["reason"]


@pytest.mark.ddp
@pytest.mark.timeout(400)
def test_every_n_steps_finds_it_at_the_first_check_after_the_unfreeze(root):
    r = check(root, "finetune.py", every="3")
    assert r["verdict"] == "bad", r
    assert r["reason"].startswith("replicas diverged at step 9 (epoch 2)"), r["reason"]


@pytest.mark.ddp
@pytest.mark.timeout(400)
@pytest.mark.parametrize("args, checks", [
    (["--no-finetuning"], 4),
    (["--no-finetuning", "--accumulate", "2", "--workers", "1", "--norm", "--uneven"], 4),
    (["--no-finetuning", "--manual", "--find-unused"], 4),
    # EarlyStopping on a metric that differs per rank: the ranks stop together (it reduces its
    # decision), and the check adds no collective a rank could skip
    (["--no-finetuning", "--static-graph", "--early-stop", "--epochs", "6"], 2),
], ids=["control", "accumulate-workers-batchnorm-uneven", "manual-find-unused", "static-early-stop"])
def test_healthy_lightning_fits_never_trip_it(root, args, checks):
    r = check(root, "finetune.py", *args)
    assert r["verdict"] == "good", r
    assert r["reason"].startswith(f"replicas agree: {checks} checks of 2 ranks (Lightning callback)"), r


# -- plain torch DDP ----------------------------------------------------------------------------

@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_a_rank_with_its_own_learning_rate_is_named(root):
    r = check(root, "torch_ddp.py", "--diverge", "lr", every="3")
    assert r["verdict"] == "bad", r
    assert r["reason"].startswith("replicas diverged at step 3: 4 of 4 parameters differ: first.bias "
                                  "(max |diff| "), r["reason"]


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_a_rank_that_freezes_a_layer_is_a_mask_mismatch(root):
    r = check(root, "torch_ddp.py", "--diverge", "requires_grad", every="3")
    assert r["verdict"] == "bad", r
    assert r["reason"] == ("replicas diverged at step 6: all 4 parameters agree; trainable masks "
                           "differ (requires_grad): first.weight (True on rank 0, False on rank 1)")


@pytest.mark.ddp
@pytest.mark.timeout(300)
@pytest.mark.parametrize("args", [["--static-graph", "--norm", "batch"],
                                  ["--find-unused", "--accumulate", "2"],
                                  # ZeroRedundancyOptimizer's step runs an inner one: one step counted
                                  ["--zero", "--probe"]],
                         ids=["static-batchnorm", "find-unused-accumulate", "zero-and-a-probe"])
def test_healthy_torch_training_never_trips_it(root, args):
    r = check(root, "torch_ddp.py", *args, every="3")
    assert r["verdict"] == "good", r
    # steps 3 and 6, then the last one (8) when the script destroys its process group
    assert r["reason"] == ("replicas agree: 3 checks of 2 ranks (torch optimizer step hook), "
                           "the last at step 8"), r


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_a_failing_rank_that_destroys_its_group_in_a_finally_adds_no_collective(root):
    """Rank 1 raises; both ranks call destroy_process_group in a ``finally``: the check stays out
    of the failing rank's way (its peer is inside a collective of its own), so the run ends on
    the failure instead of waiting for a time-out."""
    r = check(root, "torch_ddp.py", "--fail", every="3", timeout=120)
    assert r["verdict"] == "skip", r
    assert "rank 1 fails on purpose" in r["reason"], r


def test_asking_where_torch_is_does_not_use_the_hook_up(root):
    """A package that calls importlib.util.find_spec("torch") before importing it (datasets and
    transformers do) must not leave torch unhooked."""
    code = ("import importlib.util; importlib.util.find_spec('torch'); import torch, "
            "torch.optim.optimizer as o; print(len(o._global_optimizer_post_hooks))")
    env = {**os.environ, "PYTHONPATH": str(INJECT), "WORKSPACE_CHECK_REPLICAS": "epoch"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "1"


def test_reports_of_several_processes_merge_to_one_verdict():
    merged = contract.merge_replica_reports([
        {"checks": 0, "why": "one process: no replicas to compare", "rank": None},  # a helper process
        {"checks": 2, "rank": 1, "diverged": None, "world": 2},
        {"checks": 2, "rank": 0, "diverged": "replicas diverged at step 4: x", "world": 2},
    ])
    assert (merged["rank"], merged["checks"], merged["diverged"], merged["why"]) == (
        0, 2, "replicas diverged at step 4: x", None)
    assert contract.merge_replica_reports([]) is None
    lone = contract.merge_replica_reports([{"checks": 0, "why": "w", "rank": None}])
    assert contract.judge_replicas(contract.GOOD, None, lone) == (
        contract.SKIP, "the replica check never ran: w")


def test_a_malformed_replica_report_is_no_report_never_a_crash():
    """The code under test can write into the report folder: a report of the wrong shape counts
    as none (the run then cannot pass), and the judge does not crash."""
    from tools.core import contract

    assert contract.merge_replica_reports([[1], {"rank": "0", "checks": 3}, "x"]) is None
    good = {"rank": 0, "checks": 2, "step": 4, "world": 2, "mechanism": "m", "diverged": None}
    assert contract.merge_replica_reports([[1], good])["checks"] == 2
