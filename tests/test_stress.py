"""The ddp_weakref stress test (#20706): outcome classification, and real two-rank runs."""

import json
from pathlib import Path

import pytest
from conftest import load_repro, run_repro

from tools.stages import stress as orchestration

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "repro" / "ddp_weakref_stress.py"
TRACEBACKS = Path(__file__).parent / "fixtures" / "tracebacks"


@pytest.fixture(scope="module")
def stress():
    return load_repro("ddp_weakref_stress")


@pytest.mark.parametrize("fixture, outcome", [
    ("signature.txt", "signature"),
    ("gloo_peer_closed.txt", "peer_failure"),
    ("marked_ready_twice.txt", "other_error"),
])
def test_recorded_tracebacks_are_classified(stress, fixture, outcome):
    assert stress.classify((TRACEBACKS / fixture).read_text()) == outcome


@pytest.mark.parametrize("text, outcome", [
    ("", "ok"),
    ("RuntimeError: DistributedDataParallel: the DDP module that produced this output no longer "
     "exists (it was freed), so its gradients cannot be reduced.", "clear_error"),
    ("RuntimeError: The loss graph contains output of another DistributedDataParallel wrapper",
     "clear_error"),
    ("RuntimeError: The loss holds autograd history built by another DistributedDataParallel wrapper;"
     " backward would fail with `'NoneType' object has no attribute 'reducer'`", "clear_error"),
    ("AttributeError: 'NoneType' object has no attribute 'reducer'. This happens when a tensor ...",
     "signature"),
    ("RuntimeError: Trying to backward through the graph a second time", "other_error"),
    ("torch.distributed.DistBackendError: Watchdog caught collective operation timeout", "peer_failure"),
    ("ValueError: unrelated", "other_error"),
    ("Traceback ...\nNotApplicable: needs Lightning 2.1", "not_applicable"),
])
def test_classifier_on_messages(stress, text, outcome):
    assert stress.classify(text) == outcome


def run(outcomes, steps=(1, 1), name="s"):
    return {"scenario": name, "outcomes": list(outcomes), "steps": list(steps), "seconds": 2.0}


def test_summary_line_counts_a_clear_error_on_every_rank_as_the_fix(stress):
    selected = [stress.CATALOGUE["pl_callback_rewraps_mid_fit"]]
    fixed = run(["clear_error", "clear_error"], name="pl_callback_rewraps_mid_fit")
    line = orchestration._summary_line([fixed], selected, ["pl_callback_rewraps_mid_fit"])
    assert line == "signature in 0/1 runs, clear error in 1/1 (on every rank)"
    half = run(["clear_error", "peer_failure"], name="pl_callback_rewraps_mid_fit")
    line = orchestration._summary_line([half], selected, ["pl_callback_rewraps_mid_fit"])
    assert line.endswith("clear error in 1/1; expected crash missing: pl_callback_rewraps_mid_fit")


def test_expectations(stress):
    both = run(["signature", "signature"])
    one = run(["signature", "peer_failure"])
    clean = run(["ok", "ok"])
    assert orchestration.meets("signature", [both]) and not orchestration.meets("signature", [both, one])
    assert orchestration.meets("signature-sometimes", [clean, one])
    assert not orchestration.meets("signature-sometimes", [clean, clean])
    assert orchestration.meets("no-signature", [run(["other_error", "other_error"])])
    assert not orchestration.meets("no-signature", [one])
    assert orchestration.meets("ok", [clean]) and not orchestration.meets("ok", [run(["ok", "other_error"])])
    na = run(["not_applicable", "not_applicable"])
    assert orchestration.meets("ok", [na]) and orchestration.meets("signature", [na, both])


def test_summary_counts_outcomes_and_steps(stress):
    sc = stress.CATALOGUE["gc_random_collections"]
    table = orchestration.summary_markdown([run(["signature", "peer_failure"], (12, 12), sc.name),
                                     run(["peer_failure", "signature"], (15, 15), sc.name)], [sc])
    row = table.splitlines()[2]
    assert "peer_failure / signature x1; signature / peer_failure x1" in row
    assert "| 12, 15 |" in row and row.endswith("| yes |")


def test_catalogue_has_what_the_issue_asks(stress):
    kinds = {sc.kind for sc in stress.CATALOGUE.values()}
    assert {"torch", "lightning", "gc", "control"} <= kinds
    assert sum(sc.quick for sc in stress.CATALOGUE.values()) < len(stress.CATALOGUE)


def judge(runner, tmp_path, *args):
    out = tmp_path / "out"
    r = run_repro(runner, SCRIPT, "--out", str(out), *args, log_stem=tmp_path / "run", timeout=280)
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()] \
        if (out / "runs.jsonl").exists() else []
    return r, runs, out


def test_unknown_scenario_is_a_one_line_error(runner, tmp_path):
    r, _, _ = judge(runner, tmp_path, "--scenario", "nope")
    assert r.code == 128
    assert open(r.stderr_path).read().strip() == "error: unknown scenario 'nope' (see --list)"


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_plain_torch_rewrap_gives_the_signature_on_both_ranks(runner, tmp_path):
    r, runs, _ = judge(runner, tmp_path, "--scenario", "torch_rewrap_cached_output")
    assert (r.code, r.verdict) == (1, "bad"), r.reason
    assert runs[0]["outcomes"] == ["signature", "signature"]


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_lightning_second_fit_gives_the_signature_with_lightning_frames(runner, tmp_path):
    r, runs, out = judge(runner, tmp_path, "--scenario", "pl_second_fit_extra_outputs")
    assert r.code == 1, r.reason
    assert runs[0]["outcomes"] == ["signature", "signature"]
    tb = json.loads((out / "pl_second_fit_extra_outputs-0" / "rank0.json").read_text())["traceback"]
    assert "lightning" in tb and "in backward" in tb and "ddp_weakref.reducer" in tb


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_control_without_carrier_is_clean(runner, tmp_path):
    r, runs, _ = judge(runner, tmp_path, "--scenario", "control_second_fit_no_carrier", "--strict")
    assert (r.code, r.verdict) == (0, "good"), r.reason
    assert runs[0]["outcomes"] == ["ok", "ok"]


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_without_out_no_folder_is_left_behind(runner, tmp_path):
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("ddp-weakref-*"))
    r = run_repro(runner, SCRIPT, "--scenario", "torch_rewrap_cached_output",
                  log_stem=tmp_path / "run", timeout=280)
    assert r.code == 1, r.reason
    assert r.record["details"]["results"] == "not kept (give --out)"
    assert set(Path(tempfile.gettempdir()).glob("ddp-weakref-*")) == before


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_old_graph_kept_on_one_rank_leaves_a_new_wrapper_training_in_step(runner, tmp_path):
    r, runs, _ = judge(runner, tmp_path, "--scenario", "torch_old_graph_kept_unused", "--strict")
    assert (r.code, r.verdict) == (0, "good"), r.reason
    assert runs[0]["outcomes"] == ["ok", "ok"] and runs[0]["steps"] == [4, 4]
