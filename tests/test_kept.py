"""The "setups kept" gate (tools/series/kept.py): setups that work today, run before and after a
patch; one that was good before and is not good after fails the gate by name."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import patched_copy

from tools.series import kept, patches

CELL = "pl2_6_6_torch2_13_0"  # the tests' own Lightning and torch: the cell the series targets


def test_the_script_lists_its_cases_and_refuses_an_unknown_one():
    listed = kept.cases()
    assert {"toggle-per-step", "frozen-in-init-resume", "hooks", "static-graph", "manual-optimization",
            "resume-mid-epoch", "resume-epoch-end", "freeze-by-hand", "toggle-per-epoch"} <= set(listed)
    proc = subprocess.run([sys.executable, str(kept.SCRIPT), "--case", "nope"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 128 and "invalid choice: 'nope'" in proc.stderr


@pytest.fixture
def verdicts(monkeypatch):
    """Each (applied patches, case) judged as the test says, counting the runs."""
    said, runs = {}, []

    def verdict(side, applied, cell, case, log_stem):
        runs.append((applied, case))
        return said[(applied, case)], f"{case} as said"

    monkeypatch.setattr(kept, "verdict", verdict)
    return said, runs


def test_a_setup_good_before_and_bad_after_fails_the_gate_by_name(tmp_path, verdicts):
    said, runs = verdicts
    said.update({((), "a"): "good", (("p",), "a"): "good", ((), "b"): "good", (("p",), "b"): "bad",
                 ((), "c"): "bad", (("p",), "c"): "bad", ((), "d"): "good", (("p",), "d"): "skip"})
    g = kept.kept_gate(None, None, (), ("p",), CELL, tmp_path, only=["a", "b", "c", "d"], log=lambda m: None)
    assert not g["ok"]
    assert g["text"] == ("1 of 3 setups that work before still work; broken: b (bad after: b as said); "
                         "d (skip after: d as said); not counted: c (bad before)")
    said[(("p",), "b")] = said[(("p",), "d")] = "good"
    assert kept.kept_gate(None, None, (), ("p",), CELL, tmp_path, only=["b", "d"], log=lambda m: None)["ok"]
    assert len(runs) == 12


def test_a_gate_that_checked_nothing_or_could_not_run_a_case_fails(tmp_path, verdicts):
    said, _ = verdicts
    said.update({((), "c"): "bad", (("p",), "c"): "bad", ((), "e"): "error", (("p",), "e"): "error"})
    nothing = kept.kept_gate(None, None, (), ("p",), CELL, tmp_path, only=["c"], log=lambda m: None)
    assert nothing == {"ok": False, "text": "0 of 0 setups that work before still work; not counted: "
                                            "c (bad before) (nothing was checked)"}
    said.update({((), "a"): "good", (("p",), "a"): "good"})
    unrun = kept.kept_gate(None, None, (), ("p",), CELL, tmp_path, only=["a", "e"], log=lambda m: None)
    assert unrun == {"ok": False, "text": "1 of 1 setups that work before still work; could not run "
                                          "before: e (e as said)"}


def test_the_after_of_one_patch_is_not_run_again_as_the_before_of_the_next(tmp_path, monkeypatch):
    runs = []

    class Result:
        verdict, reason, record = "good", None, None

    monkeypatch.setattr(kept, "_VERDICTS", {})
    monkeypatch.setattr(kept.Launcher, "run", lambda self, run: runs.append(run.env) or Result())
    kept.kept_gate("py", "py", (), ("p1",), CELL, tmp_path, only=["a"], envs=({"n": "0"}, {"n": "1"}),
                   log=lambda m: None)
    kept.kept_gate("py", "py", ("p1",), ("p1", "p2"), CELL, tmp_path, only=["a"],
                   envs=({"n": "1"}, {"n": "2"}), log=lambda m: None)
    assert runs == [{"n": "0"}, {"n": "1"}, {"n": "2"}]


# patch 4 of the series as it was (a restore of the whole module's trainable set), kept beside the
# review comment it became
WHOLE_MODULE_RESTORE = patches.PATCHES / "comments" / "21902-whole-module-restore.patch"
# patch 1 as it was before its redesign: it wrapped again on freezing too, from a snapshot taken at
# the epoch's start
REWRAP_ON_ANY_CHANGE = Path(__file__).parent / "fixtures" / "kept" / "rewrap-on-any-change.patch"


def real_gate(tmp_path, stem: str, case: str) -> dict:
    """The gate for one patch and one case, on the installed Lightning: before with the series'
    earlier Lightning patches (none for a patch outside the series), after with this one too
    (patched copies on PYTHONPATH)."""
    everything = patches.series()
    patch = next((p for p in everything if p.path.stem == stem), None)
    if patch is None:  # a patch as it was: on master alone
        old = next(p for p in (WHOLE_MODULE_RESTORE, REWRAP_ON_ANY_CHANGE) if p.stem == stem)
        patch, earlier = patches.parse(old), []
    else:
        earlier = [p for p in everything[:everything.index(patch)] if p.target == "lightning"]
    sides = []
    for name, applied in (("before", earlier), ("after", [*earlier, patch])):
        folder = patched_copy(tmp_path / name, applied)
        sides.append({"PYTHONPATH": str(folder)})
    kept._VERDICTS.clear()
    return kept.kept_gate(sys.executable, sys.executable, tuple(p.name for p in earlier),
                          tuple(p.name for p in (*earlier, patch)), CELL, tmp_path / "logs", only=[case],
                          envs=tuple(sides), log=print)


@pytest.mark.ddp
@pytest.mark.timeout(900)
def test_every_setup_works_on_the_installed_release(tmp_path, monkeypatch):
    """What the gate stands on: each case is good as released (a case bad or unable to run here
    would be dropped from every row as "not counted")."""
    monkeypatch.setattr(kept, "_VERDICTS", {})
    for case in kept.cases():
        got = kept.verdict((sys.executable, {}), (), CELL, case, tmp_path / case)
        assert got[0] == "good", (case, got)


@pytest.mark.ddp
@pytest.mark.timeout(900)
@pytest.mark.parametrize("stem, case", [(REWRAP_ON_ANY_CHANGE.stem, "toggle-per-step"),
                                        (WHOLE_MODULE_RESTORE.stem, "frozen-in-init-resume")])
def test_the_gate_fails_a_patch_that_breaks_a_setup_that_works_today(tmp_path, stem, case):
    g = real_gate(tmp_path, stem, case)
    assert not g["ok"], g["text"]
    assert g["text"].startswith(f"0 of 1 setups that work before still work; broken: {case} (bad after: "), \
        g["text"]


@pytest.mark.ddp
@pytest.mark.timeout(900)
@pytest.mark.parametrize("stem, case", [
    # changes how a fit resumes after an epoch's last batch
    ("lightning-last-batch-resume", "resume-epoch-end"),
    # redesigned: it never wraps again on freezing
    ("lightning-ddp-rewrap-on-trainable-change", "toggle-per-step"),
])
def test_the_gate_passes_a_patch_that_keeps_the_setup(tmp_path, stem, case):
    g = real_gate(tmp_path, stem, case)
    assert g == {"ok": True, "text": "1 of 1 setups that work before still work"}, g
