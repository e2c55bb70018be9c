"""The bisect engine on fake predicates, and both tiers on small synthetic repositories."""

import json
import math
import sys
import threading
from pathlib import Path

import git
import pytest

from tools import bisect_cli
from tools.environments import envs
from tools.launch import harness, process_group
from tools.stages import bisect, bisect_options, bisect_tiers

OWN = ("--script", "repro/backbone_finetuning_ddp.py")  # the workspace's #20340 repro

FIXTURE = Path(__file__).parent / "fixtures" / "marker_repro.py"


def engine(codes, tmp_path=None, trials=1):
    calls = []

    def test(c):
        calls.append(c)
        code = codes[c]
        return (code(len(calls)) if callable(code) else code), None

    state = bisect.State(tmp_path / "state.json" if tmp_path else None)
    b = bisect.Bisector(list(codes), test, lambda c: f"k|{c}", state, trials, log=lambda m: None)
    return b, calls


def test_finds_the_first_bad_within_log2_steps():
    n = 100
    codes = {f"c{i:03}": (1 if i >= 63 else 0) for i in range(n)}
    b, calls = engine(codes)
    out = b.run(0, n - 1)
    assert (out.status, out.first_bad, out.last_good) == ("found", "c063", "c062")
    assert len(calls) <= math.ceil(math.log2(n)) + 2


def test_skips_are_stepped_around_and_reported_when_they_hide_the_answer():
    codes = {f"c{i}": (125 if i in (4, 5) else 1 if i >= 5 else 0) for i in range(10)}
    out = engine(codes)[0].run(0, 9)
    assert out.status == "ambiguous" and out.skipped_between == ["c4", "c5"] and out.first_bad == "c6"
    codes = {f"c{i}": (125 if i == 3 else 1 if i >= 6 else 0) for i in range(10)}
    out = engine(codes)[0].run(0, 9)
    assert (out.status, out.first_bad) == ("found", "c6")


def test_no_good_release_is_said_honestly():
    codes = {f"r{i}": 1 for i in range(20)}
    b, calls = engine(codes)
    out = b.run(None, 19)
    assert out.status == "no-good" and out.last_good is None
    assert calls == ["r19", "r18", "r17", "r15", "r11", "r3", "r0"]  # doubling distance


def test_search_back_finds_a_good_start():
    codes = {f"r{i}": (1 if i >= 12 else 0) for i in range(20)}
    out = engine(codes)[0].run(None, 19)
    assert (out.status, out.first_bad) == ("found", "r12")


def test_ends_are_verified():
    codes = {"a": 1, "b": 1, "c": 1}
    with pytest.raises(ValueError, match="good end a is not good"):
        engine(codes)[0].run(0, 2)
    with pytest.raises(ValueError, match="bad end c does not show the bug"):
        engine({"a": 0, "b": 0, "c": 0})[0].run(0, 2)


def test_an_end_that_cannot_be_tested_is_no_verdict_on_the_bug():
    # an environment that cannot be made is "could not test", never "not good" / "not bad"
    out = engine({"a": 125, "b": 1, "c": 1})[0].run(0, 2)
    assert out.status == "untestable" and "good end a could not be tested" in out.why
    out = engine({"a": 0, "b": 1, "c": 125})[0].run(0, 2)
    assert out.status == "untestable" and "bad end c could not be tested" in out.why


def test_a_skip_in_the_search_back_tries_its_neighbours_first():
    # r11 cannot be tested: its older neighbour r10 is tried before jumping on to r3
    codes = {f"r{i}": (125 if i == 11 else 1 if i >= 10 else 0) for i in range(20)}
    b, calls = engine(codes)
    out = b.run(None, 19)
    assert calls[:6] == ["r19", "r18", "r17", "r15", "r11", "r10"]
    assert (out.status, out.first_bad, out.last_good) == ("found", "r10", "r9")


