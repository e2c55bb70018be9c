"""The Lightning patches on a real Lightning checkout (needs LIGHTNING_REPO).

quilt's contract: each patch applies exactly (no offset) at its ``X-Base`` on top of the earlier
Lightning patches of the series, and still applies at master. The existing-tests gate of
``nox -s patches`` fails a patch that breaks a test that passed without it.
"""

import difflib
import os
import re
import shutil
from pathlib import Path

import pytest

from tools import validate_patches
from tools.environments import matrix
from tools.series import patched, patches, series_gates
from tools.stages import gitrange

REPO = os.environ.get("LIGHTNING_REPO")
pytestmark = pytest.mark.skipif(not REPO, reason="set LIGHTNING_REPO to a Lightning git checkout")


def test_each_lightning_patch_applies_at_its_base_on_top_of_the_earlier_ones(tmp_path):
    series = [p for p in patches.series() if p.target == "lightning"]
    repo = gitrange.open_repo(REPO, patched.CACHE / "repos")
    wt = gitrange.Worktree(repo, tmp_path / "wt", sparse=("src", "tests"))
    for k, patch in enumerate(series):
        states = series_gates.checkout_states(patch, repo, wt, series[:k])
        base, master = states.split("; ")
        assert base == "base: applies", (patch.name, states)
        assert master.startswith(("master: applies", "master: drift")), (patch.name, states)
    repo.git.worktree("remove", "--force", str(tmp_path / "wt"))


def test_each_lightning_patch_applies_alone_at_master_changelog_included(tmp_path):
    """Each patch becomes its own PR: on master without the others, every hunk (the CHANGELOG's
    too) lands, at most moved (no fuzz)."""
    repo = gitrange.open_repo(REPO, patched.CACHE / "repos")
    wt = gitrange.Worktree(repo, tmp_path / "wt", sparse=("src", "tests"))
    for patch in [p for p in patches.series() if p.target == "lightning"]:
        assert any(f.endswith("CHANGELOG.md") for f in patch.files), patch.name
        states = series_gates.checkout_states(patch, repo, wt, [])
        assert states.split("; ")[1].startswith(("master: applies", "master: drift")), (patch.name, states)
    repo.git.worktree("remove", "--force", str(tmp_path / "wt"))


def test_an_unknown_base_is_reported_not_raised(tmp_path):
    (patch,) = patches.named("lightning-finetuning-equal-params.patch")
    patch.headers["X-Base"] = "no-such-ref-anywhere"
    repo = gitrange.open_repo(REPO, patched.CACHE / "repos")
    wt = gitrange.Worktree(repo, tmp_path / "wt", sparse=("src", "tests"))
    states = series_gates.checkout_states(patch, repo, wt, [])
    assert states.startswith("base: fails (unknown git ref 'no-such-ref-anywhere')")
    repo.git.worktree("remove", "--force", str(tmp_path / "wt"))


FINETUNING = "src/lightning/pytorch/callbacks/finetuning.py"
BREAKING = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: someone <someone@example.invalid>
Subject: [PATCH] make_trainable leaves parameters frozen

A change that breaks an existing test on purpose.

Bug: https://github.com/Lightning-AI/pytorch-lightning/issues/1
Forwarded: no
Origin: other
Last-Update: 2026-11-30
X-Target: lightning
X-Base: {base}
X-Cells: {cell}
X-Repro: repro/finetuning_resume.py
X-Expect-Before: bad
X-Expect-After: good
---
"""


def series_with_a_breaking_patch(tmp_path, repo) -> list[patches.Patch]:
    """The real series copied to ``tmp_path``, plus a last patch, made here against master with
    the real Lightning patches applied, after which ``BaseFinetuning.make_trainable`` leaves
    parameters frozen."""
    folder = tmp_path / "patches"
    folder.mkdir()
    real = patches.series()
    for p in real:
        shutil.copy(p.path, folder / p.name)
    master = gitrange.resolve(repo, "master")
    wt = gitrange.Worktree(repo, tmp_path / "wt", sparse=("src", "tests"))
    tree = series_gates.on_top_of(wt, master, [p for p in real if p.target == "lightning"])
    old = (tree / FINETUNING).read_text()
    new = old.replace("param.requires_grad = True", "param.requires_grad = False", 1)
    assert new != old
    diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{FINETUNING}",
                                        f"b/{FINETUNING}"))
    cell = next(p for p in real if p.target == "lightning").cells[0]
    (folder / "breaks.patch").write_text(BREAKING.format(base=master, cell=cell)
                                         + f"diff --git a/{FINETUNING} b/{FINETUNING}\n" + diff)
    (folder / "series").write_text("".join(f"{p.name}\n" for p in real) + "breaks.patch\n")
    repo.git.worktree("remove", "--force", str(tmp_path / "wt"))
    return patches.series(folder)


def existing_tests_gate(monkeypatch, patch, out):
    """``upstream()`` as ``nox -s patches`` runs it for one patch, tools/series/gates.py's gates left out."""
    monkeypatch.setattr(series_gates, "_UPSTREAM", {})
    monkeypatch.setattr(series_gates, "other_gates", lambda *a, **k: {
        name: {"ok": True, "text": "not run here"} for name in series_gates.OTHER_GATES})
    cell = next(c for c in matrix.load().cells if c.id == patch.cells[0])
    _, gates = validate_patches.upstream(patch, cell, out, repeat=1, log=lambda msg: None)
    return gates


