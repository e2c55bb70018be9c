"""The Lightning patches on a real Lightning checkout (needs LIGHTNING_REPO).

quilt's contract: each patch applies exactly (no offset) at its ``X-Base`` on top of the earlier
Lightning patches of the series, and still applies at master.
"""

import os

import pytest

from tools import gitrange, patches, validate_patches

REPO = os.environ.get("LIGHTNING_REPO")
pytestmark = pytest.mark.skipif(not REPO, reason="set LIGHTNING_REPO to a Lightning git checkout")


def test_each_lightning_patch_applies_at_its_base_on_top_of_the_earlier_ones(tmp_path):
    series = [p for p in patches.series() if p.target == "lightning"]
    repo = gitrange.open_repo(REPO, validate_patches.CACHE / "repos")
    wt = gitrange.Worktree(repo, tmp_path / "wt", sparse=("src", "tests"))
    for k, patch in enumerate(series):
        states = validate_patches.checkout_states(patch, repo, wt, series[:k])
        base, master = states.split("; ")
        assert base == "base: applies", (patch.name, states)
        assert master.startswith(("master: applies", "master: drift")), (patch.name, states)
    repo.git.worktree("remove", "--force", str(tmp_path / "wt"))


def test_an_unknown_base_is_reported_not_raised(tmp_path):
    (patch,) = patches.named("lightning-finetuning-resume-unfrozen.patch")
    patch.headers["X-Base"] = "no-such-ref-anywhere"
    repo = gitrange.open_repo(REPO, validate_patches.CACHE / "repos")
    wt = gitrange.Worktree(repo, tmp_path / "wt", sparse=("src", "tests"))
    states = validate_patches.checkout_states(patch, repo, wt, [])
    assert states.startswith("base: fails (unknown git ref 'no-such-ref-anywhere')")
    repo.git.worktree("remove", "--force", str(tmp_path / "wt"))