def test_never_good_counts_only_what_was_tested():
    # the old releases cannot run here: that is not "bad in every release"
    codes = {f"r{i}": (125 if i < 12 else 1) for i in range(20)}
    out = engine(codes)[0].run(None, 19)
    assert out.status == "untestable"
    tally = out.tally()
    assert tally["good"] == [] and set(tally["bad"]) >= {"r19", "r18", "r17", "r15"}
    assert "r11" in tally["untestable"] and "no good release found among the" in out.why
    assert engine({f"r{i}": 1 for i in range(20)})[0].run(None, 19).status == "no-good"


def test_after_the_search_the_bisect_starts_at_the_nearest_bad():
    codes = {f"r{i}": (1 if i >= 14 else 0) for i in range(20)}
    b, calls = engine(codes)
    out = b.run(None, 19)  # r18, r17, r15 bad, r11 good: between r11 and r15 only
    assert out.first_bad == "r14"
    assert {s.candidate for s in out.steps[5:-1]} <= {"r12", "r13", "r14"}
    assert out.steps[-1].candidate == "r0" and out.non_monotonic == []  # the order check


def test_a_good_release_newer_than_a_bad_one_is_reported():
    # bad in r4..r6, fixed in r7..r9, broken again from r13: the bug comes and goes
    codes = {f"r{i}": (1 if 4 <= i <= 6 or i >= 13 else 0) for i in range(20)}
    b, _ = engine(codes)
    b.verdict("r5")  # the window was seen, e.g. by an earlier probe
    out = b.run(None, 19)
    assert out.first_bad == "r13"
    assert out.non_monotonic and "good at r" in out.non_monotonic[0] and "bad r5" in out.non_monotonic[0]
    # bad in the oldest releases too: the order check after the search sees it on its own
    codes = {f"r{i}": (1 if i <= 2 or i >= 13 else 0) for i in range(20)}
    out = engine(codes)[0].run(None, 19)
    assert out.first_bad == "r13" and out.steps[-1].candidate == "r0"
    assert out.non_monotonic and "bad r0" in out.non_monotonic[0]
    plain = engine({f"r{i}": (1 if i >= 13 else 0) for i in range(20)})[0].run(None, 19)
    assert plain.non_monotonic == []


def test_the_ends_run_every_trial_and_report_their_rate():
    flaky = lambda n: 1 if n % 2 == 0 else 0  # noqa: E731
    codes = {"a": 0, "b": 0, "c": flaky}
    b, calls = engine(codes, trials=4)
    out = b.run(0, 2)
    assert out.ends["bad"] == {"candidate": "c", "bad": 2, "runs": 4}
    assert out.ends["good"] == {"candidate": "a", "bad": 0, "runs": 4}
    assert calls.count("c") == 4  # a bad run at an end does not cut its trials short


def test_harness_failure_stops_the_bisect():
    with pytest.raises(bisect.HarnessFailure):
        engine({"a": 0, "b": 128, "c": 1})[0].run(0, 2)


def test_flaky_bad_needs_trials():
    # c5.. are bad but show it only every third run; with one trial the bisect goes wrong
    flaky = lambda n: 1 if n % 3 == 0 else 0  # noqa: E731
    codes = {f"c{i}": (flaky if i >= 5 else 0) for i in range(10)}
    codes["c9"] = 1
    assert engine(codes)[0].run(0, 9).first_bad != "c5"
    assert bisect.trials_for(1 / 3) == 12
    out = engine(codes, trials=bisect.trials_for(1 / 3))[0].run(0, 9)
    assert out.first_bad == "c5"


