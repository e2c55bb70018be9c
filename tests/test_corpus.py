"""Real regressions with known culprits (``tests/corpus/cases.toml``): the bisect must name them.

The corpus cases are slow (a release bisect, then a commit bisect on real Lightning history, in
real era-correct environments): they need ``LIGHTNING_REPO`` (a Lightning git checkout) and skip
cleanly without it. ``CORPUS_TORCH`` chooses the torch modes (default ``auto,2.13.0``: the torch
of each release's day, and one fixed torch); with ``CORPUS_OUT=<folder>`` every report is kept
there, one folder per case and mode (to record them: ``nox -s findings -- --record bisect=...``).
One release-tier case runs without a checkout: it crosses the release where ``pkg_resources``
stops being imported.
"""

import json
import os
import tomllib
from pathlib import Path

import pytest

from tools import bisect_cli

CORPUS = Path(__file__).parent / "corpus"
CASES = tomllib.loads((CORPUS / "cases.toml").read_text())["case"]
REPO = os.environ.get("LIGHTNING_REPO")
MODES = os.environ.get("CORPUS_TORCH", "auto,2.13.0").split(",")
TEST_TORCH = "2.13.0"  # what the test environment has (the noxfile's TEST_TORCH)


def bisect(case: dict, tmp_path: Path, out: Path, *args: str) -> tuple[int, dict, str]:
    code = bisect_cli.main(["--script", str(CORPUS / f"{case.get('script', case['name'])}.py"),
                            "--signature", case["signature"], "--timeout", "300",
                            "--state", str(tmp_path / "state.json"), "--out", str(out), *args])
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    text = (out / "report.md").read_text() if (out / "report.md").exists() else ""
    return code, report, text


def test_the_corpus_covers_what_it_must():
    assert len(CASES) >= 6 and len({c["name"] for c in CASES}) == len(CASES)
    assert sum(bool(c.get("ddp")) for c in CASES) >= 2
    tags = " ".join(t for c in CASES for t in c["tags"])
    for needed in ("cherry-pick", "depends on", "not monotonic"):
        assert needed in tags
    for case in CASES:
        script = (CORPUS / f"{case.get('script', case['name'])}.py").read_text()
        assert case["signature"].replace("\\", "")[:20] in script or case.get("ddp") or \
            "AttributeError" in case["signature"], case["name"]


@pytest.mark.timeout(1200)
def test_a_release_bisect_across_the_pkg_resources_change_names_the_first_bad_release(tmp_path):
    # 2.3.3 imports pkg_resources; with torch 2.13 its closure brought setuptools 83, which has none,
    # so the good end could not run and the bisect blamed the bug ("the good end is not good")
    case = next(c for c in CASES if c["name"] == "ctrl_c_returns")
    code, report, text = bisect(case, tmp_path, tmp_path / "out", "--tier", "releases",
                                "--oldest", "2.3.0", "--bad", "2.4.0", "--torch", TEST_TORCH)
    assert code == 0, text
    outcome = report["releases"]["outcome"]
    assert (outcome["first_bad"], outcome["last_good"]) == ("2.4.0", "2.3.3")
    assert "as early as torch allows: setuptools" in text  # the environment section says why


@pytest.mark.corpus
@pytest.mark.skipif(not REPO, reason="set LIGHTNING_REPO to a Lightning git checkout")
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("torch", MODES)
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_bisect_names_the_culprit(case, torch, tmp_path):
    keep = os.environ.get("CORPUS_OUT")
    out = Path(keep) / f"{case['name']}-torch{torch}" if keep else tmp_path / "out"
    code, report, text = bisect(case, tmp_path, out, "--repo", REPO, "--torch", torch, *case["args"])
    assert code == 0, text
    releases = report["releases"]["outcome"]
    assert (releases["last_good"], releases["first_bad"]) == (case["last_good"], case["first_bad"])
    first_bad = report["commits"]["outcome"]["first_bad"]
    subject = next(c["subject"] for c in report["commits"]["commits"] if c["sha"] == first_bad)
    assert any(first_bad.startswith(c) for c in case["culprits"]) or f"(#{case['pr']})" in subject, text
