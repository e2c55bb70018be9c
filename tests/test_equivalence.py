"""The fast mode gives the verdicts of the faithful one, on the real repros in the test environment.

Fast: a cell's repros are forks of one preloaded runner, the #20340 ranks are forked with
torchrun's environment, the stress runs are forks. Faithful (``--fresh-process``): a new
interpreter per repro and per rank, Lightning's own launcher for #20340 (as in the report). The
same matrix cell is run both ways and compared repro by repro and stress scenario by scenario.
"""

import json

import pytest

from tools import cells, matrix

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(600)]


def run(tmp_path, python, fresh: bool) -> tuple[dict, dict]:
    m = matrix.load()
    cell = matrix.Cell("pytorch-lightning", "2.6.6", "2.13.0", None)
    out = tmp_path / ("fresh" if fresh else "fast")
    outcome = cells.run_cell(cell, m, python, out, [], timeout=300, log=print,
                             fresh_process=fresh)
    runs = [json.loads(line) for line in
            (out / "logs" / cell.id / "20706-stress" / "runs.jsonl").read_text().splitlines()]
    return outcome, {r["scenario"]: (r["outcomes"], r["steps"]) for r in runs}


def test_fast_and_fresh_process_modes_give_the_same_verdicts(tmp_path, python):
    fast, fast_stress = run(tmp_path, python, fresh=False)
    fresh, fresh_stress = run(tmp_path, python, fresh=True)
    assert fast["launch"] == "preloaded" and fresh["launch"] == "fresh-process"
    assert set(fast["results"]) == {r.name for r in matrix.load().repros}
    for name, result in fast["results"].items():
        other = fresh["results"][name]
        assert (result["verdict"], result["reason"]) == (other["verdict"], other["reason"]), name
        launches = [(r["record"] or {}).get("details", {}).get("launch") for r in (result, other)]
        if name.startswith("20340"):
            assert launches == ["fork", "lightning"]
        if name == "20706-stress":
            assert launches == ["fork", "fresh-process"]
    # every stress scenario: the same outcome on each rank at the same step
    assert fast_stress == fresh_stress
    assert ["peer_failure", "signature"] in [sorted(o) for o, _ in fast_stress.values()]  # GC timing
