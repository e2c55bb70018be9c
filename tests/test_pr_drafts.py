"""`nox -s pr`'s texts for the reporters: issue comments and new-issue drafts from a patch series
and recorded runs of their own."""

import json
import re

import pytest

from tools import pr_bundle
from tools.core import results
from tools.records import comments, findings
from tools.series import gates, patches

FIELDS = """Forwarded: no
Origin: other
Last-Update: 2026-11-29
X-Target: lightning
X-Base: 7f0c3436cd
X-Cells: pl2_6_6_torch2_13_0
X-Expect-Before: bad
X-Expect-After: good
---
diff --git a/src/lightning/pytorch/m.py b/src/lightning/pytorch/m.py
--- a/src/lightning/pytorch/m.py
+++ b/src/lightning/pytorch/m.py
@@ -10,2 +10,3 @@
 line 10
+inserted
 line 11
"""
CAUSE = "The cause, in a paragraph\nwrapped over two lines."
FIX = "The fix, in the\nsecond paragraph."
ALTERNATIVES = "Alternatives considered: a learning rate of 0\ninstead of freezing."
# the form's fields, in order (.github/ISSUE_TEMPLATE/1_bug_report.yaml of Lightning)
FORM = ["Bug description", "What version are you seeing the problem on?", "Reproduced in studio",
        "How to reproduce the bug", "Error messages and logs", "Environment", "More info"]


def patch_text(subject: str, bug: str, repro: str, paragraphs: list[str]) -> str:
    return (f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
            f"From: someone <someone@example.invalid>\nSubject: [PATCH] {subject}\n\n"
            + "\n\n".join(paragraphs) + f"\n\nBug: {bug}\nX-Repro: {repro}\n{FIELDS}")


