"""Forked runs keep every guarantee of fresh ones: verdicts, logs, the whole group killed, no orphan.

``harness.run_forked`` (a run as a fork of the calling process), ``repro/_launch.py`` (ranks forked
with torchrun's environment) and ``tools/launch/preloaded.py`` (one import for many runs).
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import alive

from tools.launch import harness, preloaded

OWN = ("--script", "repro/backbone_finetuning_ddp.py")  # the workspace's #20340 repro

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(120)


def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def verdict_then_exit(code):
    def target():
        print("hello")
        print(json.dumps({"verdict": {0: "good", 1: "bad"}[code], "exit_code": code,
                          "signature": "sig" if code else None}))
        sys.exit(code)
    return target


def raises():
    raise ValueError("an unrelated crash")


@pytest.mark.parametrize("target, code, verdict", [
    (verdict_then_exit(1), 1, "bad"),
    (verdict_then_exit(0), 0, "good"),
    (raises, 125, "skip"),  # exit 1 without a verdict line: cannot test, as for a fresh process
])
def test_a_forked_run_is_judged_like_a_fresh_one(tmp_path, target, code, verdict):
    r = harness.run_forked(target, timeout=30, log_stem=tmp_path / "run")
    assert (r.code, r.verdict) == (code, verdict), r.reason
    if target is raises:
        assert r.returncode == 1 and "ValueError: an unrelated crash" in r.reason
        assert "Traceback" in Path(r.stderr_path).read_text()
    else:
        assert Path(r.stdout_path).read_text().startswith("hello\n")


def test_a_forked_run_leads_its_own_session_and_its_group_is_killed_at_the_limit(tmp_path):
    pidfile = tmp_path / "grandchild.pid"

    def target():
        assert os.getsid(0) == os.getpid()  # a session (and group) of its own
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        pidfile.write_text(str(child.pid))
        time.sleep(600)

    start = time.monotonic()
    r = harness.run_forked(target, timeout=3)
    assert time.monotonic() - start < 20
    assert (r.code, r.verdict) == (125, "skip") and "timed out" in r.reason
    assert r.leftovers == [] and wait_gone(int(pidfile.read_text()), 1)


def test_a_forked_run_dies_with_the_process_that_forked_it(tmp_path):
    # a parent killed with SIGKILL runs no cleanup: the fork must not survive it
    pidfile = tmp_path / "fork.pid"
    helper = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tools.launch import harness
        def target():
            open({str(pidfile)!r}, "w").write(str(os.getpid()))
            time.sleep(600)
        harness.run_forked(target, timeout=600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", helper])
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    fork = int(pidfile.read_text())
    assert alive(fork)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert wait_gone(fork)


def test_forked_ranks_get_torchrun_environment_and_die_with_rank0(tmp_path):
    script = textwrap.dedent(f"""
        import json, os, sys, time
        sys.path.insert(0, {str(ROOT / "repro")!r})
        import _launch
        rank = _launch.fork_ranks(3)
        keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "TORCHELASTIC_RUN_ID"]
        out = {{k: os.environ.get(k) for k in keys}}
        out["pid"] = os.getpid()
        path = os.path.join({str(tmp_path)!r}, f"rank{{rank}}.json")
        open(path + ".tmp", "w").write(json.dumps(out))
        os.replace(path + ".tmp", path)
        if rank:
            time.sleep(600)  # rank 0 leaves without joining them: they must die with it
        others = [os.path.join({str(tmp_path)!r}, f"rank{{r}}.json") for r in (1, 2)]
        while not all(os.path.exists(o) for o in others):
            time.sleep(0.05)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60,
                   env={k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")})
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert [r["RANK"] for r in ranks] == ["0", "1", "2"] == [r["LOCAL_RANK"] for r in ranks]
    assert {r["WORLD_SIZE"] for r in ranks} == {"3"} == {r["LOCAL_WORLD_SIZE"] for r in ranks}
    assert len({r["MASTER_PORT"] for r in ranks}) == 1 and ranks[0]["MASTER_PORT"].isdigit()
    assert len({r["TORCHELASTIC_RUN_ID"] for r in ranks}) == 1 and ranks[0]["TORCHELASTIC_RUN_ID"]
    assert all(wait_gone(r["pid"]) for r in ranks[1:])


JOB = """\
import json, os, sys
preloaded = "torch" in sys.modules  # imported before this script started: by the runner
print(json.dumps({"verdict": "good", "exit_code": 0, "signature": None,
                  "details": {"preloaded": preloaded, "runner": os.getppid(), "me": os.getpid(),
                              "argv": sys.argv[1:], "path0": sys.path[0]}}))
"""


def job(script, *args, timeout=60, **kw) -> dict:
    return {"argv": [str(script), *args], "timeout": timeout, "log_stem": None, **kw}


def test_the_runs_of_a_runner_share_one_import_and_each_is_a_fresh_fork(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    with preloaded.Runner(sys.executable, stderr=tmp_path / "runner.stderr") as runner:
        results = [runner.run(job(script, str(i))) for i in range(3)]
    assert [r.code for r in results] == [0, 0, 0], [r.reason for r in results]
    details = [r.record["details"] for r in results]
    assert all(d["preloaded"] for d in details)
    assert len({d["runner"] for d in details}) == 1  # one runner ...
    assert len({d["me"] for d in details}) == 3  # ... a new fork for each run
    assert [d["argv"] for d in details] == [["0"], ["1"], ["2"]]
    assert {d["path0"] for d in details} == {str(tmp_path)}  # as `python job.py` sets it


def test_a_runner_that_dies_gives_an_error_result_not_a_hang(tmp_path):
    script = tmp_path / "kill_runner.py"
    script.write_text("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n")
    ok = tmp_path / "job.py"
    ok.write_text(JOB)
    with preloaded.Runner(sys.executable, stderr=tmp_path / "runner.stderr") as runner:
        dead = runner.run(job(script))
        again = runner.run(job(ok))  # a new runner is started for the next run
    assert dead.code >= 128 and "preloaded runner exited" in dead.reason
    assert again.code == 0 and again.record["details"]["preloaded"]


def test_a_failed_preload_runs_each_job_in_a_fresh_interpreter(tmp_path):
    broken = tmp_path / "shadow"
    broken.mkdir()
    (broken / "torch.py").write_text("raise ImportError('no torch here')\n")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {**os.environ, "PYTHONPATH": str(broken)}
    with preloaded.Runner(sys.executable, env=env, stderr=tmp_path / "runner.stderr") as runner:
        r = runner.run(job(script))
    assert r.code == 0 and r.record["details"]["preloaded"] is False
    assert "import failed (torch: ImportError: no torch here)" in (tmp_path / "runner.stderr").read_text()


def test_the_trials_of_a_bisect_step_share_one_runner_and_a_new_candidate_gets_its_own(
        tmp_path, monkeypatch):
    import dataclasses

    from tools import bisect_cli
    from tools.stages import bisect_tiers

    script = tmp_path / "job.py"
    script.write_text(JOB)
    cfg = dataclasses.replace(bisect_cli.parse_args([*OWN, "--state", str(tmp_path / "s.json")]),
                              repro=script, preload=True, timeout=60)  # as the workspace's repros
    try:
        codes = [bisect_tiers.run_repro(cfg, tmp_path, Path(sys.executable), log_stem=tmp_path / f"t{i}",
                                      candidate=c)[0] for i, c in enumerate(["a", "a", "a", "b"])]
        runners = [json.loads(Path(tmp_path / f"t{i}.stdout").read_text().splitlines()[-1])
                   ["details"]["runner"] for i in range(4)]
    finally:
        bisect_tiers.close_launcher()
    assert codes == [0, 0, 0, 0]
    assert runners[0] == runners[1] == runners[2] != runners[3]


def test_a_runner_and_its_run_die_with_the_process_that_started_them(tmp_path):
    # a SIGKILLed nox or bisect runs no cleanup: its runner and the run under way must not go on
    pidfile = tmp_path / "job.pid"
    job_script = tmp_path / "sleeper.py"
    job_script.write_text(f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
                          "time.sleep(600)\n")
    caller = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tools.launch.preloaded import Runner
        Runner(sys.executable).run({{"argv": [{str(job_script)!r}], "timeout": 600, "log_stem": None}})
    """)
    parent = subprocess.Popen([sys.executable, "-c", caller])
    deadline = time.monotonic() + 60
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    job = int(pidfile.read_text())
    runner = int(Path(f"/proc/{job}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its ppid
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert wait_gone(runner) and wait_gone(job)