def test_resume_repeats_no_step_and_interrupt_records_nothing(tmp_path):
    truth = {f"c{i}": (1 if i >= 7 else 0) for i in range(16)}
    calls = []

    def interrupted_at_third(c):
        calls.append(c)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return truth[c], None

    state = bisect.State(tmp_path / "state.json")
    b = bisect.Bisector(list(truth), interrupted_at_third, lambda c: c, state, log=lambda m: None)
    with pytest.raises(KeyboardInterrupt):
        b.run(0, 15)
    recorded = set(json.loads((tmp_path / "state.json").read_text()))
    assert recorded == set(calls[:2])  # the interrupted step left no verdict
    b, after = engine(truth, tmp_path)
    b.key = lambda c: c
    assert b.run(0, 15).first_bad == "c7"
    assert not set(after) & recorded and calls[2] in after
    b, again = engine(truth, tmp_path)
    b.key = lambda c: c
    assert b.run(0, 15).first_bad == "c7" and again == []


def test_a_fix_bisect_names_the_first_candidate_without_the_bug():
    n = 100
    codes = {f"c{i:03}": (1 if 20 <= i < 71 else 0) for i in range(n)}  # the bug came, then went
    b, calls = engine(codes)
    b.fix = True
    out = b.run(30, n - 1)
    # the engine's "bad" is the new state: fixed; its "good", the old one: the bug is there
    assert (out.status, out.first_bad, out.last_good) == ("found", "c071", "c070")
    assert len(calls) <= math.ceil(math.log2(n)) + 2
    assert out.ends["good"]["bad"] == 1 and out.ends["bad"]["bad"] == 0  # the bug seen at the old end


def test_a_fix_bisect_checks_its_ends_in_its_own_words():
    codes = {f"c{i}": 1 for i in range(10)}  # never fixed
    b, _ = engine(codes)
    b.fix = True
    with pytest.raises(bisect.contract.BadInput, match="the fixed end c9 still shows the bug"):
        b.run(2, 9)
    codes = {f"c{i}": 0 for i in range(10)}  # the bug never shows
    b, _ = engine(codes)
    b.fix = True
    with pytest.raises(bisect.contract.BadInput, match="the end with the bug c2 does not show the bug"):
        b.run(2, 9)


def test_a_fix_bisect_and_a_regression_bisect_share_their_verdicts(tmp_path):
    codes = {f"c{i:02}": (1 if 4 <= i < 12 else 0) for i in range(16)}
    b, first = engine(codes, tmp_path)
    assert b.run(0, 8).first_bad == "c04"  # the regression
    b, second = engine(codes, tmp_path)
    b.fix = True
    out = b.run(8, 15)  # the fix, from the same bad end
    assert out.first_bad == "c12"
    assert "c08" not in second  # the repro's own verdict, cached once, read in the fix's terms
    assert [s.verdict for s in out.steps if s.candidate == "c08"] == ["good"]


def test_parallel_probes_take_log_k_plus_1_rounds_and_run_at_once():
    n = 100
    codes = {f"c{i:03}": (1 if i >= 63 else 0) for i in range(n)}
    # the first round (after the ends, verified alone): three spread evenly over c001..c098;
    # they meet here, so they ran at the same time (one at a time, the barrier breaks: an error)
    together = threading.Barrier(3, timeout=120)

    def test(c):
        calls.append(c)
        if c in ("c025", "c050", "c074"):
            together.wait()
        return codes[c], None

    calls = []
    b = bisect.Bisector(list(codes), test, lambda c: c, bisect.State(None), log=lambda m: None, jobs=3)
    out = b.run(0, n - 1)
    assert (out.status, out.first_bad, out.last_good) == ("found", "c063", "c062")
    assert b.rounds <= math.ceil(math.log(n - 2, 4)) + 1  # 4 here, where one at a time takes 7
    assert len(calls) <= 3 * b.rounds + 2


def test_parallel_probes_search_back_several_distances_a_round():
    codes = {f"r{i:02}": (1 if i >= 12 else 0) for i in range(20)}
    b, calls = engine(codes)
    b.jobs = 3
    out = b.run(None, 19)
    assert (out.status, out.first_bad) == ("found", "r12")
    assert calls[:4] == ["r19", "r18", "r17", "r15"]  # the bad end, then distances 1, 2, 4 at once
    codes = {f"r{i:02}": 1 for i in range(20)}
    b, calls = engine(codes)
    b.jobs = 3
    assert b.run(None, 19).status == "no-good" and "r00" in calls


