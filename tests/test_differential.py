"""The differential (``tools/triage/differential.py``): a report that names a release that worked and
shows no exception gets its predicate from one run in each release; ``--bad-output`` judges a run
that exits 0 by what it prints (``Launcher`` and ``nox -s bisect``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools import triage
from tools.core import contract
from tools.launch import sandbox
from tools.launch.launcher import Launcher, Run
from tools.triage.differential import Predicate, predicate, worked_release

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "issues"


@pytest.mark.parametrize("text, release, broken", [
    ("Since upgrading from 2.3 to 2.4 the loss is NaN.", "2.3", "2.4"),
    ("since updating from pytorch-lightning 2.5.4 to 2.6.0, it prints no", "2.5.4", "2.6.0"),
    ("After moving from v2.0.9 the link appears.", "2.0.9", None),
    ("This worked fine in 2.3.3 and broke later.", "2.3.3", None),
    ("It works with lightning 2.2.0.", "2.2.0", None),
    ("Going back to 2.0.9 solves it.", "2.0.9", None),
    ("Downgrading to 2.4.0 makes it\ngo away (a wrapped line).", "2.4.0", None),
    ("On 2.3 it works as expected.", "2.3", None),
    ("It failed on 2.4 but worked in 2.3.", "2.3", None),
    ("After upgrading to 2.4 (from 2.3) the link appears.", "2.3", "2.4"),
    ("Everything was fine in lightning==2.3.3.", "2.3.3", None),
])
def test_the_release_that_worked_is_read_from_the_prose(text, release, broken):
    found = worked_release(text)
    assert (found.release, found.broken) == (release, broken), found


@pytest.mark.parametrize("text", [
    # another package's version: not a Lightning differential
    "It worked with torch 2.3 but not with 2.4.",
    "Since upgrading torch from 2.1 to 2.2 the loss is NaN.",
    "After updating pytorch from 2.3 to 2.4 it hangs.",
    "Downgrading PyTorch to 2.3 fixes it.",
    # a saying denied
    "This stopped working in 2.4.",
    "It is not working in 2.3 either.",
    "It never worked in 2.3.",
    "I upgraded from 2.3 to 2.4 and it still works.",
    # code, not the prose
    "We use 2.4.0.\n\n```python\n# worked in 2.3.0\nprint(1)\n```",
    "We use 2.4.0.\n\n~~~\n# worked in 2.3.0\n~~~\n",
    "We use 2.4.0:\n\n    # worked in 2.3.0\n",
    "The loss is NaN from the first step.",
])
def test_no_release_is_taken_from_another_packages_version_a_denial_code_or_a_report_that_names_none(text):
    assert worked_release(text) is None


def test_a_line_the_report_shows_that_only_the_broken_release_prints_is_bad_output():
    report = "### Error messages and logs\n\n```\nresumed at step 12 of 40\n```\n"
    found = predicate((0, "GPU available: False\nresumed at step 12 of 40\n"),
                      (0, "GPU available: False\nresumed at step 0 of 40\n"), report)
    assert isinstance(found, Predicate) and found.option == "bad_output"
    assert re.search(found.regex, "resumed at step 12 of 40")
    assert not re.search(found.regex, "resumed at step 0 of 40")
    assert found.regex == r"(?m)^\s*resumed at step 12 of 40\s*$"  # generalized it would match the good line


def test_numbers_are_generalized_when_the_good_output_still_does_not_match():
    report = "it now prints `last.ckpt is a link: True epoch=1-step=4.ckpt`"
    found = predicate((0, "last.ckpt is a link: True epoch=1-step=4.ckpt"), (0, "last.ckpt is a link: False"),
                      report)
    assert found.option == "bad_output"
    assert re.search(found.regex, "last.ckpt is a link: True epoch=3-step=9.ckpt")
    assert not re.search(found.regex, "last.ckpt is a link: False")


def test_a_paths_folders_differ_between_the_report_and_the_runs_and_from_run_to_run():
    """The run prints where it wrote (a temporary folder of its own), the report what the reporter
    saw (their folder, or a name alone): the line is the same bug's, and the predicate must match
    the next run's folder too."""
    report = "### Error messages and logs\n\n```\nlast.ckpt is a link: True epoch=1-step=4.ckpt\n```\n"
    found = predicate((0, "last.ckpt is a link: True /sandbox/tmp/tmpa1b2/ckpts/epoch=1-step=4.ckpt\n"),
                      (0, "last.ckpt is a link: False\n"), report)
    assert isinstance(found, Predicate) and found.option == "bad_output", found
    assert re.search(found.regex, "last.ckpt is a link: True /tmp/tmpzz9/ckpts/epoch=1-step=4.ckpt")
    assert not re.search(found.regex, "last.ckpt is a link: False")