def cell(cell_id: str, lightning: str, verdicts: dict[str, str]) -> dict:
    return {"cell": {"package": "pytorch-lightning", "lightning": lightning, "torch": "2.13.0",
                     "declared": ">=2.1.0", "included": None, "index": 0, "id": cell_id},
            "seconds": 10.0, "torch_installed": "2.13.0+cpu", "lightning_installed": lightning,
            "results": {name: {"verdict": text.split(":")[0], "reason": text,
                               "record": {"details": {"summary": text.split(": ", 1)[-1]},
                                          "versions": {"python": "3.11.7"}}}
                        for name, text in verdicts.items()}}


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A series (one patch for issue 111, one without an issue), questions, recorded runs."""
    folder = tmp_path / "patches"
    folder.mkdir()
    (folder / "fix-rewrap.patch").write_text(patch_text(
        "rewrap the model", "https://github.com/Lightning-AI/pytorch-lightning/issues/111",
        "repro/backbone_finetuning_ddp.py", [CAUSE, FIX, ALTERNATIVES]))
    (folder / "fix-resume.patch").write_text(patch_text(
        "keep the backbone trainable after resuming", "none", "repro/finetuning_resume.py",
        ["Resuming leaves the backbone frozen.", "Unfreeze it in on_load_checkpoint."]))
    (folder / "series").write_text("fix-rewrap.patch\nfix-resume.patch\n")
    (folder / "questions.toml").write_text('"111" = ["Do you resume?", "Which strategy?"]\n')
    monkeypatch.setattr(patches, "PATCHES", folder)
    monkeypatch.setattr(results, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(findings, "DATA", tmp_path / "findings")
    monkeypatch.setattr(findings, "OUTPUT", tmp_path / "FINDINGS.md")
    runs = tmp_path / "runs"
    run = runs / "repro" / "20261130-063451"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps([
        cell("pl2_6_6_torch2_13_0", "2.6.6", {"20340": "bad: epoch 3 backbone.weight",
                                              "20340-control": "good: in sync",
                                              "finetuning-resume": "bad: backbone frozen"}),
        cell("pl2_0_0_torch2_0_0", "2.0.0", {"20340": "bad: epoch 3 backbone.weight",
                                             "finetuning-resume": "good: backbone trains"}),
        cell("pl1_9_5_torch2_0_0", "1.9.5", {"finetuning-resume": "bad: backbone frozen"})]))
    bisect = runs / "bisect" / "20261130-054212"
    bisect.mkdir(parents=True)
    (bisect / "report.json").write_text(json.dumps({"status": "no-good", "argv": ["--oldest", "1.9.5"]}))
    (bisect / "report.md").write_text("## Bisect result\n\n**Bad in every release tested** (2.6.6 to 1.9.5)."
                                      "\n\nReproduce the bisect:\n\n```\nnox -s bisect\n```\n")
    assert findings.main(["--record", f"repro={run}", "--record", f"bisect={bisect}"]) == 0
    gitconfig = tmp_path / "gitconfig"  # who opens the PR: the user's git identity, this one
    gitconfig.write_text("[user]\n\tname = Ada Tester\n\temail = ada@example.org\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(gitconfig))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    return tmp_path


def comment_dir(tmp_path):
    return tmp_path / "results" / "pr" / "comments"


def test_the_issue_comment_quotes_the_recorded_runs_the_cause_the_fix_and_the_questions(workspace, capsys):
    assert pr_bundle.main([]) == 0
    assert sorted(p.name for p in comment_dir(workspace).iterdir()) == [
        "issue-111.md", "new-issue-fix-resume.md"]
    text = (comment_dir(workspace) / "issue-111.md").read_text()
    # the matrix rows of the patch's repros (the cells that ran them), as FINDINGS.md has them
    rows = [line for line in text.splitlines() if line.startswith("| pl")]
    assert rows == ["| pl2_6_6_torch2_13_0 | pytorch-lightning 2.6.6 | 2.13.0+cpu (>=2.1.0) | "
                    "bad: epoch 3 backbone.weight | good: in sync | 10 |",
                    "| pl2_0_0_torch2_0_0 | pytorch-lightning 2.0.0 | 2.13.0+cpu (>=2.1.0) | "
                    "bad: epoch 3 backbone.weight |  | 10 |",
                    "| pl1_9_5_torch2_0_0 | pytorch-lightning 1.9.5 | 2.13.0+cpu (>=2.1.0) |  |  | 10 |"]
    rendered = (workspace / "FINDINGS.md").read_text()
    answer = "**Bad in every release tested** (2.6.6 to 1.9.5)."
    assert answer in text and answer in rendered
    assert "_Run 2026-11-30 05:42:12" in text  # with its provenance
    assert "**Cause.** The cause, in a paragraph wrapped over two lines." in text
    assert "**Fix.** The fix, in the second paragraph." in text
    assert "Alternatives considered: a learning rate of 0 instead of freezing." in text
    assert text.rstrip().endswith("### Questions\n\n1. Do you resume?\n2. Which strategy?")
    assert "comments:" in capsys.readouterr().out


def test_the_comment_follows_the_recorded_data(workspace):
    assert pr_bundle.main([]) == 0
    before = (comment_dir(workspace) / "issue-111.md").read_text()
    path = workspace / "findings" / "repro" / "matrix" / "summary.json"
    cells = json.loads(path.read_text())
    control = cells[0]["results"]["20340-control"]
    control["verdict"], control["record"]["details"]["summary"] = "bad", "out of sync"
    path.write_text(json.dumps(cells))
    assert pr_bundle.main([]) == 0
    after = (comment_dir(workspace) / "issue-111.md").read_text()
    assert "| bad: epoch 3 backbone.weight | bad: out of sync | 10 |" in after
    assert after.replace("bad: out of sync", "good: in sync") == before


def test_a_bug_without_an_issue_gets_a_draft_in_the_bug_report_form(workspace):
    assert pr_bundle.main([]) == 0
    text = (comment_dir(workspace) / "new-issue-fix-resume.md").read_text()
    assert re.findall(r"(?m)^### (.+)$", text) == FORM
    section = dict(re.findall(r"(?ms)^### (.+?)\n\n(.*?)(?=\n### |\Z)", text))
    assert section["Bug description"].strip() == "Resuming leaves the backbone frozen."
    # the releases whose cells were bad for its repro (2.0.0 was good), as the form's choices
    assert section["What version are you seeing the problem on?"].strip() == "v1.x, v2.6"
    assert "python repro/finetuning_resume.py" in section["How to reproduce the bug"]
    assert "| pl1_9_5_torch2_0_0 | pytorch-lightning 1.9.5 | 2.13.0+cpu (>=2.1.0) | " \
           "bad: backbone frozen | 10 |" \
        in section["Error messages and logs"]
    assert "#- PyTorch Lightning Version: 1.9.5, 2.6.6" in section["Environment"]
    assert "**Fix.** Unfreeze it in on_load_checkpoint." in section["More info"]


def test_handwritten_drafts_are_copied_as_they_are(workspace):
    issues = workspace / "patches" / "issues"
    issues.mkdir()
    plain = "### Bug description\n\nWritten by hand, kept byte for byte.\n"
    (issues / "plain.md").write_text(plain)
    (issues / "with-repro.md").write_text("---\ntitle: a new bug\nrepro: 20340\n---\n\n" + plain)
    (workspace / "patches" / "comments").mkdir()
    review = "**Question 1.** Would restoring before the wrap work?\n"
    (workspace / "patches" / "comments" / "21902.md").write_text(review)
    (workspace / "patches" / "fix-resume.patch").write_text(
        (workspace / "patches" / "fix-resume.patch").read_text().replace("Bug: none",
                                                                         "Bug: patches/issues/plain.md"))
    assert pr_bundle.main([]) == 0
    out = comment_dir(workspace)
    assert sorted(p.name for p in out.iterdir()) == ["comment-21902.md", "issue-111.md", "new-issue-plain.md",
                                                     "new-issue-with-repro.md"]
    assert (out / "new-issue-plain.md").read_text() == plain
    assert (out / "comment-21902.md").read_text() == review
    text = (out / "new-issue-with-repro.md").read_text()
    assert text.startswith(plain + "\n### Recorded runs\n\n")
    assert "| pl2_6_6_torch2_13_0 | pytorch-lightning 2.6.6 | 2.13.0+cpu (>=2.1.0) | " \
           "bad: epoch 3 backbone.weight | good: in sync | 10 |" in text


@pytest.mark.parametrize("case", ["questions-not-toml", "questions-not-a-list", "draft-missing",
                                  "draft-not-utf8", "record-broken"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(workspace, capsys, case):
    folder = workspace / "patches"
    if case == "questions-not-toml":
        (folder / "questions.toml").write_text('"111" = [\n')
        message = "patches/questions.toml: not TOML"
    elif case == "questions-not-a-list":
        (folder / "questions.toml").write_text('"111" = "Do you resume?"\n')
        message = "patches/questions.toml: 111 is not a list of questions"
    elif case == "draft-missing":
        path = folder / "fix-resume.patch"
        path.write_text(path.read_text().replace("Bug: none", "Bug: patches/issues/gone.md"))
        message = "fix-resume.patch: Bug: 'patches/issues/gone.md' is neither a URL, 'none'"
    elif case == "draft-not-utf8":
        (folder / "issues").mkdir()
        (folder / "issues" / "x.md").write_bytes(b"caf\xe9\n")
        message = "issues/x.md: not UTF-8"
    else:
        (workspace / "findings" / "repro" / "matrix" / "summary.json").write_text("[{")
        message = f"{workspace / 'findings' / 'repro' / 'matrix' / 'summary.json'}: not JSON"
    assert pr_bundle.main([]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {message}"), err
    assert not (workspace / "results").exists()


def test_a_patch_that_has_not_validated_writes_no_comment_either(workspace, capsys):
    assert pr_bundle.main(["fix-rewrap.patch"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: fix-rewrap.patch has not validated: run `nox -s patches` first"]
    assert not (workspace / "results").exists()


def test_the_pr_body_keeps_the_alternatives_apart_and_quotes_the_recorded_runs(workspace, monkeypatch):
    monkeypatch.delenv("LIGHTNING_REPO", raising=False)
    (patch,) = patches.named("fix-rewrap.patch")
    rows = [{"patch": patch.name, "cell": c, "ok": True, "applies": "applies", "before": "bad",
             "after": "good", "after_detail": "in sync", "upstream_tests": "1 failed; 2 passed"}
            for c in patch.cells]
    results.write_json(workspace / "results" / "patches" / "1" / "summary.json", rows)
    assert pr_bundle.main(["fix-rewrap.patch"]) == 0
    body = (workspace / "results" / "pr" / "fix-rewrap" / "body.md").read_text()
    changed = body.split("### What changed")[1].split("###")[0]
    assert "The fix, in the second paragraph." in changed and "Alternatives" not in changed
    assert "### Alternatives considered\n\nAlternatives considered: a learning rate of 0 instead" in body
    assert "### Recorded runs on unpatched releases" in body
    assert "| pl2_6_6_torch2_13_0 | pytorch-lightning 2.6.6 | 2.13.0+cpu (>=2.1.0) | " \
           "bad: epoch 3 backbone.weight | good: in sync | 10 |" in body
    assert (comment_dir(workspace) / "issue-111.md").exists()
    patch_file = (workspace / "results" / "pr" / "fix-rewrap" / "fix-rewrap.patch").read_text()
    assert "\nFrom: Ada Tester <ada@example.org>\n" in patch_file and "example.invalid" not in patch_file


def test_no_git_identity_no_pr(workspace, monkeypatch, capsys):
    """The series' author is a placeholder a CLA check refuses: the PR's is the user's, or none."""
    (workspace / "gitconfig").write_text("")
    (patch,) = patches.named("fix-rewrap.patch")
    rows = [{"patch": patch.name, "cell": c, "ok": True, "applies": "applies", "before": "bad",
             "after": "good", "after_detail": "in sync", "upstream_tests": "2 passed"} for c in patch.cells]
    results.write_json(workspace / "results" / "patches" / "1" / "summary.json", rows)
    monkeypatch.setattr(pr_bundle, "ROOT", workspace)  # no repository's own config either
    assert pr_bundle.main(["fix-rewrap.patch"]) == 2
    assert "git has no identity for you" in capsys.readouterr().err
    assert not (workspace / "results" / "pr" / "fix-rewrap").exists()