def test_an_interrupted_round_stops_its_other_runs_and_caches_nothing_of_them(tmp_path):
    started = threading.Event()

    def test(c):
        if c == "c2":
            started.wait(60)
            raise KeyboardInterrupt
        if c == "c3":
            started.set()
            r = harness.run([sys.executable, "-c", "import time; time.sleep(600)"], timeout=600)
            return r.code, r.reason, r.final
        return (1 if c >= "c4" else 0), None

    state = bisect.State(tmp_path / "state.json")
    b = bisect.Bisector([f"c{i}" for i in range(6)], test, lambda c: c, state, log=lambda m: None, jobs=3)
    with pytest.raises(KeyboardInterrupt):
        b.run(0, 5)
    killed = [s for s in b.steps if s.candidate == "c3"]
    assert killed and all("was interrupted" in (s.reason or "") for s in killed), killed
    cached = set(json.loads((tmp_path / "state.json").read_text()))
    assert {"c0", "c5"} <= cached and "c3" not in cached  # the killed run left no verdict
    assert not process_group.ABORT.is_set()  # the next round runs


# -- commit tier on a synthetic repository ------------------------------------------------------

def make_repo(path: Path, needs_dep_from: int | None = None,
              fixed_at: int | None = None) -> tuple[git.Repo, list[str]]:
    """A tiny 'lightning' with 12 merged PRs: #103 breaks the import, #107 brings the bug (and,
    with ``needs_dep_from``, that PR and the later ones import a new dependency ``newdep``; with
    ``fixed_at``, that PR fixes the bug)."""
    repo = git.Repo.init(path, initial_branch="master")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    pkg = path / "src" / "lightning" / "pytorch"
    pkg.mkdir(parents=True)
    (path / "requirements" / "pytorch").mkdir(parents=True)
    (path / "requirements" / "pytorch" / "base.txt").write_text("torch >=2.1\n")
    (path / "docs").mkdir()
    shas = []
    for i in range(12):
        bug = i >= 7 and (fixed_at is None or i < fixed_at)
        body = "syntax error(" if i == 3 else f"BUG = {bug}\nclass Trainer: pass\n"
        if needs_dep_from is not None and i >= needs_dep_from:
            body = "import newdep  # noqa: F401\n" + body
        (pkg / "__init__.py").write_text(body)
        (path / "src" / "lightning" / "__init__.py").write_text("")
        (path / "docs" / "big.txt").write_text(f"docs {i}\n")
        repo.index.add([str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()
                        and ".git" not in p.parts])
        shas.append(repo.index.commit(f"change {i} (#{100 + i})").hexsha)
        if i == 0:
            repo.create_tag("1.0.0")
    return repo, shas


def fake_plan(reqs, *_):
    return envs.Plan(list(reqs), "2024-01-01", "2024-01-01", [], {})


@pytest.fixture
def no_envs(monkeypatch):
    monkeypatch.setattr(envs, "ensure", lambda name, args, python="3.11", log=None: Path(sys.executable))
    monkeypatch.setattr(envs, "plan", fake_plan)
    monkeypatch.setattr(envs, "install_plan", lambda *args: fake_plan([]))
    monkeypatch.setattr(envs, "era_torch", lambda moment: "2.13.0")


def cli(tmp_path, repo_path, *extra):
    return bisect_cli.main(["--tier", "commits", "--repo", str(repo_path), "--torch", "2.13.0",
                            "--script", str(FIXTURE), "--signature", "marker: bug",
                            "--state", str(tmp_path / "state.json"),
                            "--out", str(tmp_path / "out"), *extra])


