import json
import os

import pytest

from tools.core import results


def test_write_atomic_leaves_old_file_on_failure(tmp_path):
    path = tmp_path / "a.json"
    results.write_json(path, {"a": 1})

    class Boom:
        def __str__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        results.write_json(path, {"a": Boom()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["a.json"]  # no temporary file left behind


def test_an_interrupt_just_after_the_rename_is_still_an_interrupt(tmp_path, monkeypatch):
    """SIGTERM's handler raises where the program is, which can be right after ``os.replace``
    returned: the clean-up must not then fail on the temporary file the rename already moved
    (a ``FileNotFoundError`` hid the interrupt and ended a minimize with a traceback)."""
    path, renamed = tmp_path / "a.json", os.replace

    def replace_then_interrupt(src, dst):
        renamed(src, dst)
        raise KeyboardInterrupt

    monkeypatch.setattr(results.os, "replace", replace_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        results.write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert os.listdir(tmp_path) == ["a.json"]


def test_run_dir_points_latest_at_the_run(tmp_path):
    run = results.run_dir("repro", base=tmp_path)
    assert (tmp_path / "repro" / "latest").resolve() == run.resolve()
    assert results.run_dir("repro", base=tmp_path) == run  # one folder per process


def test_two_processes_started_in_the_same_second_get_folders_of_their_own(tmp_path, monkeypatch):
    # the second process is this one again, with what the first made forgotten
    monkeypatch.setattr(results, "_STAMP", "20261201-120000")
    first = results.run_dir("bisect", base=tmp_path)
    monkeypatch.setattr(results, "_MADE", {})
    second = results.run_dir("bisect", base=tmp_path, latest=False)
    assert first != second and first.is_dir() and second.is_dir()
    assert second.name == "20261201-120000-2"
    assert (tmp_path / "bisect" / "latest").resolve() == first.resolve()  # until it has a result
    results.point_latest(second)
    assert (tmp_path / "bisect" / "latest").resolve() == second.resolve()


def cell(index, verdicts=None, skipped=None):
    c = {"cell": {"id": f"c{index}", "index": index, "package": "pytorch-lightning",
                  "lightning": "2.4.0", "torch": "2.4.1", "declared": ">=2.1.0,<2.5.0"}}
    if skipped:
        c["skipped"] = skipped
    else:
        c["seconds"] = 12.3
        c["results"] = verdicts
    return c


def test_summary_table_rows_are_cells_and_columns_repros(tmp_path):
    bad = {"verdict": "bad", "reason": None, "record": {"details": {
        "first_diverging_epoch": 3, "diverging_params": ["backbone.bias", "backbone.weight"]}}}
    skip = {"verdict": "skip", "reason": "import failed: No module named 'pkg_resources'"}
    for c in (cell(1, {"20340": bad, "ctl": {"verdict": "good"}}), cell(0, {"20340": skip}),
              cell(2, skipped="outside range")):
        results.write_json(tmp_path / "cells" / f"{c['cell']['id']}.json", c)
    table = results.summary_markdown(results.load_cells(tmp_path), ["20340", "ctl"])
    rows = table.splitlines()
    assert rows[0].split("|")[4:6] == [" 20340 ", " ctl "]
    assert rows[2].startswith("| c0 ") and "skip: import failed" in rows[2]
    assert "bad: epoch 3 backbone.bias, backbone.weight" in rows[3] and "| good |" in rows[3]
    assert "not run: outside range" in rows[4]


def test_a_cell_interrupted_after_some_repros_is_a_row_with_what_finished(tmp_path):
    c = cell(0, {"20340": {"verdict": "good"}})
    c.pop("seconds", None)  # written after the first repro, before the cell's end
    c["incomplete"] = True
    results.write_json(tmp_path / "cells" / "c0.json", c)
    row = results.summary_markdown(results.load_cells(tmp_path), ["20340", "ctl"]).splitlines()[2]
    assert "| good |" in row and "(interrupted)" in row