def test_the_parts_of_a_description(workspace):
    (patch,) = patches.named("fix-rewrap.patch")
    assert comments.parts(patch) == {
        "title": "rewrap the model", "cause": "The cause, in a paragraph wrapped over two lines.",
        "change": ["The fix, in the second paragraph."],
        "alternatives": ["Alternatives considered: a learning rate of 0 instead of freezing."]}


GPU_TEST = """diff --git a/tests/tests_pytorch/test_m.py b/tests/tests_pytorch/test_m.py
--- a/tests/tests_pytorch/test_m.py
+++ b/tests/tests_pytorch/test_m.py
@@ -10,1 +10,9 @@
 line 10
+@RunIf(min_cuda_gpus=2, standalone=True)
+def test_on_two_gpus():
+    pass
+
+
+@RunIf(standalone=True)
+def test_on_cpu():
+    pass
"""


def validated(workspace, patch):
    rows = [{"patch": patch.name, "cell": c, "ok": True, "applies": "applies", "before": "bad",
             "after": "bad", "after_detail": "explained", "upstream_tests": "1 failed; 2 passed"}
            for c in patch.cells]
    results.write_json(workspace / "results" / "patches" / "1" / "summary.json", rows)


def test_a_patch_that_does_not_close_its_issue_is_related_and_its_gpu_tests_are_not_run_here(
        workspace, monkeypatch):
    monkeypatch.delenv("LIGHTNING_REPO", raising=False)
    path = workspace / "patches" / "fix-rewrap.patch"
    path.write_text(path.read_text().replace("X-Expect-After: good\n", "X-Expect-After: good\n"
                                             "X-Relation: related\n") + GPU_TEST)
    (patch,) = patches.named("fix-rewrap.patch")
    validated(workspace, patch)
    assert pr_bundle.main(["fix-rewrap.patch"]) == 0
    body = (workspace / "results" / "pr" / "fix-rewrap" / "body.md").read_text()
    assert body.startswith("## What does this PR do?\n\nRelated to #111\n") and "Fixes #" not in body
    assert ("### Not run here\n\n- `tests/tests_pytorch/test_m.py::test_on_two_gpus`: needs 2 CUDA GPUs\n"
            in body)
    assert "test_on_cpu" not in body
    assert "<details><summary>Evidence" in body  # the evidence is folded away under the template


