"""FINDINGS.md from recorded runs: recording (copy, sanitise, replace), rendering, input errors."""

import json
from pathlib import Path

import pytest

from tools.records import findings

ROOT = Path(__file__).resolve().parent.parent


def cell(cell_id: str, lightning: str, verdicts: dict[str, tuple[str, str]], skipped: str | None = None,
         index: int = 0) -> dict:
    """One cell of a ``nox -s repro`` summary.json; ``verdicts``: repro -> (verdict, summary)."""
    out = {"cell": {"package": "pytorch-lightning", "lightning": lightning, "torch": "2.13.0",
                    "declared": ">=2.1.0", "included": None, "index": index, "id": cell_id}}
    if skipped:
        return {**out, "skipped": skipped}
    return {**out, "repro_args": [], "launch": "preloaded", "seconds": 12.0,
            "torch_installed": "2.13.0+cpu", "lightning_installed": lightning,
            "results": {name: {"verdict": v, "reason": text,
                               "record": {"details": {"summary": text},
                                          "versions": {"python": "3.11.7", "torch": "2.13.0+cpu"}},
                               "stdout_path": f"{ROOT}/results/repro/x/logs/{cell_id}/{name}.stdout"}
                        for name, (v, text) in verdicts.items()}}


def repro_run(base: Path, stamp: str = "20261130-063451", bad_text: str = "epoch 3 backbone.weight") -> Path:
    run = base / "repro" / stamp
    cells = [cell("pl2_6_6_torch2_13_0", "2.6.6", {"20340": ("bad", bad_text),
                                                   "20340-control": ("good", "in sync")}),
             cell("pl1_9_5_torch2_13_0", "1.9.5", {}, skipped="torch 2.13.0 is outside the range", index=1)]
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(cells, indent=2))
    return run


def bisect_run(base: Path, stamp: str = "20261130-054212",
               answer: str = "First bad release: **2.5.0**") -> Path:
    run = base / "bisect" / stamp
    run.mkdir(parents=True)
    argv = ["--tier", "releases", "--oldest", "2.4.0", "--state", "/tmp/state.json"]
    (run / "report.json").write_text(json.dumps({"status": "found", "argv": argv}))
    (run / "report.md").write_text(f"## Bisect result\n\n{answer} (last good: 2.4.0).\n\n"
                                   "Repro: `backbone_finetuning_ddp.py `; trials per step: 1\n"
                                   "Python 3.11.7, torch 2.13.0; 10 s.\n\nReproduce the bisect:\n\n"
                                   "```\nnox -s bisect -- --tier releases --state /tmp/state.json\n```\n")
    return run


STRESS = ("| scenario | kind | expect | runs | outcomes (rank 0 / rank 1) | steps | s/run | meets |\n"
          "|---|---|---|---|---|---|---|---|\n"
          "| torch_rewrap_cached_output | torch | signature | 1 | signature / signature x1 | 4 | 0.8 "
          "| yes |\n")


@pytest.fixture
def data(tmp_path, monkeypatch):
    """findings/ and FINDINGS.md of their own."""
    monkeypatch.setattr(findings, "DATA", tmp_path / "findings")
    monkeypatch.setattr(findings, "OUTPUT", tmp_path / "FINDINGS.md")
    return tmp_path / "findings"


