"""A commit bisect on real Lightning history (needs LIGHTNING_REPO: a Lightning git checkout).

The expected answer is found independently with `git log -S`; the bisect must land on it.
"""

import json
import os
from pathlib import Path

import pytest

from tools import bisect_cli
from tools.stages import gitrange

REPO = os.environ.get("LIGHTNING_REPO")
PREDICATE = Path(__file__).parent / "fixtures" / "ddp_fit_tip.py"

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(1800),
              pytest.mark.skipif(not REPO, reason="set LIGHTNING_REPO to a Lightning git checkout")]


def test_commit_bisect_lands_on_the_change_git_log_names(tmp_path):
    repo = gitrange.repo_at(REPO)
    master = "master" if "master" in repo.refs else "origin/master"
    added = repo.git.log("--first-parent", "--format=%H", "-S", "seamless cloud logging",
                         master, "--", "src/lightning/pytorch").split()[-1]
    after = repo.git.log("--first-parent", "--reverse", "--format=%H", f"{added}..{master}").split()
    good, bad = repo.commit(added).parents[0].hexsha, after[min(5, len(after) - 1)]
    code = bisect_cli.main(["--tier", "commits", "--repo", REPO, "--good", good, "--bad", bad,
                            "--torch", "2.13.0", "--script", str(PREDICATE), "--timeout", "300",
                            "--state", str(tmp_path / "state.json"), "--out", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["commits"]["outcome"]["first_bad"] == added