@pytest.mark.timeout(900)
def test_a_patch_that_breaks_an_existing_test_fails_the_existing_tests_gate(tmp_path, monkeypatch):
    repo = gitrange.open_repo(REPO, patched.CACHE / "repos")
    *_, broken = series_with_a_breaking_patch(tmp_path, repo)
    gates = existing_tests_gate(monkeypatch, broken, tmp_path / "out")
    existing = gates["existing tests"]
    assert not existing["ok"], existing["text"]
    assert re.search(r"\d+ of \d+ that passed do not: test_finetuning_callback\.py::\w+ \(failed\)",
                     existing["text"]), existing["text"]
    assert all(node.startswith("tests/tests_pytorch/callbacks/test_finetuning_callback.py::")
               for node in existing["details"]["broken"])
    assert not gates["upstream tests"]["ok"]  # it adds no test either
    assert gates["flaky"] == {"ok": True, "text": "no new multi-process test"}


@pytest.mark.timeout(900)
def test_the_finetuning_patch_keeps_every_existing_test_passing(tmp_path, monkeypatch):
    (patch,) = patches.named("lightning-finetuning-equal-params.patch")
    gates = existing_tests_gate(monkeypatch, patch, tmp_path / "out")
    existing = gates["existing tests"]
    assert existing["ok"], existing["text"]
    assert re.search(r"all \d+ that passed still pass$", existing["text"])
    assert gates["upstream tests"]["ok"], gates["upstream tests"]["text"]


def test_the_open_upstream_work_of_a_patch_on_the_real_history():
    """The unmerged PRs of the real mirror that matter to a patch: each one's head is in the
    clone, is no ancestor of master, has no squash commit there, and shares a file that is no
    CHANGELOG (or names the issue); where the patch stands beside it was checked."""
    from tools.series import open_work

    (patch,) = patches.named("lightning-finetuning-equal-params.patch")
    repo = gitrange.open_repo(REPO, patched.CACHE / "repos")
    master = gitrange.resolve(repo, "master")
    issue = open_work.issue_number(patch.headers["Bug"])
    found = open_work.related(repo, master, patch.files, issue, patch.diff)
    if not repo.git.for_each_ref("refs/pull"):
        assert found == []
        pytest.skip("this checkout holds no pull requests' heads (refs/pull/*)")
    squashed = set(re.findall(r"\(#(\d+)\)$", repo.git.log("--format=%s", master), flags=re.M))
    for pr in found:
        head = repo.git.rev_parse(f"refs/pull/{pr.number}/head")
        assert not repo.is_ancestor(head, master) and str(pr.number) not in squashed, pr
        assert pr.names_issue or pr.touches, pr
        assert set(pr.touches) <= set(patch.files) and not any(map(open_work.is_changelog, pr.touches)), pr
        assert re.fullmatch(r"applies|conflicts( in .+)?|the PR no longer merges into master; "
                            r"on its own tree the patch (applies|conflicts( in .+)?)", pr.applies), pr
    gate = series_gates.open_upstream_work(patch, repo, master, log=lambda msg: None)
    assert gate["ok"] == all(f"#{p.number}" in patch.headers["Description"] for p in found if p.names_issue)


def test_every_cited_line_and_commit_of_the_claims_holds_at_master(tmp_path):
    """The claims that cite Lightning's source or history, read in the real checkout (and torch's,
    in the torch this suite runs on, the upstream tests' torch)."""
    import torch

    from tools.series import claims

    repo = gitrange.open_repo(REPO, patched.CACHE / "repos")
    wt = gitrange.Worktree(repo, tmp_path / "wt", sparse=("src",))
    tree = wt.checkout(gitrange.resolve(repo, "master"))
    torch_root = os.path.dirname(os.path.dirname(torch.__file__))
    descriptions = {p.name: p.headers["Description"] for p in patches.series()}
    checked = 0
    for name, listed in claims.load().items():
        for c in listed:
            if "line" in c or "commit" in c:
                assert claims.check(c, descriptions[name], set(), [], tree, Path(torch_root), repo) is None, c
                checked += 1
    assert checked
    repo.git.worktree("remove", "--force", str(tmp_path / "wt"))