def test_rendering_from_recorded_runs(tmp_path, data, capsys):
    runs = tmp_path / "results"
    stress = runs / "repro" / "20261130-082034" / "logs" / "pl2_6_6_torch2_13_0" / "20706-stress"
    stress.mkdir(parents=True)
    (stress / "summary.md").write_text(STRESS)
    argv = ["--record", f"repro={repro_run(runs)}", "--record", f"bisect={bisect_run(runs)}",
            "--record", f"stress={stress}"]
    assert findings.main(argv) == 0
    text = (tmp_path / "FINDINGS.md").read_text()
    assert sorted(p.relative_to(data).as_posix() for p in data.rglob("*") if p.is_file()) == [
        "bisect/backbone_finetuning_ddp-lightning/record.json",
        "bisect/backbone_finetuning_ddp-lightning/report.json",
        "bisect/backbone_finetuning_ddp-lightning/report.md",
        "repro/matrix/record.json", "repro/matrix/summary.json",
        "stress/pl2_6_6_torch2_13_0/record.json", "stress/pl2_6_6_torch2_13_0/summary.md"]
    # the matrix: the tool's own table, a row per cell, with the run's date and versions
    assert "| pl2_6_6_torch2_13_0 | pytorch-lightning 2.6.6 | 2.13.0+cpu (>=2.1.0) | " \
           "bad: epoch 3 backbone.weight | good: in sync | 12 |" in text
    assert "| pl1_9_5_torch2_13_0 | pytorch-lightning 1.9.5 | 2.13.0 (>=2.1.0) | " \
           "not run: torch 2.13.0" in text
    assert "_Run 2026-11-30 06:34:51 (`<path>/20261130-063451`); command: `nox -s repro`; versions: " \
           "Python 3.11.7; Lightning and torch per row (1 cells ran, 1 not run)." in text
    assert "Verdicts per repro: `20340`: bad 1 (of 1 cells); `20340-control`: good 1 (of 1 cells)." in text
    # the bisect: its answer, command and versions; the stress table with the cell's name
    assert "First bad release: **2.5.0** (last good: 2.4.0)." in text
    assert "command: `nox -s bisect -- --tier releases --oldest 2.4.0 --state '<path>'`; " \
           "versions: Python 3.11.7, torch 2.13.0." in text
    assert "### pl2_6_6_torch2_13_0\n" in text and STRESS in text
    assert "Not recorded yet: run `nox -s patches` then `nox -s findings -- --record patches`." in text
    # from the data alone, and the same bytes every time
    assert findings.render(data) == text
    assert findings.main(["--check"]) == 0


def test_a_changed_data_file_changes_its_table(tmp_path, data):
    assert findings.main(["--record", f"repro={repro_run(tmp_path / 'results')}"]) == 0
    before = (tmp_path / "FINDINGS.md").read_text()
    path = data / "repro" / "matrix" / "summary.json"
    path.write_text(path.read_text().replace("epoch 3 backbone.weight", "epoch 4 backbone.bias"))
    assert findings.main(["--check"]) == 1  # FINDINGS.md no longer what the data gives
    assert findings.main([]) == 0
    after = (tmp_path / "FINDINGS.md").read_text()
    assert "bad: epoch 4 backbone.bias" in after and "epoch 3 backbone.weight" not in after
    assert after.replace("epoch 4 backbone.bias", "epoch 3 backbone.weight") == before


def test_recording_again_replaces_the_record(tmp_path, data):
    runs = tmp_path / "results"
    assert findings.main(["--record", f"bisect={bisect_run(runs)}"]) == 0
    record = data / "bisect" / "backbone_finetuning_ddp-lightning"
    (record / "stale.md").write_text("left from an older record")
    newer = bisect_run(runs, "20261201-101010", answer="First bad release: **2.6.0**")
    assert findings.main(["--record", f"bisect={newer}"]) == 0
    assert sorted(p.name for p in record.iterdir()) == ["record.json", "report.json", "report.md"]
    assert "**2.6.0**" in (record / "report.md").read_text()
    assert json.loads((record / "record.json").read_text())["date"] == "2026-12-01 10:10:10"
    assert [p.name for p in (data / "bisect").iterdir()] == [record.name]  # nothing left beside it
    text = (tmp_path / "FINDINGS.md").read_text()
    assert "**2.6.0**" in text and "**2.5.0**" not in text


def test_a_failed_record_leaves_the_previous_one_as_it_was(tmp_path, data, capsys):
    runs = tmp_path / "results"
    assert findings.main(["--record", f"repro={repro_run(runs)}"]) == 0
    before = {p.name: p.read_text() for p in (data / "repro" / "matrix").iterdir()}
    broken = repro_run(runs, "20261201-000000")
    (broken / "summary.json").write_text('[{"cell": ')
    assert findings.main(["--record", f"repro={broken}"]) == 2
    assert {p.name: p.read_text() for p in (data / "repro" / "matrix").iterdir()} == before
    assert [p.name for p in (data / "repro").iterdir()] == ["matrix"]


