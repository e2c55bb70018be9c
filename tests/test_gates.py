"""Lightning's static gates (tools/series/gates.py) on small synthetic trees, and mypy on a real Lightning
checkout when LIGHTNING_REPO is set. mypy and ruff run for real at the versions the trees pin."""

import difflib
import os
import shutil
from pathlib import Path

import pytest

from tools.core import contract
from tools.series import gates, patched, patches
from tools.stages import gitrange

MYPY = "1.20.0"
RUFF = "0.15.9"
PYPROJECT = """\
[tool.mypy]
files = ["src/pkg"]
install_types = "True"
non_interactive = "True"
disallow_untyped_defs = "True"
show_error_codes = "True"

[tool.ruff]
line-length = 100

[tool.ruff.lint]
select = ["E", "F", "I"]
"""
PRE_COMMIT = f"""\
repos:
  - repo: https://github.com/astral-sh/ruff-pre-commit
    rev: v{RUFF}
    hooks:
      - id: ruff
      - id: ruff-format
"""
MODULE = '''\
"""A module."""


def half(x: int) -> int:
    return x // 2


WRONG: int = "text"
'''
HEADER = """\
# Copyright The Lightning AI team.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
"""


def tree(path: Path, files: dict[str, str], pre_commit: bool = True) -> Path:
    """A source tree: the pinned tools, their configuration, and ``files``."""
    base = {"pyproject.toml": PYPROJECT, "requirements/typing.txt": f"torch==2.9.1\nmypy=={MYPY}\n",
            "src/pkg/__init__.py": ""}
    if pre_commit:
        base[".pre-commit-config.yaml"] = PRE_COMMIT
    for rel, text in {**base, **files}.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    return path


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory):
    """One mypy environment (cached across runs) and one mypy cache for the module's tests."""
    gates.mypy_env(tree(tmp_path_factory.mktemp("env"), {}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gates, "MYPY_CACHE", tmp_path_factory.mktemp("mypy-cache"))
        yield


# -- types ------------------------------------------------------------------------------------

def test_types_pass_when_a_known_error_only_moves(tmp_path, mypy_cache):
    before = tree(tmp_path / "before", {"src/pkg/mod.py": MODULE})
    moved = MODULE.replace("def half", "def double(x: int) -> int:\n    return 2 * x\n\n\ndef half")
    after = tree(tmp_path / "after", {"src/pkg/mod.py": moved})
    gate = gates.typecheck(before, after, ["src/pkg/mod.py"], log=lambda _: None)
    assert gate.ok, gate.text
    assert gate.text == f"mypy {MYPY}: no new errors (baseline 1)"
    assert "src/pkg/mod.py:12: error:" in gate.details  # line 8 before: moved, not new


def test_types_fail_on_a_new_error(tmp_path, mypy_cache):
    before = tree(tmp_path / "before", {"src/pkg/mod.py": MODULE})
    bad = MODULE + "\n\ndef name() -> str:\n    return half(3)\n"
    after = tree(tmp_path / "after", {"src/pkg/mod.py": bad})
    gate = gates.typecheck(before, after, ["src/pkg/mod.py"], log=lambda _: None)
    assert not gate.ok
    assert gate.text.startswith(f"mypy {MYPY}: 1 new error: mod.py: Incompatible return value type")
    assert gate.text.endswith("[return-value]")
    assert "src/pkg/mod.py:12: error: Incompatible return value type" in gate.details


def test_types_follow_imports_into_the_trees_own_sources(tmp_path, mypy_cache):
    # only the imported module differs: the package must resolve to each tree's src
    mod = "from pkg.util import value\n\nX: int = value()\n"
    before = tree(tmp_path / "before", {"src/pkg/mod.py": mod, "src/pkg/util.py": "def value() -> int:\n"
                                        "    return 1\n"})
    after = tree(tmp_path / "after", {"src/pkg/mod.py": mod, "src/pkg/util.py": "def value() -> str:\n"
                                      "    return ''\n"})
    assert gates.typecheck(before, before, ["src/pkg/mod.py"], log=lambda _: None).ok
    gate = gates.typecheck(before, after, ["src/pkg/mod.py"], log=lambda _: None)
    assert not gate.ok and "[assignment]" in gate.text, gate.text


def test_types_skip_files_outside_src():
    gate = gates.typecheck(Path("/nonexistent"), Path("/nonexistent"), ["tests/test_x.py", "CHANGELOG.md"])
    assert gate.ok and gate.text == "no Python file under src/ changed"


def test_the_mypy_environment_takes_the_trees_pins_but_the_test_torch(tmp_path):
    t = tree(tmp_path, {"requirements/typing.txt": f"torch==2.9.1\nmypy=={MYPY}\n\ntypes-PyYAML  # stubs\n",
                        "requirements/pytorch/base.txt": "# note\ntorch >=2.1.0, <2.10.0\ntqdm >=4.57.0\n"})
    version, args = gates.mypy_env_args(t)
    assert version == MYPY
    assert args == [f"torch=={gates.TORCH}", "tqdm>=4.57.0", f"mypy=={MYPY}", "types-PyYAML"]


@pytest.mark.parametrize("typing", ["mypy>=1.0\n", "types-PyYAML\n", None])
def test_a_tree_without_a_mypy_pin_is_bad_input(tmp_path, typing):
    t = tree(tmp_path, {})
    if typing is None:
        (t / "requirements" / "typing.txt").unlink()
    else:
        (t / "requirements" / "typing.txt").write_text(typing)
    with pytest.raises(gates.GateError, match="mypy") as err:
        gates.typecheck(t, t, ["src/pkg/__init__.py"])
    assert isinstance(err.value, contract.BadInput) and "\n" not in str(err.value)


# -- lint -------------------------------------------------------------------------------------

CLEAN = '"""A module."""\n\nimport os\n\n\ndef where() -> str:\n    return os.getcwd()\n'


@pytest.mark.parametrize(("after", "expected"), [
    (CLEAN.replace("import os\n", "import os\nimport sys\n"), "1 new finding: mod.py: F401"),
    (CLEAN.replace("import os\n", "import sys\nimport os\n").replace("getcwd()", "getcwd() + sys.prefix"),
     "1 new finding: mod.py: I001"),  # the tree's config selects isort's rule
    (CLEAN.replace("return os.getcwd()", "return os.getcwd( )"), "not ruff-formatted: mod.py"),
])
def test_lint_fails_on_a_new_finding(tmp_path, after, expected):
    before = tree(tmp_path / "before", {"src/pkg/mod.py": CLEAN})
    patched = tree(tmp_path / "after", {"src/pkg/mod.py": after})
    gate = gates.lint(patched, ["src/pkg/mod.py"], log=lambda _: None, before=before)
    assert not gate.ok
    assert gate.text.startswith(f"ruff {RUFF}: {expected}"), gate.text


def test_lint_passes_when_a_known_finding_only_moves(tmp_path):
    old = CLEAN.replace("import os\n", "import os\nimport sys\n")  # F401 on master already
    before = tree(tmp_path / "before", {"tests/test_mod.py": old})
    grown = old + "\n\ndef test_it() -> None:\n    assert where()\n"
    after = tree(tmp_path / "after", {"tests/test_mod.py": grown})
    gate = gates.lint(after, ["tests/test_mod.py"], log=lambda _: None, before=before)
    assert gate.ok and gate.text == f"ruff {RUFF}: no new findings (baseline 1)", gate.text
    without_baseline = gates.lint(after, ["tests/test_mod.py"], log=lambda _: None)
    assert not without_baseline.ok and "F401" in without_baseline.text


def test_lint_without_a_pin_uses_the_newest_ruff_and_says_so(tmp_path):
    after = tree(tmp_path, {"src/pkg/mod.py": CLEAN}, pre_commit=False)
    gate = gates.lint(after, ["src/pkg/mod.py", "docs/conf.py"], log=lambda _: None)
    assert gate.ok and "(the newest: the tree pins no ruff): no new findings" in gate.text, gate.text


def test_lint_ignores_files_outside_src_and_tests(tmp_path):
    gate = gates.lint(tree(tmp_path, {}), ["docs/conf.py", "src/lightning/pytorch/CHANGELOG.md"])
    assert gate.ok and gate.text == "no Python file under src/ or tests/ changed"


# -- license headers --------------------------------------------------------------------------

def test_license_headers(tmp_path):
    t = tree(tmp_path, {"tests/test_a.py": HEADER + "import os\n", "tests/test_b.py": "import os\n",
                        "tests/__init__.py": "", "src/pkg/data.json": "{}",
                        "tests/test_c.py": "# Copyright The Lightning AI team.\nimport os\n"})
    ok = gates.license_headers(t, ["tests/test_a.py", "tests/__init__.py", "src/pkg/data.json"])
    assert ok.ok and ok.text == "2 new files: header present"
    bad = gates.license_headers(t, ["tests/test_a.py", "tests/test_b.py", "tests/test_c.py"])
    assert not bad.ok and bad.text == "no Apache header in test_b.py, test_c.py"
    assert gates.license_headers(t, []).text == "no new Python file"


# -- changelog --------------------------------------------------------------------------------

CHANGELOG = """\
# Changelog

---

## [unreleased] - YYYY-MM-DD

### Added

- Added `x` to `Trainer` ([#1](https://github.com/Lightning-AI/pytorch-lightning/pull/1))

### Changed

-

### Fixed

- Fixed y ([#2](https://github.com/Lightning-AI/pytorch-lightning/issues/2))

---

## [2.6.4] - 2026-05-20

### Fixed

- Fixed z ([#3](https://github.com/Lightning-AI/pytorch-lightning/pull/3))
"""
CODE = '''\
class DDPStrategy:
    def __init__(self, timeout: int = 1) -> None:
        self.timeout = timeout

    def reduce(self, value: int) -> int:
        return value
'''
LOG = "src/lightning/pytorch/CHANGELOG.md"
SRC = "src/lightning/pytorch/strategies/ddp.py"
LINK = "([#20340](https://github.com/Lightning-AI/pytorch-lightning/issues/20340))"
FIX = f"- Fixed DDP replicas diverging {LINK}\n\n"
ADD = f"- Added `check` to `DDPStrategy` {LINK}\n\n"
BODY = CODE.replace("return value", "return value + 0")
OPTION = CODE.replace("timeout: int = 1)", "timeout: int = 1, check: bool = True)")


def under(section: str, entry: str, log: str = CHANGELOG) -> str:
    """``log`` with ``entry`` first in the unreleased ``section``."""
    return log.replace(f"### {section}\n\n", f"### {section}\n\n{entry}", 1)


def changed(tmp_path, after: dict[str, str], bug: str = "https://github.com/x/y/issues/20340",
            **headers) -> tuple[patches.Patch, Path]:
    """A Lightning patch turning the base tree into ``after``, and the patched tree."""
    base = {LOG: CHANGELOG, SRC: CODE}
    diff = ""
    for rel, text in after.items():
        old = base.get(rel)
        diff += f"diff --git a/{rel} b/{rel}\n" + "".join(difflib.unified_diff(
            (old or "").splitlines(keepends=True), text.splitlines(keepends=True),
            "/dev/null" if old is None else f"a/{rel}", f"b/{rel}", n=1))
    patched = tree(tmp_path / "after", {**base, **after})
    patch = patches.Patch(tmp_path / "x.patch", {"X-Target": "lightning", "Bug": bug, **headers}, diff,
                          list(after))
    return patch, patched


@pytest.mark.parametrize("after", [
    {SRC: BODY, LOG: under("Fixed", FIX)},
    {SRC: OPTION, LOG: under("Fixed", FIX, under("Added", ADD))},  # the usual Added + Fixed pair
    {SRC: OPTION.replace("check: bool", "_check: bool"), LOG: under("Fixed", FIX)},  # private
    {SRC: CODE + "\n    @override\n    def setup(self, stage: str) -> None:\n        pass\n",
     LOG: under("Fixed", FIX)},  # implements an existing hook
], ids=["fix", "option-and-fix", "private-option", "override"])
def test_changelog_passes(tmp_path, after):
    gate = gates.changelog(*changed(tmp_path, after))
    assert gate.ok, gate.details


@pytest.mark.parametrize(("after", "headers", "expected"), [
    ({SRC: BODY}, {}, f"no entry in {LOG}"),
    ({"tests/test_x.py": "def test_x():\n    pass\n"}, {}, "no CHANGELOG entry"),
    ({SRC: BODY, LOG: under("Added", FIX)}, {}, "under Added, expected Fixed"),
    ({SRC: OPTION, LOG: under("Fixed", FIX)}, {}, "no Added entry (the patch adds public API: "
                                                   "DDPStrategy.__init__(check))"),
    ({SRC: BODY + "\n\ndef helper() -> None:\n    pass\n", LOG: under("Fixed", FIX)}, {}, "no Added entry"),
    ({SRC: BODY, LOG: CHANGELOG.replace("### Fixed\n\n- Fixed z", f"### Fixed\n\n{FIX}- Fixed z")}, {},
     "not under the unreleased heading (under '## [2.6.4] - 2026-05-20')"),
    ({SRC: BODY, LOG: under("Fixed", FIX.replace(LINK, "(#20340)"))}, {}, "does not end with the link"),
    ({SRC: BODY, LOG: under("Fixed", FIX.replace("/issues/20340", "/issues/20341"))}, {},
     "link text #20340 and its target 20341 differ"),
    ({SRC: BODY, LOG: under("Fixed", FIX.rstrip("\n") + "\n")}, {}, "not separated from its neighbours"),
    ({SRC: BODY, LOG: under("Fixed", "Fixed it\n\n")}, {}, "not a '- ' bullet"),
    ({SRC: BODY, LOG: under("Changed", FIX)}, {"X-Changelog": "Changed"},
     "still has the bare '-' placeholder"),
], ids=["none-for-src", "none-at-all", "fix-under-added", "option-only-fixed", "new-function",
        "released", "no-link", "link-mismatch", "no-blank-line", "no-bullet", "placeholder"])
def test_changelog_fails(tmp_path, after, headers, expected):
    gate = gates.changelog(*changed(tmp_path, after, **headers))
    assert not gate.ok
    assert expected in gate.details, gate.details
    assert "\n" not in gate.text


def test_changelog_section_can_be_declared(tmp_path):
    replaced = CHANGELOG.replace("### Changed\n\n-\n", f"### Changed\n\n{FIX.rstrip()}\n")
    patch, after = changed(tmp_path, {SRC: BODY, LOG: replaced}, **{"X-Changelog": "Changed"})
    assert gates.changelog(patch, after).ok
    patch, after = changed(tmp_path, {SRC: BODY, LOG: replaced}, bug="no issue")
    assert "under Changed, expected Fixed" not in gates.changelog(patch, after).details  # no Bug issue
    patch, after = changed(tmp_path, {SRC: BODY, LOG: replaced})
    assert "under Changed, expected Fixed" in gates.changelog(patch, after).details


def test_changelog_of_a_torch_patch_and_a_bad_declaration(tmp_path):
    patch, after = changed(tmp_path, {SRC: BODY, LOG: under("Fixed", FIX)}, **{"X-Changelog": "Fixes"})
    with pytest.raises(gates.GateError, match="X-Changelog: 'Fixes' is not one of Added, Changed"):
        gates.changelog(patch, after)
    patch.headers["X-Target"] = "torch"
    assert gates.changelog(patch, after) == gates.Gate("changelog", True, "not checked: a torch patch")


# -- a real Lightning checkout ----------------------------------------------------------------

REPO = os.environ.get("LIGHTNING_REPO")
TYPE_ERROR = "\n\ndef _gate_probe() -> int:\n    return str(DDPStrategy)\n"


@pytest.mark.skipif(not REPO, reason="set LIGHTNING_REPO to a Lightning git checkout")
def test_types_on_lightning_master(tmp_path):
    repo = gitrange.open_repo(REPO, patched.CACHE / "repos")
    wt = gitrange.Worktree(repo, tmp_path / "wt", sparse=("src", "requirements"))
    try:
        wt.git.sparse_checkout("add", "/pyproject.toml")
        master = wt.checkout(gitrange.resolve(repo, "master"))
        after = Path(shutil.copytree(master, tmp_path / "after", ignore=shutil.ignore_patterns(".git")))
        with open(after / "src/lightning/pytorch/strategies/ddp.py", "a") as f:
            f.write(TYPE_ERROR)
        files = ["src/lightning/pytorch/strategies/ddp.py"]
        same = gates.typecheck(master, master, files, log=lambda _: None)
        assert same.ok and same.text.startswith("mypy ") and "no new errors" in same.text, same.text
        gate = gates.typecheck(master, after, files, log=lambda _: None)
        assert not gate.ok
        assert ": 1 new error: ddp.py: Incompatible return value type" in gate.text, gate.text
    finally:
        repo.git.worktree("remove", "--force", str(tmp_path / "wt"))


def test_changelog_link_can_wait_for_the_prs_number(tmp_path):
    """No issue or PR exists yet: the entry links the PR's own number, `#PR`, until it is opened."""
    entry = FIX.replace(LINK, gates.PENDING)
    gate = gates.changelog(*changed(tmp_path, {SRC: BODY, LOG: under("Fixed", entry)}))
    assert gate.ok, gate.details
    assert gate.text == "1 Fixed entry under unreleased; its link waits for the PR's number"
    pending = gates.PENDING.replace("/pull/PR", "/pull/1")  # a half-filled link is no link
    gate = gates.changelog(*changed(tmp_path, {SRC: BODY, LOG: under("Fixed", FIX.replace(LINK, pending))}))
    assert not gate.ok and "does not end with the link" in gate.details
