"""Real runs as 2 nodes x 1 rank (a torchrun per node, c10d rendezvous on this machine), compared
with the same repro on one node: the verdicts must be equal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_repro

from tools.core import contract
from tools.launch import harness, nodes

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.ddp, pytest.mark.timeout(600)]
FINETUNE = str(ROOT / "repro" / "backbone_finetuning_ddp.py")
STRESS = str(ROOT / "repro" / "ddp_weakref_stress.py")


def one_node(runner, tmp_path: Path, script: str, *args: str) -> harness.RunResult:
    """The one-node reference: a fork of the session's preloaded runner (tests/test_equivalence.py:
    a fork gives a new interpreter's verdict)."""
    return run_repro(runner, Path(script), *args, log_stem=tmp_path / "one" / "run", timeout=300)


def two_nodes(tmp_path: Path, *argv: str) -> nodes.JobResult:
    return nodes.run_job([sys.executable, *argv], nodes=2, per_node=1, timeout=300,
                         log_stem=tmp_path / "two" / "run")


@pytest.mark.parametrize("control", [False, True], ids=["callback", "control"])
def test_20340_two_nodes_give_the_one_node_verdict(runner, tmp_path, control):
    extra = ["--no-callback"] if control else []
    one = one_node(runner, tmp_path, FINETUNE, "--epochs", "4", *extra)
    two = two_nodes(tmp_path, FINETUNE, "--epochs", "4", "--num-nodes", "2", "--devices", "1", *extra)
    assert one.code == (contract.GOOD if control else contract.BAD)
    assert two.code == one.code, (two.reason, two.nodes)
    first = "first_diverging_epoch"
    assert two.record["details"].get(first) == one.record["details"].get(first)
    assert two.record["details"]["world_size"] == 2 and two.record["details"]["num_nodes"] == 2
    if not control:  # every rank of both nodes exited bad
        assert two.ranks == {0: contract.BAD, 1: contract.BAD}
    assert len({n["stdout"] for n in two.nodes}) == 2


@pytest.mark.parametrize("scenario", ["pl_second_fit_extra_outputs", "control_second_fit_no_carrier"])
def test_a_deterministic_stress_scenario_on_two_nodes_gives_the_one_node_outcome(runner, tmp_path, scenario):
    def outcomes(code: int, verdict: str, out: Path) -> dict:
        runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
        return {"code": code, "outcomes": [r["outcomes"] for r in runs], "verdict": verdict}

    # one node: a fork of the session's preloaded runner (as the matrix runs it)
    r = run_repro(runner, Path(STRESS), "--scenario", scenario, "--out", str(tmp_path / "one"),
                  log_stem=tmp_path / "one-run", timeout=400)
    one = outcomes(r.code, r.verdict, tmp_path / "one")
    done = subprocess.run([sys.executable, STRESS, "--scenario", scenario, "--out", str(tmp_path / "two"),
                           "--nodes", "2", "--ranks-per-node", "1"],
                          capture_output=True, text=True, timeout=400)
    verdict = json.loads(done.stdout.strip().splitlines()[-1])["verdict"]
    two = outcomes(done.returncode, verdict, tmp_path / "two")
    assert one["code"] == two["code"] and one["verdict"] == two["verdict"]
    assert one["outcomes"] == two["outcomes"]
    expected = "signature" if scenario.startswith("pl_") else "ok"
    assert two["outcomes"] == [[expected, expected]]