def test_commit_bisect_finds_the_pr_and_skips_the_broken_commit(tmp_path, no_envs, monkeypatch):
    monkeypatch.setattr(bisect_options, "CACHE", tmp_path / "cache")
    repo, shas = make_repo(tmp_path / "lightning")
    before = repo.git.status("--porcelain")
    assert cli(tmp_path, repo.working_dir, "--good", "1.0.0", "--bad", "master") == 0
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["commits"]["outcome"]["first_bad"] == shas[7]
    steps = data["commits"]["outcome"]["steps"]
    assert all(s["candidate"] != shas[3] or s["verdict"] == "skip" for s in steps)
    text = (tmp_path / "out" / "report.md").read_text()
    assert "change 7 (#107)" in text and "/pull/107" in text and "<details>" in text
    assert repo.git.status("--porcelain") == before  # the user's checkout is untouched
    worktree = next((tmp_path / "cache" / "worktrees").iterdir())
    assert not (worktree / "docs").exists()  # sparse: code folders only
    # a second run is answered from the state file
    assert cli(tmp_path, repo.working_dir, "--good", "1.0.0", "--bad", "master") == 0
    again = json.loads((tmp_path / "out" / "report.json").read_text())["commits"]["outcome"]
    assert all(s["cached"] for s in again["steps"])


def test_commits_run_on_a_release_environment_and_fall_back_to_their_own_requirements(
        tmp_path, no_envs, monkeypatch):
    # a commit that imports what the release's environment lacks is run again on an environment
    # of its own requirements, where its import works: it is tested, not skipped
    monkeypatch.setattr(bisect_options, "CACHE", tmp_path / "cache")
    repo, shas = make_repo(tmp_path / "lightning", needs_dep_from=9)
    deps = tmp_path / "own-deps"
    deps.mkdir()
    (deps / "newdep.py").write_text("")
    own = tmp_path / "own-env" / "bin" / "python"
    own.parent.mkdir(parents=True)
    own.write_text(f'#!/bin/sh\nPYTHONPATH="$PYTHONPATH:{deps}" exec {sys.executable} "$@"\n')
    own.chmod(0o755)
    made = []

    def ensure(name, args, python="3.11", log=None):
        made.append(name)
        return own if name.startswith("commit-") else Path(sys.executable)

    monkeypatch.setattr(envs, "ensure", ensure)
    assert cli(tmp_path, repo.working_dir, "--good", "1.0.0", "--bad", "master") == 0
    data = json.loads((tmp_path / "out" / "report.json").read_text())["commits"]
    assert data["outcome"]["first_bad"] == shas[7]
    for step in data["outcome"]["steps"]:
        fell_back = "with the commit's own requirements" in (step["reason"] or "")
        assert fell_back == (shas.index(step["candidate"]) >= 9), step
        assert step["verdict"] != "skip" or step["candidate"] == shas[3]
    assert any(name.startswith("pytorch-lightning-") for name in made)  # a release's, first
    assert "could not import there and ran on their own requirements" in data["how"]


def test_find_fix_names_the_commit_that_fixed_the_bug(tmp_path, no_envs, monkeypatch):
    monkeypatch.setattr(bisect_options, "CACHE", tmp_path / "cache")
    repo, shas = make_repo(tmp_path / "lightning", fixed_at=10)
    assert cli(tmp_path, repo.working_dir, "--find-fix", "--bad", shas[8], "--good", "master") == 0
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["find_fix"] and data["commits"]["outcome"]["first_bad"] == shas[10]
    text = (tmp_path / "out" / "report.md").read_text()
    assert "First fixed commit (the fix)" in text and "change 10 (#110)" in text
    assert "change 9 (#109) | with the bug |" in text
    # the other way round is bad input, in the fix's own words
    assert cli(tmp_path, repo.working_dir, "--find-fix", "--bad", "master", "--good", shas[8]) == 2


def test_commit_probes_in_parallel_each_in_a_worktree_of_its_own(tmp_path, no_envs, monkeypatch):
    monkeypatch.setattr(bisect_options, "CACHE", tmp_path / "cache")
    repo, shas = make_repo(tmp_path / "lightning")
    assert cli(tmp_path, repo.working_dir, "--good", "1.0.0", "--bad", "master", "--jobs", "3") == 0
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["commits"]["outcome"]["first_bad"] == shas[7]
    trees = sorted(p.name for p in (tmp_path / "cache" / "worktrees").iterdir() if p.is_dir())
    assert len(trees) == 3, trees