def test_recording_strips_machine_paths_and_index_hosts(tmp_path, data, monkeypatch):
    run = repro_run(tmp_path / "results")
    summary = json.loads((run / "summary.json").read_text())
    home = str(Path.home())
    summary[0]["results"]["20340"]["leftovers"] = [
        f"{home}/.cache/uv/x.whl", "/tmp/pytest-of-x/run/rank1.json", f"{tmp_path}/results/run",
        "https://download.example-index.org/simple/torch/", "https://github.com/Lightning-AI/x/issues/1",
        "signature in 4/7 runs; max |diff| 0.06; and/or"]
    (run / "summary.json").write_text(json.dumps(summary))
    assert findings.main(["--record", f"repro={run}"]) == 0
    for path in [*data.rglob("*.json"), tmp_path / "FINDINGS.md"]:
        text = path.read_text()
        for machine in (str(ROOT), home, "/tmp/", str(tmp_path), "example-index"):
            assert machine not in text, (path.name, machine)
    recorded = json.loads((data / "repro" / "matrix" / "summary.json").read_text())[0]["results"]["20340"]
    # a path inside the checkout becomes relative to it
    assert recorded["stdout_path"] == "results/repro/x/logs/pl2_6_6_torch2_13_0/20340.stdout"
    assert recorded["leftovers"] == ["<path>", "<path>", "<path>", "<url>",
                                     "https://github.com/Lightning-AI/x/issues/1",
                                     "signature in 4/7 runs; max |diff| 0.06; and/or"]


