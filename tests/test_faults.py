"""Real-world faults: concurrent runs, interruptions, temporary failures, bad input, odd repros.

Each test reproduces a way the workspace once gave a wrong verdict, lost results or left
processes behind.
"""

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, alive
from test_bisect import FIXTURE, cli, make_repo, no_envs  # noqa: F401  (fixture)

from tools import bisect_cli, run
from tools.core import results
from tools.stages import bisect, bisect_options, bisect_tiers, gitrange

OWN = ("--script", "repro/backbone_finetuning_ddp.py")  # the workspace's #20340 repro


def wait_for(path: Path, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


# -- the bisect state and worktrees under two runs at once -----------------------------------

def _put_many(path, prefix, n):
    state = bisect.State(Path(path))
    for i in range(n):
        state.put(f"{prefix}{i}", {"verdict": "good", "codes": [0], "seconds": 0.0, "reason": None})


def test_two_runs_writing_one_state_file_lose_nothing(tmp_path):
    import multiprocessing

    path = tmp_path / "state.json"
    procs = [multiprocessing.get_context("spawn").Process(target=_put_many, args=(path, p, 25))
             for p in "abcd"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert len(json.loads(path.read_text())) == 100


def test_a_second_bisect_at_the_same_time_gets_its_own_worktree(tmp_path):
    repo, shas = make_repo(tmp_path / "lightning")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        import git
        from pathlib import Path
        from tools.stages import gitrange
        wt = gitrange.Worktree.claim(git.Repo({str(repo.working_dir)!r}), Path({str(tmp_path / 'wt')!r}))
        wt.checkout({shas[0]!r})
        print(wt.path, flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        theirs = Path(holder.stdout.readline().strip())
        mine = gitrange.Worktree.claim(repo, tmp_path / "wt")
        mine.checkout(shas[9])
        assert mine.path != theirs
        assert "BUG = False" in (theirs / "src/lightning/pytorch/__init__.py").read_text()
    finally:
        holder.kill()
        holder.wait()
    mine.lock.close()
    assert gitrange.Worktree.claim(repo, tmp_path / "wt").path == theirs  # freed by its death


# -- temporary failures are tried again; real verdicts are cached -----------------------------

def test_a_timeout_or_environment_failure_is_not_cached(tmp_path):
    answers = iter([(125, "timed out after 5 s", False), (0, None, True)])
    state = bisect.State(tmp_path / "state.json")
    b = bisect.Bisector(["a"], lambda c: next(answers), lambda c: c, state, log=lambda m: None)
    assert b.verdict("a") == "skip" and "not cached" in b.steps[-1].reason
    assert not (tmp_path / "state.json").exists()
    b2 = bisect.Bisector(["a"], lambda c: next(answers), lambda c: c, bisect.State(tmp_path / "state.json"),
                         log=lambda m: None)
    assert b2.verdict("a") == "good" and json.loads((tmp_path / "state.json").read_text())["a"]


def test_trials_auto_is_cached_and_stops_on_a_harness_failure(tmp_path):
    runs = []

    def test(c):
        runs.append(c)
        return (1 if len(runs) % 2 else 0), None

    b = bisect.Bisector(["a", "b"], test, lambda c: c, bisect.State(tmp_path / "s.json"),
                        log=lambda m: None)
    assert b.auto_trials("b") == bisect.trials_for(3 / 5) and b.rate == 0.6
    b2 = bisect.Bisector(["a", "b"], test, lambda c: c, bisect.State(tmp_path / "s.json"),
                         log=lambda m: None)
    assert b2.auto_trials("b") == b.trials and len(runs) == 5  # answered from the state
    b3 = bisect.Bisector(["a", "b"], lambda c: (128, "boom"), lambda c: c, bisect.State(None),
                         log=lambda m: None)
    with pytest.raises(bisect.HarnessFailure):
        b3.auto_trials("b")


# -- what --script can be ------------------------------------------------------------------

@pytest.mark.parametrize("make, message", [
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: p.write_text("just some notes\n"), "cannot tell how to run it"),
    (lambda p: p.write_text("#!/bin/sh\nexit 1\n"), "is not executable"),
    (lambda p: p.write_text("import sys\nsys.exit(1)\n"), "prints no verdict line: give --signature"),
], ids=["directory", "text-file", "sh-not-executable", "script-without-signature"])
def test_a_repro_that_cannot_be_judged_is_refused_before_any_step(tmp_path, capsys, make, message):
    repro = tmp_path / ("r.py" if "signature" in message else "r")
    make(repro)
    assert bisect_cli.main(["--script", str(repro), "--state", str(tmp_path / "s.json"),
                            "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "s.json").exists()


def test_a_shell_script_repro_runs_with_the_candidates_python(tmp_path, no_envs, monkeypatch):  # noqa: F811
    monkeypatch.setattr(bisect_options, "CACHE", tmp_path / "cache")
    repo, shas = make_repo(tmp_path / "lightning")
    sh = tmp_path / "repro.sh"
    sh.write_text(f'#!/bin/sh\nexec python "{FIXTURE}"\n')
    sh.chmod(sh.stat().st_mode | stat.S_IXUSR)
    code = bisect_cli.main(["--tier", "commits", "--repo", repo.working_dir, "--torch", "2.13.0",
                            "--good", "1.0.0", "--bad", "master", "--script", str(sh),
                            "--signature", "marker: bug", "--state", str(tmp_path / "s.json"),
                            "--out", str(tmp_path / "out")])
    assert code == 0
    assert json.loads((tmp_path / "out" / "report.json").read_text())["commits"]["outcome"][
        "first_bad"] == shas[7]


# -- one line and exit 2 for bad input, before anything runs ----------------------------------

@pytest.mark.parametrize("content, message", [
    ("[1, 2]", "is not a bisect state (a JSON list"),
    ('{"k": {"verdict": "good", "codes": "0"}}', "entry 'k' is not a verdict record"),
    ("{not json", "is not JSON"),
], ids=["a-list", "wrong-types", "not-json"])
def test_a_broken_state_file_is_one_line_naming_it(tmp_path, capsys, content, message):
    state = tmp_path / "state.json"
    state.write_text(content)
    assert bisect_cli.main([*OWN, "--state", str(state), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(state) in err[0] and message in err[0]
    assert not (tmp_path / "out").exists()


def test_an_unwritable_state_folder_is_refused_before_the_first_step(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    unwritable = tmp_path / "file" / "s.json"  # (a read-only folder is writable for root)
    assert bisect_cli.main([*OWN, "--state", str(unwritable), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: state file {unwritable}")
    assert not (tmp_path / "o").exists()


def test_an_invalid_signature_is_refused_before_any_step(tmp_path, capsys):
    assert bisect_cli.main([*OWN, "--signature", "reducer(", "--state", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a valid regex" in err[0]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_result_files_follow_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        results.write_json(tmp_path / "r.json", {})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == mode


# -- `python -m tools.run` under git bisect run: only verdicts below 128 ------------------------

@pytest.mark.parametrize("argv", [[], ["--timeout", "x", "--", "true"], ["--signature", "(", "--", "true"],
                                  ["--timeout", "-5", "--", "true"]])
def test_tools_run_bad_options_never_look_like_a_verdict(argv, capsys):
    assert run.entry(argv) == 129
    assert capsys.readouterr().err.startswith("error: ")


def test_tools_run_crash_of_the_harness_is_128(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("disk full")

    from tools.launch import harness

    monkeypatch.setattr(harness, "run", boom)
    assert run.entry(["--", "true"]) == 128


def test_non_utf8_output_of_a_repro_is_judged(tmp_path):
    from tools.launch import harness

    path = tmp_path / "s.py"
    path.write_text("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe bytes\\n')\n"
                    "sys.stderr.buffer.write(b'marker: bug \\xff\\n')\nsys.exit(1)\n")
    r = harness.run([sys.executable, str(path)], timeout=30, signature="marker: bug")
    assert (r.code, r.verdict) == (1, "bad")


# -- signals: nothing outlives its supervisor ---------------------------------------------------

DRIVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from tools.core import contract
    from tools.launch import harness
    body = ("import subprocess, sys, time\\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\\n"
            "open({pids!r}, 'w').write(str(p.pid))\\ntime.sleep(600)\\n")
    code = contract.run_main(lambda a: harness.run([sys.executable, '-c', body], timeout=600).code)
    print('exit', code, flush=True)
    sys.exit(code)
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_run_dies_with_its_supervisor_whatever_signal_ends_it(tmp_path, sig):
    pids = tmp_path / "pids"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER.format(root=str(ROOT), pids=str(pids))],
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                              stdout=subprocess.PIPE, text=True)
    child = int(wait_for(pids))  # a grandchild that ignores SIGTERM
    driver.send_signal(sig)
    out, _ = driver.communicate(timeout=60)
    if sig != signal.SIGKILL:
        assert driver.returncode == 130 and "exit 130" in out  # interrupted, not a verdict
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child)


# -- through nox: the tool's own exit code, signals forwarded, the tool dies with nox --------------

TOOL = textwrap.dedent("""
    import sys, time
    from tools.core import contract

    def main(argv):
        if argv[0] != "sleep":
            return int(argv[0])
        try:
            print("started", flush=True)
            time.sleep(600)
        finally:
            open(argv[1], "w").write("cleaned up")
    sys.exit(contract.run_main(main, sys.argv[1:]))
""")

SESSION = textwrap.dedent("""
    import os, sys, types
    sys.path.insert(0, {root!r})
    from tools import sessions
    fake = types.SimpleNamespace(bin=os.path.dirname(sys.executable), log=lambda m: None)
    sys.path.insert(0, {folder!r})
    os.environ["PYTHONPATH"] = os.pathsep.join([{root!r}, {folder!r}])
    sessions.run_tool(fake, "tool", sys.argv[1:])
""")


def _session(tmp_path, *args, **kwargs):
    (tmp_path / "tool.py").write_text(TOOL)
    code = SESSION.format(root=str(ROOT), folder=str(tmp_path))
    return subprocess.Popen([sys.executable, "-c", code, *args], **kwargs)


@pytest.mark.parametrize("code", [0, 2, 3, 4, 128])
def test_a_tools_exit_code_is_the_sessions(tmp_path, code):
    assert _session(tmp_path, str(code)).wait(60) == code


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_signal_to_nox_reaches_the_tool_which_cleans_up(tmp_path, sig):
    proc = _session(tmp_path, "sleep", str(tmp_path / "done"), stdout=subprocess.PIPE, text=True,
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(sig)
    proc.wait(60)
    assert wait_for(tmp_path / "done") == "cleaned up"  # SIGKILL: by PR_SET_PDEATHSIG's SIGTERM
    if sig != signal.SIGKILL:
        assert proc.returncode == 130


def test_bad_input_exits_2_through_nox(root):
    proc = subprocess.run([sys.executable, "-m", "nox", "-f", str(root / "noxfile.py"), "-s", "bisect",
                           "--", *OWN, "--trials", "0"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: --trials takes a number >= 1 or 'auto'" in proc.stderr


@pytest.mark.parametrize("where", ["--out", "cache"])
def test_an_unwritable_results_or_cache_folder_is_refused_before_the_first_step(tmp_path, capsys,
                                                                               monkeypatch, where):
    (tmp_path / "file").write_text("")
    blocked = tmp_path / "file" / "below"
    out = blocked if where == "--out" else tmp_path / "out"
    if where == "cache":
        monkeypatch.setattr(bisect_options, "CACHE", blocked)
    monkeypatch.setattr(bisect_cli, "release_ends", lambda cfg: (["1.0", "2.0"], None, 1))
    monkeypatch.setattr(bisect_cli, "release_tier", lambda *a: pytest.fail("a step ran"))
    assert bisect_cli.main([*OWN, "--state", str(tmp_path / "s.json"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write there" in err[0]


def test_a_full_disk_while_saving_the_state_is_one_line_128_and_keeps_the_earlier_verdicts(
        tmp_path, capsys, monkeypatch):
    import errno

    from tools.core import results

    names = [f"1.{i}.0" for i in range(8)]
    monkeypatch.setattr(bisect_tiers, "candidate_releases", lambda cfg: names)
    monkeypatch.setattr(bisect_tiers, "release_predicate",
                        lambda cfg, out: lambda c: (1 if c >= "1.5.0" else 0, None))
    state = tmp_path / "s.json"
    real = results.write_json
    saved = []

    def full_after_two(path, data):
        if Path(path) == state and len(saved) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        if Path(path) == state:
            saved.append(path)
        real(path, data)

    monkeypatch.setattr(bisect, "write_json", full_after_two)
    code = bisect_cli.main([*OWN, "--tier", "releases", "--good", "1.0.0", "--state", str(state),
                            "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 128 and len(err) == 1, err
    assert "cannot save the verdict in the state file" in err[0] and "No space left" in err[0]
    assert len(json.loads(state.read_text())) == 2  # the two verdicts before are still there


def test_an_unknown_torch_is_refused_and_leaves_no_empty_run_folder(tmp_path, capsys, monkeypatch):

    monkeypatch.setenv("REPRO_RESULTS", str(tmp_path / "results"))
    code = bisect_cli.main([*OWN, "--tier", "releases", "--torch", "9.9.9",
                            "--state", str(tmp_path / "s.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["error: torch 9.9.9 is not on the package index"]
    assert not list((tmp_path / "results").glob("bisect/*"))


def test_an_unwritable_results_folder_names_its_path(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("REPRO_RESULTS", str(tmp_path / "file"))
    monkeypatch.setattr(bisect_cli, "release_ends", lambda cfg: (["1.0", "2.0"], None, 1))
    assert bisect_cli.main([*OWN, "--state", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: the results folder {tmp_path / 'file' / 'bisect'}: cannot write there")


def test_nox_repro_with_a_results_folder_that_cannot_be_made_is_one_line_and_exit_2(tmp_path, monkeypatch):
    from tools.core import contract, results
    from tools.stages import cells

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("REPRO_RESULTS", str(tmp_path / "file"))
    monkeypatch.setattr(results, "_MADE", {})
    with pytest.raises(contract.BadInput, match="the results folder .*file/repro: cannot write there"):
        cells.open_results()


def test_a_slurm_tasks_exit_code_is_its_own_job_s_never_a_late_writer_s(tmp_path):
    """A task's shell writes "<job id> <exit code>" as it ends (tools/launch/slurm_jobs.py); a job left
    behind by an earlier wait on the same log path, writing late, must not end a new wait."""
    from tools.launch import slurm_jobs

    mark = tmp_path / "step.rc"
    script = f"{slurm_jobs.NOTE_JOB}rc={mark}\nsh -c 'exit 3'\n{slurm_jobs.RECORD_EXIT}"
    done = subprocess.run(["sh", "-c", script], env={**os.environ, "SLURM_JOB_ID": "41"}, timeout=30)
    assert done.returncode == 3  # the job's own exit code is the command's
    assert mark.read_text() == "41 3\n" and not (tmp_path / "step.rc.tmp").exists()
    assert slurm_jobs._exit_code(mark, "41") == 3
    assert slurm_jobs._exit_code(mark, "42") is None  # another job's file
    array = {**os.environ, "SLURM_JOB_ID": "57", "SLURM_ARRAY_JOB_ID": "50", "SLURM_ARRAY_TASK_ID": "7"}
    subprocess.run(["sh", "-c", script.replace("exit 3", "exit 0")], env=array, timeout=30)
    assert slurm_jobs._exit_code(mark, "50") == 0  # an array task writes its array's id