@pytest.mark.parametrize("jobs, message", [
    (["--jobs", "0"], "--jobs takes a number >= 1, or auto"),
    (["--jobs", "two"], "--jobs takes a number >= 1, or auto"),
])
def test_bad_jobs_are_bad_input(tmp_path, no_envs, capsys, jobs, message):
    assert cli(tmp_path, tmp_path, "--good", "a", "--bad", "b", *jobs) == 2
    assert message in capsys.readouterr().err


def test_find_fix_over_releases(tmp_path, monkeypatch, capsys):
    names = [f"1.{i}.0" for i in range(10)]
    buggy = {"1.2.0", "1.3.0", "1.4.0", "1.5.0"}
    monkeypatch.setattr(bisect_tiers, "candidate_releases", lambda args: names)
    monkeypatch.setattr(bisect_tiers, "release_predicate",
                        lambda args, out: lambda c: (1 if c in buggy else 0, "sig"))

    def run(*args):
        return bisect_cli.main([*OWN, "--tier", "releases", "--find-fix", "--state", str(tmp_path / "s.json"),
                                "--out", str(tmp_path / "out"), *args])

    assert run("--bad", "1.3.0") == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "First fixed pytorch-lightning release: **1.6.0** (the last with the bug: 1.5.0)" in text
    assert "| 1.6.0 | fixed |" in text and "| 1.5.0 | with the bug |" in text
    buggy.clear()  # the bug in no release: searched back from the newest, nothing to fix
    assert run("--state", str(tmp_path / "other.json")) == 3
    text = (tmp_path / "out" / "report.md").read_text()
    assert "The bug showed in no pytorch-lightning release tested" in text
    assert run("--bad", "1.5.0", "--good", "1.2.0") == 2
    assert "--bad (with the bug) must be older than --good" in capsys.readouterr().err


def test_an_edited_repro_or_another_of_the_same_name_is_run_again(tmp_path, no_envs, monkeypatch):
    monkeypatch.setattr(bisect_options, "CACHE", tmp_path / "cache")
    repo, _ = make_repo(tmp_path / "lightning")
    repro = tmp_path / "mine" / FIXTURE.name  # what a reduction writes is always minimized.py

    def cached_steps() -> list[bool]:
        assert cli(tmp_path, repo.working_dir, "--good", "1.0.0", "--bad", "master",
                   "--script", str(repro)) == 0
        steps = json.loads((tmp_path / "out" / "report.json").read_text())["commits"]["outcome"]["steps"]
        return [s["cached"] for s in steps]

    repro.parent.mkdir()
    (repro.parent / "helper.py").write_text("WIDTH = 1\n")
    repro.write_text("import helper  # noqa: F401\n" + FIXTURE.read_text())
    assert not any(cached_steps())
    assert all(cached_steps())  # the same files: answered from the state file
    repro.write_text(repro.read_text() + "# edited\n")
    assert not any(cached_steps())  # same name, other content: run again
    (repro.parent / "helper.py").write_text("WIDTH = 2\n")
    assert not any(cached_steps())  # a module it imports changed: run again
    (repro.parent / "notes.py").write_text("anything\n")
    assert all(cached_steps())  # a file it does not import is not the repro


