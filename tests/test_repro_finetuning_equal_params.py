"""repro/finetuning_equal_params.py on the installed torch and Lightning (single process)."""

from types import SimpleNamespace

import pytest
import torch
from conftest import load_repro

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def run(repro):
    return lambda *args: repro("finetuning_equal_params", *args)


def test_the_second_encoders_norm_is_unfrozen_but_in_no_param_group(run):
    r = run()
    assert r.verdict == "bad", r.reason
    details = r.record["details"]
    assert details["not_in_optimizer"] == details["untrained"] == ["second.1.weight", "second.1.bias"]
    assert details["param_groups"] == 3 and details["skipped_warning"]


def test_with_norms_that_hold_other_values_every_parameter_trains(run):
    r = run("--distinct")
    assert r.verdict == "good", r.reason
    assert r.record["details"]["not_in_optimizer"] == [] and not r.record["details"]["skipped_warning"]


def test_the_judgement_compares_by_identity_not_by_value():
    mod = load_repro("finetuning_equal_params")
    model = torch.nn.ModuleDict({"first": torch.nn.LayerNorm(4), "second": torch.nn.LayerNorm(4)})
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    # the optimizer holds the first norm only: the second, equal in value, is in no group
    optimizer = SimpleNamespace(param_groups=[{"params": list(model["first"].parameters())}])
    code, _, details = mod.judge(model, optimizer, initial, [])
    assert code == mod.BAD and details["not_in_optimizer"] == ["second.weight", "second.bias"], details
    optimizer.param_groups.append({"params": list(model["second"].parameters())})
    code, _, details = mod.judge(model, optimizer, initial, [])
    assert code == mod.SKIP, details  # every one in a group, but none trained: no claim either way
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1)
    assert mod.judge(model, optimizer, initial, [])[0] == mod.GOOD
