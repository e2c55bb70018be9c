"""The gate "claims" (``tools/series/claims.py``): every claim of a description names its evidence, and
the evidence holds."""

import re

import git
import pytest

from tools.series import claims, patches

DESCRIPTION = "Fix the wrapper.\n\nThe hooks are kept\nacross the re-wrap, and the old check is gone."
TEST = "tests/test_x.py::test_hooks_kept"


def gate(entries, added=(TEST,), outcomes=({TEST: "passed"},), tree=None, torch_root=None, repo=None):
    return claims.gate("p.patch", DESCRIPTION, entries, set(added), list(outcomes), tree, torch_root, repo)


def test_a_claim_backed_by_a_test_the_patch_adds_and_that_passed():
    entry = {"says": "The hooks are kept across the re-wrap", "test": TEST}
    assert gate([entry])["ok"]
    assert gate([entry], outcomes=[{f"{TEST}[a]": "passed", f"{TEST}[b]": "passed"}])["ok"]
    failed = gate([entry], outcomes=[{f"{TEST}[a]": "passed", f"{TEST}[b]": "failed"}])
    assert not failed["ok"] and failed["text"].endswith(f"{TEST} did not pass with the patch")
    # passed in one run of the flaky gate (where a standalone test runs), skipped in the other
    assert gate([entry], outcomes=[{TEST: "skipped"}, {TEST: "passed"}])["ok"]
    assert "is no test the patch adds" in gate([entry], added=[])["text"]


def test_a_claim_whose_words_left_the_description_fails():
    out = gate([{"says": "the hooks are dropped", "test": TEST}])
    assert not out["ok"] and "its words are no longer in the description" in out["text"]