@pytest.mark.parametrize("args, message", [
    (["--good", "nope", "--bad", "master"], "unknown git ref 'nope'"),
    (["--good", "1.0.0", "--bad", "master", "--trials", "0"], "--trials takes a number"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, no_envs, monkeypatch, capsys, args, message):
    monkeypatch.setattr(bisect_options, "CACHE", tmp_path / "cache")
    repo, _ = make_repo(tmp_path / "lightning")
    assert cli(tmp_path, repo.working_dir, *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_missing_repo_and_repro_are_bad_input(tmp_path, no_envs, capsys):
    assert cli(tmp_path, tmp_path / "nowhere", "--good", "a", "--bad", "b") == 2
    assert "no repository at" in capsys.readouterr().err
    assert bisect_cli.main(["--script", "nope.py"]) == 2
    assert "--script nope.py: not found" in capsys.readouterr().err


def test_release_bisect_never_worked(tmp_path, monkeypatch):
    names = [f"1.{i}.0" for i in range(10)]
    monkeypatch.setattr(bisect_tiers, "candidate_releases", lambda args: names)
    monkeypatch.setattr(bisect_tiers, "release_predicate", lambda args, out: lambda c: (1, "sig"))
    code = bisect_cli.main([*OWN, "--tier", "releases", "--state", str(tmp_path / "s.json"),
                            "--out", str(tmp_path / "out")])
    assert code == 3
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Bad in every pytorch-lightning release tested" in text


def test_without_a_repository_both_tiers_stop_after_the_releases_and_say_so(tmp_path, monkeypatch, capsys):
    """One rule for --repo in every session: no repository, no commit tier (never a clone of
    upstream the user did not ask for)."""
    names = [f"1.{i}.0" for i in range(10)]
    monkeypatch.setattr(bisect_tiers, "candidate_releases", lambda args: names)
    monkeypatch.setattr(bisect_tiers, "release_predicate",
                        lambda args, out: lambda c: (1 if c >= "1.6.0" else 0, "sig"))
    monkeypatch.setattr(bisect_cli, "commit_tier", lambda *a, **k: pytest.fail("the commit tier ran"))
    code = bisect_cli.main([*OWN, "--tier", "both", "--repo", "", "--state", str(tmp_path / "s.json"),
                            "--out", str(tmp_path / "out")])
    assert code == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "First bad pytorch-lightning release: **1.6.0**" in text
    assert "Commits not searched: no Lightning repository" in text
    assert "[commits] not searched" in capsys.readouterr().out


def test_an_end_on_a_release_branch_is_mapped_through_the_merge_base(tmp_path, no_envs, monkeypatch):
    monkeypatch.setattr(bisect_options, "CACHE", tmp_path / "cache")
    repo, shas = make_repo(tmp_path / "lightning")
    # a patch release cherry-picked on a release branch off commit 2
    repo.git.checkout("-b", "release/1.0.x", shas[2])
    (tmp_path / "lightning" / "NOTES").write_text("1.0.1\n")
    repo.index.add(["NOTES"])
    repo.index.commit("release 1.0.1 (#102)")
    repo.create_tag("1.0.1")
    repo.git.checkout("master")
    assert cli(tmp_path, repo.working_dir, "--good", "1.0.1", "--bad", "master") == 0
    data = json.loads((tmp_path / "out" / "report.json").read_text())["commits"]
    assert data["outcome"]["first_bad"] == shas[7]
    assert "merge-base" in data["notes"][0] and shas[2][:10] in data["notes"][0]
    assert "merge-base" in (tmp_path / "out" / "report.md").read_text()


def test_release_candidates_leave_out_yanked_prereleases_and_other_pythons():
    from datetime import UTC, datetime

    from packaging.version import Version

    from tools.environments import index

    def rel(v, yanked=False, requires=None, tags=("py3",)):
        return index.Release(Version(v), datetime(2024, 1, 1, tzinfo=UTC), yanked, requires,
                             frozenset(tags))

    assert rel("2.0.0").installable_on("3.11")
    assert not rel("2.0.1", yanked=True).installable_on("3.11")
    assert not rel("2.1.0rc1").installable_on("3.11")
    assert not rel("1.0.0", requires=">=3.6,<3.10").installable_on("3.11")
    assert not rel("1.13.0", tags=("cp38", "cp39", "cp310")).installable_on("3.11")
    assert rel("1.13.1", tags=("cp310", "cp311")).installable_on("3.11")


def test_the_cached_clone_follows_a_tag_moved_in_the_source(tmp_path):
    from tools.stages import gitrange

    repo, shas = make_repo(tmp_path / "src-repo")
    clone = gitrange.open_repo(str(tmp_path / "src-repo"), tmp_path / "cache")
    assert clone.git.rev_parse("1.0.0^{commit}") == shas[0]
    repo.create_tag("1.0.0", ref=shas[5], force=True)  # re-tagged upstream
    clone = gitrange.open_repo(str(tmp_path / "src-repo"), tmp_path / "cache")  # the next run
    assert clone.git.rev_parse("1.0.0^{commit}") == shas[5]


def test_a_local_repository_deleted_and_made_again_is_cloned_again(tmp_path, capsys):
    # the cached clone borrowed the objects of the first one ("bad object refs/heads/master")
    import shutil

    from tools.stages import gitrange

    make_repo(tmp_path / "src-repo")
    gitrange.open_repo(str(tmp_path / "src-repo"), tmp_path / "cache")
    shutil.rmtree(tmp_path / "src-repo")
    # other contents: made again within the same second, the same contents are the same commits
    # (nothing to clone again: the test failed now and then on a fast run)
    _, shas = make_repo(tmp_path / "src-repo", fixed_at=9)
    clone = gitrange.open_repo(str(tmp_path / "src-repo"), tmp_path / "cache")
    assert clone.git.rev_parse("master") == shas[-1] or clone.git.rev_parse("origin/master") == shas[-1]
    assert "cloning it again" in capsys.readouterr().out


def test_the_worktrees_of_a_repository_made_again_are_made_again(tmp_path, capsys):
    """The clone made again has none of the old clone's worktrees: the folder a step checks out
    in is made again too, not a raw InvalidGitRepositoryError on every later run."""
    import shutil

    from tools.stages import gitrange

    make_repo(tmp_path / "src-repo")
    clone = gitrange.open_repo(str(tmp_path / "src-repo"), tmp_path / "cache")
    base = tmp_path / "cache" / "worktrees" / "lightning"
    tree = gitrange.Worktree.claim(clone, base)
    tree.checkout(clone.git.rev_parse("1.0.0^{commit}"))
    tree.lock.close()
    shutil.rmtree(tmp_path / "src-repo")
    _, shas = make_repo(tmp_path / "src-repo", fixed_at=9)
    clone = gitrange.open_repo(str(tmp_path / "src-repo"), tmp_path / "cache")
    tree = gitrange.Worktree.claim(clone, base)
    path = tree.checkout(shas[-1])
    assert path == base.with_name("lightning-0")
    assert "BUG = False" in (path / "src" / "lightning" / "pytorch" / "__init__.py").read_text()
    assert "not a worktree of" in capsys.readouterr().out


def test_with_hang_a_run_that_outlives_its_limit_is_bad(tmp_path, monkeypatch):
    from tools import bisect_cli
    from tools.launch import harness
    from tools.stages import bisect_tiers

    cfg = bisect_cli.parse_args(["--script", "tests/corpus/skip_step_ddp.py", "--hang", "--timeout", "5",
                                 "--out", str(tmp_path)])
    assert cfg.hang and "|hang=5" in bisect_tiers.signature_key(cfg)

    class Slow:
        def run(self, run):
            return harness.RunResult(125, "skip", "timed out after 5 s; process group killed", 5.0, -15)

    monkeypatch.setattr(bisect_tiers, "LAUNCHER", Slow())
    code, reason, final = bisect_tiers.run_repro(cfg, tmp_path, Path(sys.executable))
    assert (code, reason) == (1, "it hangs: timed out after 5 s; process group killed")
    cfg = bisect_cli.parse_args(["--script", "tests/corpus/skip_step_ddp.py", "--signature", "x",
                                 "--timeout", "5", "--out", str(tmp_path)])
    assert bisect_tiers.run_repro(cfg, tmp_path, Path(sys.executable))[0] == 125  # without --hang: no verdict
