"""repro/gloo_exit_abort.py: how each 2-rank ddp_spawn fit ended, counted into a rate (real
torch and Lightning; short runs: the rate itself is measured by hand, see docs/repros.md)."""

import pytest
from conftest import load_repro

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def run(repro):
    return lambda *args: repro("gloo_exit_abort", *args)


@pytest.mark.ddp
def test_a_worker_that_aborts_as_it_exits_is_counted_as_an_abort(run):
    r = run("--fits", "1", "--abort-at-exit")
    assert r.verdict == "bad", r.reason
    assert r.record["details"]["aborted"] == 1 and r.record["details"]["rate"] == 1.0


@pytest.mark.ddp
def test_a_group_destroyed_in_teardown_ends_cleanly(run):
    r = run("--fits", "1", "--destroy")
    assert r.verdict == "good", r.reason
    assert r.record["details"]["fits"] == 1 and r.record["details"]["aborted"] == 0


def test_an_abort_during_training_is_no_exit_abort():
    mod = load_repro("gloo_exit_abort")
    died = "process 1 terminated with signal SIGABRT"
    assert mod.outcome(1, f"{mod.TRAINED} 0\n{mod.TRAINED} 1\n{died}") == "aborted"
    assert mod.outcome(1, f"{mod.TRAINED} 0\n{died}") == "failed"  # rank 1 had not finished its fit
    assert mod.outcome(0, f"{mod.TRAINED} 0\n{mod.TRAINED} 1\n{mod.FINISHED}") == "clean"
    code, _, details = mod.judge(["clean", "aborted", "clean", "clean"], {})
    assert code == mod.BAD and details["rate"] == 0.25
    code, _, details = mod.judge(["clean", "failed"], {})
    assert code == mod.SKIP and details["failed"] == 1