def test_a_cited_line_must_hold_its_quote(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("a = 1\nif backend == 'nccl':\n")
    torch_root = tmp_path / "site"
    (torch_root / "torch").mkdir(parents=True)
    (torch_root / "torch" / "d.py").write_text("ref = weakref.ref(self)\n")
    says = "the old check is gone"
    ok = [{"says": says, "line": "src/m.py:2", "quote": "== 'nccl'"},
          {"says": says, "line": "torch/d.py:1", "quote": "weakref.ref"}]
    assert gate(ok, tree=tmp_path, torch_root=torch_root)["text"].startswith(
        "2 claims, each backed (0 by tests, 2 by cited lines")
    wrong = gate([{"says": says, "line": "src/m.py:1", "quote": "nccl"},
                  {"says": says, "line": "src/gone.py:1", "quote": "x"},
                  {"says": says, "line": "src/m.py:99", "quote": "x"}], tree=tmp_path)
    assert wrong["text"].startswith("3 of 3 claims not backed")
    assert [c["fails"] for c in wrong["details"]["claims"]] == [
        "src/m.py:1 does not hold 'nccl'", "src/gone.py: no such file at master",
        "src/m.py:99 does not hold 'x'"]


def test_a_recorded_run_and_a_commit_that_adds_the_quote(tmp_path):
    (tmp_path / "findings" / "bisect" / "x").mkdir(parents=True)
    (tmp_path / "findings" / "bisect" / "x" / "record.json").write_text("{}")
    says = "the old check is gone"
    assert claims.check({"says": says, "run": "findings/bisect/x"}, DESCRIPTION, set(), [], tmp_path, None,
                        root=tmp_path) is None
    assert claims.check({"says": says, "run": "findings/bisect/y"}, DESCRIPTION, set(), [], tmp_path, None,
                        root=tmp_path) == "no recorded run findings/bisect/y"
    repo = git.Repo.init(tmp_path / "r")
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    (tmp_path / "r" / "f.py").write_text("if torch.equal(p, q):\n")
    repo.git.add("-A")
    repo.git.commit("-q", "-m", "compare by value")
    sha = repo.head.commit.hexsha[:10]
    assert gate([{"says": says, "commit": sha, "quote": "torch.equal(p, q)"}], repo=repo)["ok"]
    assert "adds no line holding 'p is q'" in gate([{"says": says, "commit": sha, "quote": "p is q"}],
                                                   repo=repo)["text"]
    assert "no commit 0123456789 in the checkout" in gate(
        [{"says": says, "commit": "0123456789", "quote": "x"}], repo=repo)["text"]


def test_a_patch_with_no_claim_listed_fails():
    out = gate([])
    assert not out["ok"] and out["text"] == "no claim of p.patch is listed in patches/claims.toml"


@pytest.mark.parametrize("text, message", [
    ("[[\"p.patch\"]]\nsays = 'x'\n", "p.patch claim 1 needs `says` and one of test, line, run, commit"),
    ("[[\"p.patch\"]]\nsays = 'x'\ntest = 'a'\nrun = 'b'\n", "needs `says` and one of"),
    ("[[\"p.patch\"]]\nsays = 'x'\nline = 'a.py'\nquote = 'q'\n", "`line` is path:N"),
    ("[[\"p.patch\"]]\nsays = 'x'\nline = 'a.py:3'\n", "`line` needs a `quote`"),
    ("\"p.patch\" = 3\n", "p.patch is not a list of claims"),
    ("[[x\n", "not TOML"),
])
def test_a_malformed_claims_file_is_bad_input_in_one_line(tmp_path, text, message):
    (tmp_path / "claims.toml").write_text(text)
    with pytest.raises(claims.BadInput, match=re.escape(message)):
        claims.load(tmp_path / "claims.toml")


def test_the_series_claims_quote_their_descriptions_and_name_tests_the_patches_add():
    """Without a checkout: what can be checked of patches/claims.toml against the patch files."""
    listed = claims.load()
    series = {p.name: p for p in patches.series()}
    assert set(listed) <= set(series), set(listed) - set(series)
    for patch in series.values():
        if patch.target != "lightning":
            continue
        assert listed.get(patch.name), f"{patch.name} has no claim listed"
        # the test functions whose def line the patch adds (module level: path::name)
        tests = {f"{path}::{name}" for path, section in patch.test_changes().items()
                 for name in re.findall(r"(?m)^\+def (test\w+)", section)}
        for c in listed[patch.name]:
            assert claims.words(c["says"]) in claims.words(patch.headers["Description"]), (patch.name, c)
            assert "test" not in c or c["test"] in tests, (patch.name, c["test"])



def a_patch(tmp_path, source_line: str) -> patches.Patch:
    diff = ("--- a/src/lightning/pytorch/x.py\n+++ b/src/lightning/pytorch/x.py\n@@ -1,1 +1,2 @@\n a = 1\n"
            f"+{source_line}\n--- a/tests/tests_pytorch/test_x.py\n+++ b/tests/tests_pytorch/test_x.py\n"
            "@@ -1,1 +1,2 @@\n a = 1\n+model = DistributedDataParallel(model)\n")
    return patches.Patch(tmp_path / "p.patch", {}, diff, ["src/lightning/pytorch/x.py",
                                                        "tests/tests_pytorch/test_x.py"])


def test_a_patch_that_wraps_again_or_restores_state_shows_what_survives(tmp_path):
    kept = {"says": "The hooks are kept across the re-wrap", "test": TEST, "kept": "the wrapper's hooks"}
    rewrap = a_patch(tmp_path, "        self.configure_ddp()")
    assert claims.stateful(rewrap) == ["configure_ddp("]
    shown = claims.kept_gate(rewrap, gate([kept]))
    assert shown == {"ok": True, "text": f"it adds `configure_ddp(`; kept: the wrapper's hooks (`{TEST}`)"}
    unshown = claims.kept_gate(rewrap, gate([{k: v for k, v in kept.items() if k != "kept"}]))
    assert not unshown["ok"] and "no claim with `kept` backed by a passing test" in unshown["text"]
    failing = claims.kept_gate(rewrap, gate([kept], outcomes=[{TEST: "failed"}]))
    assert not failing["ok"]
    restore = a_patch(tmp_path, "    def on_load_checkpoint(self, checkpoint):")
    assert claims.stateful(restore) == ["def on_load_checkpoint"]
    # a test that makes a DDP wrapper, or a source change that does neither, needs nothing
    assert claims.kept_gate(a_patch(tmp_path, "    return 1"), {})["ok"]


def test_a_cited_line_is_read_at_master_not_in_a_tree_with_the_earlier_patches(tmp_path):
    """The gates' trees carry the series' earlier patches, which move master's lines."""
    repo = git.Repo.init(tmp_path / "r")
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    (tmp_path / "r" / "src").mkdir()
    (tmp_path / "r" / "src" / "m.py").write_text("a = 1\nif backend == 'nccl':\n")
    repo.git.add("-A")
    repo.git.commit("-q", "-m", "master")
    (tmp_path / "r" / "src" / "m.py").write_text("# an earlier patch's line\na = 1\nif backend == 'nccl':\n")
    claim = {"says": "the old check is gone", "line": "src/m.py:2", "quote": "== 'nccl'"}
    assert claims.check(claim, DESCRIPTION, set(), [], tmp_path / "r", None, repo, master="HEAD") is None
    assert claims.check(claim, DESCRIPTION, set(), [], tmp_path / "r", None) == \
        "src/m.py:2 does not hold \"== 'nccl'\""