@pytest.mark.parametrize("case", ["unknown-kind", "missing-run", "not-json", "not-a-matrix", "name-twice",
                                  "not-a-stress-summary", "bad-name", "broken-record"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, data, capsys, case):
    runs = tmp_path / "results"
    run = repro_run(runs)
    argv = ["--record", f"repro={run}"]
    if case == "unknown-kind":
        argv, message = ["--record", "matrix"], "--record matrix: unknown kind 'matrix'"
    elif case == "missing-run":
        argv, message = ["--record", f"bisect={runs / 'gone'}"], f"{runs / 'gone'}: no such run folder"
    elif case == "not-json":
        (run / "summary.json").write_text("[{")
        message = f"{run / 'summary.json'}: not JSON"
    elif case == "not-a-matrix":
        (run / "summary.json").write_text('[{"cell": {"id": "x"}}]')
        message = f"{run / 'summary.json'}: not a summary of `nox -s repro`"
    elif case == "name-twice":
        argv += ["--record", f"bisect={bisect_run(runs)}", "--name", "x"]
        message = "--name goes with exactly one --record"
    elif case == "not-a-stress-summary":
        (run / "summary.md").write_text("| cell | lightning |\n")
        argv, message = ["--record", f"stress={run}"], f"{run / 'summary.md'}: not a summary of the stress"
    elif case == "bad-name":
        argv += ["--name", "../x"]
        message = "--name '../x': letters, digits"
    else:  # a record of findings/ that is not one: rendering stops, FINDINGS.md is left alone
        assert findings.main(argv) == 0
        capsys.readouterr()
        (data / "repro" / "matrix" / "summary.json").write_text("{}")
        argv, message = [], f"{data / 'repro' / 'matrix' / 'summary.json'}: not a list"
    before = (tmp_path / "FINDINGS.md").read_text() if (tmp_path / "FINDINGS.md").exists() else None
    assert findings.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {message}"), err
    assert ((tmp_path / "FINDINGS.md").read_text() if before is not None else None) == before
    if case != "broken-record":
        assert not data.exists()


def test_a_triage_corpus_bench_is_recorded_with_its_accuracy_and_a_foreign_table_refused(tmp_path, data,
                                                                                         capsys):
    run = tmp_path / "results" / "triage-corpus" / "20261206-080020"
    run.mkdir(parents=True)
    rows = [{"report": "hang", "shape": "a hang", "expected": "reproduced", "got": "reproduced 1/1",
             "seconds": 9, "ok": True}]
    (run / "summary.json").write_text(json.dumps(rows))
    (run / "summary.md").write_text("| report | shape | expected | got | s | |\n|---|---|---|---|---|---|\n"
                                    "| hang | a hang | `reproduced` | reproduced 1/1 | 9 | ok |\n\n"
                                    "1 of 1 reports give their expected first line (100%)\n")
    assert findings.main(["--record", f"triage={run}"]) == 0
    text = (tmp_path / "FINDINGS.md").read_text()
    section = text.split("## The triage on the corpus of report shapes", 1)[1]
    assert "1 of 1 reports give their expected first line (100%)" in section
    assert "python bench/triage_corpus.py --python .nox/tests/bin/python --out DIR" in section
    capsys.readouterr()
    (run / "summary.md").write_text("| scenario | kind |\n")
    assert findings.main(["--record", f"triage={run}"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {run / 'summary.md'}: not a summary of bench/")


def test_the_committed_findings_are_what_the_committed_data_gives():
    """FINDINGS.md is generated: edited by hand, or data changed without `nox -s findings`, fails."""
    assert findings.OUTPUT.read_text(encoding="utf-8") == findings.render()


def test_the_committed_data_has_no_machine_paths():
    for path in [*findings.DATA.rglob("*"), findings.OUTPUT]:
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            assert str(ROOT) not in text and findings.sanitize(text) == text, path


def test_a_data_folder_that_cannot_be_written_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the data folder should be")
    monkeypatch.setattr(findings, "DATA", blocker / "findings")
    monkeypatch.setattr(findings, "OUTPUT", tmp_path / "FINDINGS.md")
    assert findings.main(["--record", f"bisect={bisect_run(tmp_path / 'results')}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot record into ") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "FINDINGS.md").exists()


def patches_run(base: Path, stamp: str, rows: list[dict]) -> Path:
    from tools.series import series_gates

    run = base / "patches" / stamp
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(rows, indent=2))
    (run / "summary.md").write_text(series_gates.summary(rows))
    return run


def test_a_run_of_one_patch_replaces_only_its_rows_of_the_series(tmp_path, data):
    rows = json.loads((ROOT / "findings" / "patches" / "series" / "summary.json").read_text())
    first, second = sorted({r["patch"] for r in rows})[:2]
    both = [r for r in rows if r["patch"] in (first, second)]
    runs = tmp_path / "results"
    assert findings.main(["--record", f"patches={patches_run(runs, '20261201-101010', both)}"]) == 0
    again = [{**r, "after_detail": "rerun with a new header"} for r in both if r["patch"] == second]
    assert findings.main(["--record", f"patches={patches_run(runs, '20261202-101010', again)}"]) == 0
    record = data / "patches" / "series"
    merged = json.loads((record / "summary.json").read_text())
    assert [r["patch"] for r in merged] == [r["patch"] for r in both]  # the series' order
    assert [r for r in merged if r["patch"] == first] == [r for r in both if r["patch"] == first]
    assert {r["after_detail"] for r in merged if r["patch"] == second} == {"rerun with a new header"}
    assert (record / "summary.md").read_text().count("rerun with a new header") == len(again)
    meta = json.loads((record / "record.json").read_text())
    assert [(e["rows"], e["date"]) for e in meta["rows_from"]] == [
        ([first], "2026-12-01 10:10:10"), ([second], "2026-12-02 10:10:10")]
    text = (tmp_path / "FINDINGS.md").read_text()
    assert f"{second}: run 2026-12-02 10:10:10" in text and f"{first}: run 2026-12-01 10:10:10" in text


def test_the_rows_of_a_patch_that_left_the_series_are_dropped_when_another_is_recorded(tmp_path, data):
    rows = json.loads((ROOT / "findings" / "patches" / "series" / "summary.json").read_text())
    first, second = sorted({r["patch"] for r in rows})[:2]
    old = [r for r in rows if r["patch"] in (first, second)]
    gone = [{**r, "patch": "left-the-series.patch"} for r in old if r["patch"] == first]
    runs = tmp_path / "results"
    assert findings.main(["--record", f"patches={patches_run(runs, '20261201-101010', old + gone)}"]) == 0
    again = [r for r in old if r["patch"] == second]
    assert findings.main(["--record", f"patches={patches_run(runs, '20261202-101010', again)}"]) == 0
    record = data / "patches" / "series"
    merged = json.loads((record / "summary.json").read_text())
    assert {r["patch"] for r in merged} == {first, second}
    meta = json.loads((record / "record.json").read_text())
    assert all("left-the-series.patch" not in e["rows"] for e in meta["rows_from"])
    assert "left-the-series.patch" not in (record / "summary.md").read_text()
