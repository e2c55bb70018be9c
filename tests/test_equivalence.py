"""The fast mode gives the verdicts of the faithful one, on the real repros in the test environment.

Fast: a cell's repros are forks of one preloaded runner, the #20340 ranks are forked with
torchrun's environment, the stress runs are forks. Faithful (``--fresh-process``): a new
interpreter per repro and per rank, Lightning's own launcher for #20340 (as in the report). The
same matrix cell is run both ways and compared repro by repro and stress scenario by scenario:
the multi-process repros (those that can run as several nodes) in one test, with the other
multi-process jobs; the one-process repros in another, beside them.
"""

import dataclasses
import json

import pytest

from tools.environments import matrix
from tools.stages import cells

pytestmark = pytest.mark.timeout(600)


def ranks(repro: matrix.Repro) -> bool:
    """Whether the repro runs several ranks: the matrix's multi-rank repros are the ones that say
    how they run as several nodes (the one-process test checks that none of its repros ran ranks)."""
    return repro.multinode is not None


def run(tmp_path, python, fresh: bool, several_ranks: bool) -> tuple[dict, dict]:
    m = matrix.load()
    m = dataclasses.replace(m, repros=tuple(r for r in m.repros if ranks(r) == several_ranks))
    cell = matrix.Cell("pytorch-lightning", "2.6.6", "2.13.0", None)
    out = tmp_path / ("fresh" if fresh else "fast")
    outcome = cells.run_cell(cell, m, python, out, [], timeout=300, log=print,
                             fresh_process=fresh)
    assert set(outcome["results"]) == {r.name for r in m.repros}
    stress = out / "logs" / cell.id / "20706-stress" / "runs.jsonl"
    runs = [json.loads(line) for line in stress.read_text().splitlines()] if stress.exists() else []
    return outcome, {r["scenario"]: (r["outcomes"], r["steps"]) for r in runs}


def same_verdicts(fast: dict, fresh: dict) -> None:
    assert fast["launch"] == "preloaded" and fresh["launch"] == "fresh-process"
    for name, result in fast["results"].items():
        other = fresh["results"][name]
        assert (result["verdict"], result["reason"]) == (other["verdict"], other["reason"]), name


@pytest.mark.ddp
def test_fast_and_fresh_process_modes_give_the_same_verdicts_on_the_multi_process_repros(tmp_path, python):
    fast, fast_stress = run(tmp_path, python, fresh=False, several_ranks=True)
    fresh, fresh_stress = run(tmp_path, python, fresh=True, several_ranks=True)
    assert {"20340", "20340-control", "20706-stress"} <= set(fast["results"])
    same_verdicts(fast, fresh)
    for name, result in fast["results"].items():
        both = (result, fresh["results"][name])
        launches = [(r["record"] or {}).get("details", {}).get("launch") for r in both]
        if name.startswith("20340"):
            assert launches == ["fork", "lightning"]
        if name == "20706-stress":
            assert launches == ["fork", "fresh-process"]
    # every stress scenario: the same outcome on each rank at the same step
    assert fast_stress == fresh_stress
    assert ["peer_failure", "signature"] in [sorted(o) for o, _ in fast_stress.values()]  # GC timing


def test_fast_and_fresh_process_modes_give_the_same_verdicts_on_the_one_process_repros(tmp_path, python):
    fast, _ = run(tmp_path, python, fresh=False, several_ranks=False)
    fresh, _ = run(tmp_path, python, fresh=True, several_ranks=False)
    assert len(fast["results"]) >= 7 and "20340" not in fast["results"]
    same_verdicts(fast, fresh)
    for name, result in fresh["results"].items():  # a repro that ran ranks belongs to the other test
        details = (result["record"] or {}).get("details") or {}
        assert details.get("world_size", 1) == 1, (name, details)