def test_an_unknown_relation_is_refused_in_one_line(workspace, capsys):
    path = workspace / "patches" / "fix-rewrap.patch"
    path.write_text(path.read_text().replace("X-Expect-After: good\n",
                                             "X-Expect-After: good\nX-Relation: closes\n"))
    assert pr_bundle.main(["fix-rewrap.patch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: fix-rewrap.patch: X-Relation: 'closes' is not one of fixes, related"), err


CHANGELOG_ENTRY = """diff --git a/src/lightning/fabric/CHANGELOG.md b/src/lightning/fabric/CHANGELOG.md
--- a/src/lightning/fabric/CHANGELOG.md
+++ b/src/lightning/fabric/CHANGELOG.md
@@ -10,1 +10,3 @@
 line 10
+- Fixed it ([#PR](https://github.com/Lightning-AI/pytorch-lightning/pull/PR))
+
"""


def test_a_pending_changelog_link_gets_the_prs_number(workspace, monkeypatch, capsys):
    """An entry whose issue or PR does not exist yet links `#PR`; `--number N` puts the PR's number in."""
    monkeypatch.delenv("LIGHTNING_REPO", raising=False)
    path = workspace / "patches" / "fix-rewrap.patch"
    path.write_text(path.read_text() + CHANGELOG_ENTRY)
    (patch,) = patches.named("fix-rewrap.patch")
    validated(workspace, patch)
    out = workspace / "results" / "pr" / "fix-rewrap"
    assert pr_bundle.main(["fix-rewrap.patch"]) == 0
    body = (out / "body.md").read_text()
    assert f"### CHANGELOG\n\n- Fixed it {gates.PENDING}\n" in body
    # what to do next is for the user, not for the PR's body
    assert "`nox -s pr -- fix-rewrap.patch --number <its number>`" in capsys.readouterr().out
    assert "--number" not in body
    assert pr_bundle.main(["fix-rewrap.patch", "--number", "21999"]) == 0
    body, text = (out / "body.md").read_text(), (out / "fix-rewrap.patch").read_text()
    link = "([#21999](https://github.com/Lightning-AI/pytorch-lightning/pull/21999))"
    assert f"- Fixed it {link}" in body and "--number <its number>" not in body
    assert f"+- Fixed it {link}\n" in text and "#PR" not in text
    assert pr_bundle.main(["fix-rewrap.patch", "--number", "0"]) == 2
    capsys.readouterr()
    path.write_text(path.read_text().replace(CHANGELOG_ENTRY, ""))
    assert pr_bundle.main(["fix-rewrap.patch", "--number", "21999"]) == 2  # nothing pending there
    assert capsys.readouterr().err == (
        "error: --number: fix-rewrap.patch has no pending CHANGELOG link (#PR) to fill in\n")


def test_the_pr_body_says_where_the_change_stands_beside_the_related_open_prs(workspace):
    (patch,) = patches.named("fix-rewrap.patch")
    rows = [{"patch": patch.name, "cell": c, "ok": True, "applies": "applies", "before": "bad",
             "after": "good", "after_detail": "in sync", "upstream_tests": "2 passed"} for c in patch.cells]
    prs = [{"number": 12, "title": "Rework the wrapper", "touches": ["src/x.py"], "names_issue": True,
            "applies": "conflicts in src/x.py"},
           {"number": 13, "title": "Other", "touches": ["src/x.py"], "names_issue": False,
            "applies": "applies"},
           {"number": 14, "title": "Old", "touches": ["src/x.py"], "names_issue": False,
            "applies": "the PR no longer merges into master"}]
    text = pr_bundle.body(patch, rows, None, prs, "0123456789abcdef")
    section = text.split("### Related open work\n\n")[1].split("\n###")[0]
    assert section.startswith("Unmerged PRs that change the same files or name the issue (checked against "
                              "master `0123456789`): #12 name its issue; it applies on top of #13; it "
                              "conflicts with #12 (conflicts in src/x.py); no longer merging into master: "
                              "#14.")
    assert "- #12 (Rework the wrapper) names the issue: conflicts in src/x.py" in section
    assert "### Related open work" not in pr_bundle.body(patch, rows, None, [], "0123456789abcdef")


def test_the_pr_lists_the_claims_and_their_evidence(workspace, monkeypatch, capsys):
    monkeypatch.delenv("LIGHTNING_REPO", raising=False)
    (workspace / "patches" / "claims.toml").write_text(
        '[["fix-rewrap.patch"]]\nsays = "The fix, in the second paragraph."\n'
        'test = "tests/tests_pytorch/test_x.py::test_fix"\n')
    (patch,) = patches.named("fix-rewrap.patch")
    rows = [{"patch": patch.name, "cell": c, "ok": True, "applies": "applies", "before": "bad",
             "after": "good", "after_detail": "in sync", "upstream_tests": "2 passed"} for c in patch.cells]
    results.write_json(workspace / "results" / "patches" / "1" / "summary.json", rows)
    assert pr_bundle.main(["fix-rewrap.patch"]) == 0
    item = '- "The fix, in the second paragraph.": test `tests/tests_pytorch/test_x.py::test_fix`'
    assert f"claims of fix-rewrap.patch and their evidence (1, checked by `nox -s patches`):\n{item}\n" \
        in capsys.readouterr().out
    body = (workspace / "results" / "pr" / "fix-rewrap" / "body.md").read_text()
    assert "<details><summary>Claims and their evidence</summary>" in body and item in body