def test_an_exit_1_with_a_printed_line_is_a_signature_and_a_crash_the_report_does_not_quote_its_exception():
    printed = predicate((1, "REGRESSION: 3 batches skipped\n"), (0, "all batches seen\n"),
                        "Error messages:\n\n    REGRESSION: 3 batches skipped\n")
    assert (printed.option, printed.regex) == ("signature",
                                               r"(?m)^\s*REGRESSION: \d+(?:\.\d+)? batches skipped\s*$")
    raised = predicate((1, "Traceback ...\nKeyError: 'x'\n"), (0, "done\n"), "no logs in this report",
                       exception="KeyError: 'x'")
    assert (raised.option, raised.regex) == ("signature", "KeyError: 'x'")


@pytest.mark.parametrize("broken, worked, why", [
    ((0, "done\nusing the new loader\n"), (0, "done\n"), "the report shows none of those lines"),
    ((0, "done\nUserWarning: a new deprecation\n"), (0, "done\n"), "print the same lines"),  # noise only
    ((0, "done\n"), (0, "done\n"), "print the same lines"),
    ((1, "boom\n"), (1, "boom\n"), "the release said to work exited 1"),
    ((0, "GPU available: False\ndone\n"), (1, "ImportError: x\n"), "the release said to work exited 1"),
    ((-9, ""), (0, "done\n"), "only exits 0 and 1"),
])
def test_without_a_difference_the_report_shows_there_is_no_predicate(broken, worked, why):
    found = predicate(broken, worked, "it now says `done` twice")
    assert isinstance(found, str) and why in found, found


def test_the_output_fixture_gets_its_differential_line():
    text = (FIXTURES / "checkpoint_output_regression.md").read_text()
    said = worked_release(text)
    assert (said.release, said.broken) == ("2.5.4", "2.6.0")
    found = predicate((0, "checkpoint loaded back: no"), (0, "checkpoint loaded back: yes"), text)
    assert found.option == "bad_output" and found.regex == r"(?m)^\s*checkpoint loaded back: no\s*$"


def test_a_line_the_working_release_prints_within_a_longer_one_is_never_the_predicate():
    """Anchored to the whole line: "saved" is not found in "saved to model.ckpt"; a line that
    matches the working output even as it is gives no predicate."""
    found = predicate((0, "saved\n"), (0, "saved to model.ckpt\n"), "it only prints `saved`")
    assert found.regex == r"(?m)^\s*saved\s*$" and not re.search(found.regex, "saved to model.ckpt")


def test_the_bugs_line_wins_over_a_banner_a_summary_or_a_warning_the_full_log_shows():
    log = ("GPU available: False, used: False\n| Name | Type   | Params | Mode\n"
           "UserWarning: something new\ncheckpoint loaded back: no\n")
    old = "GPU available: False\n| Name | Type   | Params\ncheckpoint loaded back: yes\n"
    found = predicate((0, log), (0, old), f"### Error messages and logs\n\n```\n{log}```\n")
    assert found.regex == r"(?m)^\s*checkpoint loaded back: no\s*$", found


@pytest.mark.parametrize("boxed", [False, True], ids=["plain", "sandbox"])
def test_a_run_that_exits_0_and_prints_the_bad_output_is_bad_and_only_that_one(tmp_path, boxed):
    if boxed and (why := sandbox.unavailable()):
        pytest.skip(why)
    tmp_path.chmod(0o755)  # the run is nobody, when the suite is root
    script = tmp_path / "says.py"
    script.write_text("import sys\nprint(sys.argv[1])\nsys.exit(int(sys.argv[2]))\n")
    with Launcher() as launcher:
        def run(line, code):
            return launcher.run(Run((str(script), line, str(code)), Path(sys.executable), timeout=60,
                                    bad_output="loaded back: no", sandbox=boxed,
                                    log_stem=tmp_path / f"{line.split()[-1]}-{code}"))
        bad, good, crashed = run("loaded back: no", 0), run("loaded back: yes", 0), run("loaded back: no", 1)
    assert (bad.code, bad.final) == (contract.BAD, True) and "exit 0, but it prints" in bad.reason
    assert good.code == contract.GOOD
    assert crashed.code == contract.SKIP  # exit 1 is judged by the signature alone, and there is none


