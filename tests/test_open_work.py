"""The gate "open upstream work" (``tools/series/open_work.py``) on a small git repository whose pull
requests' heads are ``refs/pull/N/head``, as on a GitHub mirror: which PRs count as unmerged,
which ones matter to a patch, and where the patch stands beside each."""

from pathlib import Path

import git
import pytest

from tools.series import open_work

DAY = 86400
BASE = 1_780_000_000  # master's newest commit (seconds since the epoch)


def commit(repo: git.Repo, files: dict[str, str], message: str, when: int) -> str:
    for name, text in files.items():
        (Path(repo.working_tree_dir) / name).write_text(text)
    repo.git.add("-A")
    stamp = f"{when} +0000"
    with repo.git.custom_environment(GIT_AUTHOR_DATE=stamp, GIT_COMMITTER_DATE=stamp):
        repo.git.commit("-q", "-m", message)
    return repo.head.commit.hexsha


def lines(*changed: tuple[int, str]) -> str:
    text = [f"line {i}\n" for i in range(1, 21)]
    for i, new in changed:
        text[i - 1] = new
    return "".join(text)


def pull(repo: git.Repo, number: int, files: dict[str, str], message: str, when: int, start: str) -> str:
    """A PR branched at ``start``, published as ``refs/pull/<number>/head``."""
    repo.git.checkout("-q", "-B", f"pr{number}", start)
    head = commit(repo, files, message, when)
    repo.git.update_ref(f"refs/pull/{number}/head", head)
    repo.git.checkout("-q", "master")
    return head


@pytest.fixture
def upstream(tmp_path):
    """Master, the patch's diff (line 2 of ``a.py``) and PRs of every kind."""
    repo = git.Repo.init(tmp_path / "upstream", initial_branch="master")
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    start = commit(repo, {"a.py": lines(), "b.py": lines(), "CHANGELOG.md": "# Changes\n"}, "start",
                   BASE - 9 * DAY)
    # 1: squash-merged (master has "... (#1)"); 7: merged with a merge commit
    pull(repo, 1, {"a.py": lines((5, "squashed\n"))}, "squash me", BASE - 8 * DAY, start)
    squashed = commit(repo, {"a.py": lines((5, "squashed\n"))}, "Squash me (#1)", BASE - 7 * DAY)
    seven = pull(repo, 7, {"b.py": lines((20, "merged\n"))}, "merge me", BASE - 6 * DAY, "master")
    repo.git.merge("-q", "--no-ff", "-m", "Merge pull request #7", seven)
    tip = commit(repo, {"b.py": lines((20, "merged\n"), (19, "on master\n"))}, "newest", BASE)
    pull(repo, 2, {"a.py": lines((5, "squashed\n"), (2, "theirs\n"))}, "Rewrite line 2", BASE - DAY, tip)
    pull(repo, 3, {"b.py": lines((1, "x\n"))}, "Touch b\n\nFixes #77", BASE - DAY, tip)
    pull(repo, 4, {"CHANGELOG.md": "# Changes\n- an entry\n"}, "Only the changelog", BASE - DAY, tip)
    pull(repo, 5, {"a.py": lines((5, "squashed\n"), (18, "far away\n"))}, "Change line 18", BASE - DAY, tip)
    pull(repo, 6, {"a.py": lines((5, "squashed\n"), (10, "old\n"))}, "Too old", BASE - 400 * DAY, tip)
    pull(repo, 8, {"a.py": lines((2, "stale\n")), "b.py": lines((19, "stale\n"))}, "Stale", BASE - DAY, start)
    pull(repo, 9, {"a.py": lines((5, "squashed\n"), (15, "apart\n")), "b.py": lines((19, "clash\n"))},
         "Stale, apart", BASE - DAY, squashed)
    (Path(repo.working_tree_dir) / "a.py").write_text(lines((5, "squashed\n"), (2, "ours\n")))
    diff = repo.git.diff("--src-prefix=a/", "--dst-prefix=b/") + "\n"
    repo.git.checkout("--", "a.py")
    clone = git.Repo.clone_from(repo.working_tree_dir, tmp_path / "clone")  # refs/pull are not cloned
    return clone, diff


def related(clone, diff, issue="77"):
    return {p.number: p for p in open_work.related(clone, "origin/master", ["a.py", "CHANGELOG.md"], issue,
                                                   diff)}


def test_the_prs_that_matter_and_where_the_patch_stands_beside_each(upstream):
    clone, diff = upstream
    found = related(clone, diff)
    # 1 and 7 were merged, 4 changes only the CHANGELOG, 6 is older than the window
    assert sorted(found) == [2, 3, 5, 8, 9]
    assert found[2].applies == "conflicts in a.py" and found[2].touches == ["a.py"]
    assert found[3].names_issue and found[3].touches == [] and found[3].applies == "applies"
    assert found[5].applies == "applies" and found[5].title == "Change line 18"
    # 8 no longer merges; on its own tree, line 2 of a.py is its own: the two change the same hunk
    stale = "the PR no longer merges into master; on its own tree the patch "
    assert found[8].applies == stale + "conflicts in a.py"
    assert found[9].applies == stale + "applies"  # its change of a.py is far from the patch's
    assert not any(p.names_issue for n, p in found.items() if n != 3)


def test_a_pr_naming_the_issue_must_be_answered_by_the_description(upstream):
    clone, diff = upstream
    prs = list(related(clone, diff).values())
    silent = open_work.gate("Fix the thing.\n\nIt was wrong.", "77", prs)
    assert not silent["ok"] and silent["text"].startswith("#3 name its issue and the description does not")
    assert "it conflicts with #2 (conflicts in a.py)" in silent["text"]
    assert ("no longer merging into master: #8 (on its own tree the patch conflicts in a.py); "
            "#9 (on its own tree the patch applies)") in silent["text"]
    answered = open_work.gate("Fix the thing.\n\nUnlike #3, it keeps b.py.", "77", prs)
    assert answered["ok"] and [p["number"] for p in answered["details"]["prs"]] == [2, 3, 5, 8, 9]


def test_another_issue_or_a_wider_window(upstream):
    clone, diff = upstream
    assert sorted(related(clone, diff, issue="78")) == [2, 5, 8, 9]  # 3 no longer matters
    wider = open_work.related(clone, "origin/master", ["a.py"], None, diff, days=500)
    assert sorted(p.number for p in wider) == [2, 5, 6, 8, 9]
    assert open_work.gate("x", None, [])["ok"]


def test_a_clone_without_pull_requests_has_none(tmp_path):
    repo = git.Repo.init(tmp_path / "r", initial_branch="master")
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    commit(repo, {"a.py": lines()}, "start", BASE)
    clone = git.Repo.clone_from(repo.working_tree_dir, tmp_path / "clone")
    # the fetch of refs/pull finds none and fails nothing
    assert open_work.related(clone, "origin/master", ["a.py"], "1", "") == []