def test_the_bisect_takes_bad_output_as_its_judge_and_keys_its_verdicts_by_it(tmp_path):
    from tools import bisect_cli
    from tools.stages import bisect_tiers

    repro = tmp_path / "r.py"
    repro.write_text("print('x')\n")
    cfg = bisect_cli.parse_args(["--script", str(repro), "--bad-output", "loaded back: no",
                                 "--out", str(tmp_path)])
    assert cfg.bad_output == "loaded back: no"
    assert "|bad-output=loaded back: no" in bisect_tiers.signature_key(cfg)
    proc = subprocess.run([sys.executable, "-m", "tools.bisect_cli", "--script", str(repro),
                           "--bad-output", "(", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --bad-output '(' is not a valid regex")


def test_a_differential_that_finds_nothing_the_report_shows_says_why_and_asks(tmp_path, monkeypatch):
    """The triage's wiring, the runs faked: both releases print the same, so no predicate, and the
    comment says what ran."""
    report = tmp_path / "report.md"
    report.write_text("# no change\n\nSince upgrading from 2.5.4 to 2.6.0 it is slower.\n\n```python\n"
                      "import pytorch_lightning as pl\n\ntrainer = pl.Trainer(max_epochs=1)\n"
                      "print('done')\n```\n")
    monkeypatch.setattr(triage.runs, "resolve", lambda package, version: version)
    monkeypatch.setattr(triage.runs, "newest_release", lambda package: "2.6.6")
    monkeypatch.setattr(triage.sandbox, "unavailable", lambda: None)
    from tools.launch import harness
    from tools.stages import bisect_tiers

    monkeypatch.setattr(bisect_tiers, "release_env", lambda *a, **k: Path(sys.executable))
    logs = tmp_path / "said.txt"
    logs.write_text("done\n")
    monkeypatch.setattr(Launcher, "run", lambda self, run: harness.RunResult(
        0, "good", None, 1.0, 0, stdout_path=str(logs), stderr_path=None))
    t = triage.triage(triage.parse_args([str(report), "--out", str(tmp_path / "out"), "--trials", "1"]))
    assert t["status"].startswith("no signature:")
    assert "both releases exit 0 and print the same lines" in t["status"]
    assert t["differential"]["broken_exit"] == 0 and t["differential"]["worked"] == "2.5.4"
    assert "ran once in 2.6.0 (exit 0) and in 2.5.4 (exit 0)" in (tmp_path / "out" / "comment.md").read_text()


@pytest.mark.timeout(1800)
def test_an_output_only_regression_is_reproduced_through_its_differential_on_real_releases(tmp_path):
    """The real thing: the script exits 0 in every release and only prints what went wrong;
    2.6.0 stopped loading such checkpoints back (torch's weights-only loading), 2.5.4 did not."""
    if why := sandbox.unavailable():
        pytest.skip(why)
    out = tmp_path / "out"
    report = FIXTURES / "checkpoint_output_regression.md"
    proc = subprocess.run([sys.executable, "-m", "tools.triage", str(report),
                           "--trials", "1", "--budget", "0", "--no-bisect", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1700)
    assert proc.returncode == 0, proc.stderr[-3000:]
    t = json.loads((out / "triage.json").read_text())
    assert (t["differential"]["broken_exit"], t["differential"]["worked_exit"]) == (0, 0)
    assert t["bad_output"] == r"(?m)^\s*checkpoint loaded back: no\s*$" and not t["signature"]
    assert t["status"].startswith("reproduced 1/1 on pytorch-lightning 2.6.6"), t["status"]
    assert "1/1 on the reporter's 2.6.0" in t["status"]



def test_the_bad_output_of_a_job_of_several_nodes_is_read_from_each_nodes_logs(tmp_path):
    """A job's result (``tools.nodes``) has no streams of its own: each node's logs are read."""
    from types import SimpleNamespace

    from tools.launch.launcher import printed
    from tools.triage.differential import output

    stem = tmp_path / "run-1"
    (tmp_path / "run-1.node0.stdout").write_text("rank 0: done\n")
    (tmp_path / "run-1.node1.stdout").write_text("rank 1: checkpoint loaded back: no\n")
    job = SimpleNamespace(code=0)
    assert printed(job, "checkpoint loaded back: no", stem)
    assert not printed(job, "checkpoint loaded back: no")  # without the stem: nothing to read
    assert "rank 1: checkpoint loaded back: no" in output(job, stem)
