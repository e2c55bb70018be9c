"""SLURM as the engine, on the workspace's local one-node cluster (``nox -s slurm_up``; the
README's test command starts it before the tests and stops it after). Without a running cluster
these tests skip with the reason."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import alive, run_repro
from filelock import FileLock

from tools.core import contract
from tools.environments import matrix
from tools.launch import nodes, slurm_cluster, slurm_jobs
from tools.stages import cells, slurm_matrix

ROOT = Path(__file__).resolve().parent.parent
FINETUNE = str(ROOT / "repro" / "backbone_finetuning_ddp.py")
# Every test here holds the cluster while it runs (a test may kill its controller). The ones that
# run a multi-process DDP job are marked ``ddp`` too: they run in turn with every other DDP test;
# the others only wait on SLURM, on a worker of their own (tests/conftest.py).
pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]


@pytest.fixture(autouse=True)
def cluster(monkeypatch):
    # the lock first: a test on another worker may have the controller down until it releases it
    slurm_cluster.HOME.mkdir(parents=True, exist_ok=True)
    with FileLock(slurm_cluster.HOME / "tests.lock", timeout=900):  # filelock.Timeout: the test errors
        if "SLURM_CONF" not in os.environ and not slurm_cluster.is_up():
            pytest.skip("no SLURM cluster: start the local one with `nox -s slurm_up` (root and the "
                        "distribution's slurm packages needed)")
        if "SLURM_CONF" not in os.environ:
            monkeypatch.setenv("SLURM_CONF", slurm_cluster.env()["SLURM_CONF"])
        yield


def sbatch_wait(tmp_path: Path, command: str, *options: str) -> tuple[int | None, str, str]:
    """Submit ``command`` as a batch job and wait for the exit code it writes as it ends, or for
    SLURM to say it ended without (as the tools do: ``sbatch --wait`` looks at its job only after
    2, 10, 42, ... s)."""
    out, err, rc = tmp_path / "job.out", tmp_path / "job.err", tmp_path / "job.rc"
    wrapped = f"{slurm_jobs.NOTE_JOB}rc={rc}\n{command}\n{slurm_jobs.RECORD_EXIT}"
    done = subprocess.run(["sbatch", "--parsable", f"--output={out}", f"--error={err}", *options,
                           "--wrap", wrapped], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().split(";")[0]

    def ended():
        states, gone = slurm_jobs._task_states(job, array=False)
        return rc.exists() or gone or (states or {}).get(0) in slurm_jobs.ENDED

    until(ended, 600, "the job never ended")
    with contextlib.suppress(AssertionError):  # ended without one: cancelled, timed out
        until(rc.exists, 5, "the exit code")
    return slurm_jobs._exit_code(rc, job), out.read_text(errors="replace"), err.read_text(errors="replace")


@pytest.mark.ddp
@pytest.mark.parametrize("control", [False, True], ids=["callback", "control"])
def test_20340_under_srun_gives_the_one_node_verdict(runner, tmp_path, control):
    extra = ["--no-callback"] if control else []
    rc, out, err = sbatch_wait(tmp_path, f"srun --kill-on-bad-exit=1 {sys.executable} {FINETUNE} "
                               f"--epochs 4 {' '.join(extra)}", "--nodes=1", "--ntasks-per-node=2")
    j = contract.judge(rc, nodes.verdict_last(out), err)
    assert j.record is not None, err[-2000:]
    assert j.record["details"]["cluster_environment"] == "SLURMEnvironment"  # Lightning read srun's ranks
    # the reference: ranks forked from the session's preloaded runner with the environment torchrun
    # gives its workers (tests/test_equivalence.py: the verdicts of new interpreters)
    local = run_repro(runner, Path(FINETUNE), "--epochs", "4", *extra, log_stem=tmp_path / "local",
                      timeout=300)
    assert j.code == local.code == (contract.GOOD if control else contract.BAD), (j.reason, local.reason)
    assert local.record["details"]["cluster_environment"] == "TorchElasticEnvironment"
    assert j.record["details"].get("first_diverging_epoch") == \
        local.record["details"].get("first_diverging_epoch")


MINI = textwrap.dedent('''
    torch = ["{torch}"]
    [lightning]
    pytorch-lightning = ["{pl}"]
    [[repro]]
    name = "20340"
    script = "repro/backbone_finetuning_ddp.py"
    args = ["--epochs", "4"]
    expect = "bad"
    [[repro]]
    name = "20340-control"
    script = "repro/backbone_finetuning_ddp.py"
    args = ["--epochs", "4", "--no-callback"]
    expect = "good"
''')


@pytest.fixture
def mini(tmp_path, monkeypatch) -> matrix.Matrix:
    import pytorch_lightning
    import torch

    path = tmp_path / "matrix.toml"
    path.write_text(MINI.format(torch=torch.__version__.split("+")[0], pl=pytorch_lightning.__version__))
    monkeypatch.setenv("REPRO_MATRIX", str(path))
    return matrix.load()


def prepare(m: matrix.Matrix, out: Path, python: str = sys.executable) -> None:
    opts, rest = cells.parse_posargs(["--executor", "slurm", "--time", "20"])
    for cell in m.cells:
        slurm_matrix.add_cell(cell, python, out, opts, rest)


@pytest.mark.ddp
def test_the_matrix_as_a_job_array_gives_the_local_table(tmp_path, mini):
    local = tmp_path / "local"
    for cell in mini.cells:
        cells.run_cell(cell, mini, sys.executable, local, [], 300)
    out = tmp_path / "slurm"
    prepare(mini, out)
    lines = []
    table = slurm_matrix.run_matrix(out, slurm_jobs.Options(time="20"), None, log=lines.append)
    job = json.loads((out / "slurm" / "job.json").read_text())["job"]
    assert any(": running |" in line for line in lines) and any(": completed |" in line for line in lines)
    # the same verdicts as the local run, row for row (times differ)
    def verdicts(folder):
        return {c["cell"]["id"]: {k: v["verdict"] for k, v in c["results"].items()}
                for c in map(json.loads, (p.read_text() for p in (folder / "cells").glob("*.json")))}
    assert verdicts(out) == verdicts(local) == {mini.cells[0].id: {"20340": "bad", "20340-control": "good"}}
    assert "bad" in table and mini.cells[0].id in table
    seen = subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%i %T"], capture_output=True,
                          text=True).stdout
    assert f"{job}_0 COMPLETED" in seen


def test_ctrl_c_cancels_the_job_and_every_cell_still_gets_its_row(tmp_path, mini, monkeypatch):
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\ntime.sleep(600)\n")
    path = tmp_path / "slow.toml"
    path.write_text(Path(os.environ["REPRO_MATRIX"]).read_text().split("[[repro]]")[0]
                    + f'[[repro]]\nname = "slow"\nscript = "{sleeper}"\n')
    monkeypatch.setenv("REPRO_MATRIX", str(path))
    mini = matrix.load()
    out = tmp_path / "slurm"
    prepare(mini, out)

    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.alarm(8)  # Ctrl-C while the task runs
    try:
        with pytest.raises(KeyboardInterrupt):
            slurm_matrix.run_matrix(out, slurm_jobs.Options(time="20"), None, log=lambda m: None)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    job = json.loads((out / "slurm" / "job.json").read_text())["job"]
    assert slurm_jobs.states(job) == {0: "CANCELLED"}
    row = json.loads((out / "cells" / f"{mini.cells[0].id}.json").read_text())
    reason = row.get("skipped") or row.get("slurm")  # nothing finished / what finished stays
    assert reason.startswith(f"slurm job {job}_0 CANCELLED")
    assert mini.cells[0].id in (out / "summary.md").read_text()


SUBMITTER = ROOT / "tests" / "fixtures" / "slurm_submitter.py"


def slow_matrix(tmp_path, monkeypatch) -> matrix.Matrix:
    """The mini matrix with a repro that runs for ten minutes: the job is busy when the test acts."""
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\ntime.sleep(600)\n")
    path = tmp_path / "slow.toml"
    path.write_text(Path(os.environ["REPRO_MATRIX"]).read_text().split("[[repro]]")[0]
                    + f'[[repro]]\nname = "slow"\nscript = "{sleeper}"\n')
    monkeypatch.setenv("REPRO_MATRIX", str(path))
    return matrix.load()


def until(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {seconds:g} s")


def submit_in_background(out: Path, stale: str, outage: str = "60") -> subprocess.Popen:
    env = {**os.environ, "REPRO_SLURM_STALE": stale, "REPRO_SLURM_OUTAGE": outage}
    return subprocess.Popen([sys.executable, str(SUBMITTER), str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def running_job(out: Path) -> str | None:
    job_file = out / "slurm" / "job.json"
    if not job_file.exists():
        return None
    job = json.loads(job_file.read_text())["job"]
    return job if (slurm_jobs.states(job) or {}).get(0) == "RUNNING" else None


def test_a_submitter_killed_outright_leaves_no_job_running(tmp_path, mini, monkeypatch):
    # SIGKILL runs no cleanup: the job sees the submitter's heartbeat go stale and ends itself
    m = slow_matrix(tmp_path, monkeypatch)
    out = tmp_path / "slurm"
    prepare(m, out)
    proc = submit_in_background(out, stale="8")
    try:
        job = until(lambda: running_job(out), 120, "the job never ran")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    state = until(lambda: next((s for s in (slurm_jobs.states(job) or {}).values()
                                if s in slurm_jobs.ENDED), None), 90, "the job outlived its submitter")
    assert state in ("FAILED", "COMPLETED"), state
    err = (out / "slurm" / f"{job}_0.err").read_text()
    assert "[slurm guard] the submitter has not touched" in err


def test_a_controller_outage_ends_the_wait_with_the_rows_and_slurm_down_stops_everything(
        tmp_path, mini, monkeypatch):
    m = slow_matrix(tmp_path, monkeypatch)
    out = tmp_path / "slurm"
    prepare(m, out)
    proc = submit_in_background(out, stale="10", outage="8")
    try:
        until(lambda: running_job(out), 120, "the job never ran")
        os.kill(slurm_cluster._alive("slurmctld"), signal.SIGKILL)  # the controller goes away
        stdout, stderr = proc.communicate(timeout=180)  # a bounded end, not a hang
        assert proc.returncode == 128, stderr
        assert stderr.strip().splitlines()[-1].startswith("error: harness failure: the SLURM controller has "
                                                          "not answered for")
        assert m.cells[0].id in (out / "summary.md").read_text()  # every cell keeps its row
        lines = []
        assert slurm_cluster.down(log=lines.append) == 0
        assert not slurm_cluster.cluster_processes(jobs=True)  # slurmd, slurmstepd, the job: no pid files
        assert slurm_cluster.down(log=lines.append) == 0 and lines[-1] == "[slurm] not running"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        slurm_cluster.up(log=lambda _m: None)  # for the tests that follow


def test_slurm_down_after_an_outage_also_stops_what_the_jobs_run(tmp_path):
    """A dead controller cannot cancel a job, and killing ``slurmstepd`` leaves its batch script
    and what that started running (they were found alive after ``slurm_down`` before): they are
    found by this cluster's ``SLURM_CONF`` and a job id in their environment."""
    pid_file, script = tmp_path / "job.pid", tmp_path / "job.py"
    script.write_text("import os, sys, time\ntmp = sys.argv[1] + '.tmp'\n"
                      "open(tmp, 'w').write(str(os.getpid())); os.rename(tmp, sys.argv[1])\n"
                      "time.sleep(600)\n")
    done = subprocess.run(["sbatch", f"--output={tmp_path / 'job.out'}", "--wrap",
                           f"{sys.executable} {script} {pid_file}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    try:
        pid = int(until(lambda: pid_file.exists() and pid_file.read_text(), 120, "the job never ran"))
        os.kill(slurm_cluster._alive("slurmctld"), signal.SIGKILL)  # nobody can cancel it now
        lines: list[str] = []
        assert slurm_cluster.down(log=lines.append) == 0
        assert not alive(pid), "the job's command outlived slurm_down"
        assert "processes of its jobs" in lines[-1], lines
        assert not slurm_cluster.cluster_processes(jobs=True)
    finally:
        slurm_cluster.down(log=lambda _m: None)
        slurm_cluster.up(log=lambda _m: None)  # for the tests that follow


def test_a_controller_outage_during_a_bisect_step_ends_the_wait_and_the_job_ends_itself(
        tmp_path, monkeypatch):
    """A step waits on its job asking the controller: a dead one ends the wait with ``Outage`` (a
    harness failure: exit 128, no verdict; ``sbatch --wait`` would wait without end), and the job,
    which nobody can cancel now, ends itself once the heartbeat stops."""
    monkeypatch.setattr(slurm_jobs, "OUTAGE", 8.0)
    monkeypatch.setattr(slurm_jobs, "STALE", 12.0)
    pid_file = tmp_path / "step.pid"
    cmd = [sys.executable, "-c", "import os, sys, time\n"
           "tmp = sys.argv[1] + '.tmp'\n"
           "open(tmp, 'w').write(str(os.getpid())); os.rename(tmp, sys.argv[1])\n"
           "time.sleep(600)\n", str(pid_file)]
    raised: list[BaseException] = []

    def step():
        try:
            slurm_jobs.run(cmd, timeout=600, log_stem=tmp_path / "step", signature=None,
                           env=dict(os.environ), opts=slurm_jobs.Options(time="20"), log=lambda m: None)
        except BaseException as err:
            raised.append(err)

    thread = threading.Thread(target=step, daemon=True)
    thread.start()
    try:
        pid = int(until(lambda: pid_file.exists() and pid_file.read_text(), 120, "the job never ran"))
        os.kill(slurm_cluster._alive("slurmctld"), signal.SIGKILL)  # the controller goes away
        thread.join(timeout=180)  # a bounded end, not a hang
        assert not thread.is_alive(), "the step still waits on a dead controller"
        assert len(raised) == 1 and isinstance(raised[0], slurm_jobs.Outage), raised
        assert isinstance(raised[0], contract.HarnessFailure)  # exit 128 in the bisect: no verdict
        assert str(raised[0]).startswith("the SLURM controller has not answered for")

        def gone():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False
        until(gone, 90, "the job's command outlived the submitter's wait")
        assert "[slurm guard] the submitter has not touched" in (tmp_path / "step.stderr").read_text()
    finally:
        slurm_cluster.down(log=lambda _m: None)
        slurm_cluster.up(log=lambda _m: None)  # for the tests that follow


def test_a_step_whose_job_ends_without_its_exit_code_is_cannot_test_not_a_hang(tmp_path):
    """The submitter watches for the exit code a job writes as it ends; a job cancelled by someone
    else (an admin, a preemption) writes none: the controller's word ends the wait."""
    pid_file = tmp_path / "step.pid"
    cmd = [sys.executable, "-c", "import os, sys, time\n"
           "tmp = sys.argv[1] + '.tmp'\n"
           "open(tmp, 'w').write(str(os.getpid())); os.rename(tmp, sys.argv[1])\n"
           "time.sleep(600)\n", str(pid_file)]
    got: list = []
    thread = threading.Thread(target=lambda: got.append(slurm_jobs.run(
        cmd, timeout=600, log_stem=tmp_path / "step", signature=None, env=dict(os.environ),
        opts=slurm_jobs.Options(time="20", ranks_per_node=1), log=lambda m: None)), daemon=True)
    thread.start()
    until(pid_file.exists, 120, "the job never ran")
    mine = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True).stdout.split("\n")
    (job,) = [line.split()[0] for line in mine if f" bisect-step-{os.getpid()}-" in line]
    subprocess.run(["scancel", job], check=True)
    thread.join(timeout=120)
    assert not thread.is_alive(), "the step still waits on a job that was cancelled"
    (r,) = got
    assert (r.verdict, r.reason) == ("skip", f"slurm job {job} CANCELLED"), r.reason
    assert not (tmp_path / "step.rc").exists()


def test_an_exit_code_the_file_system_does_not_show_yet_is_taken_from_slurm(tmp_path, monkeypatch):
    """On a shared file system the submitter may not see a job's exit-code file for a while after
    SLURM says the job ended (an NFS client's caches): the code is then SLURM's record of it."""
    monkeypatch.setattr(slurm_jobs, "_exit_code", lambda mark, job: None)  # the file never shows
    r = slurm_jobs.run([sys.executable, "-c", "print('marker: bug'); raise SystemExit(1)"], timeout=60,
                       log_stem=tmp_path / "step", signature="marker: bug", env=dict(os.environ),
                       opts=slurm_jobs.Options(time="10", ranks_per_node=1), log=lambda m: None)
    assert (r.code, r.verdict, r.returncode) == (contract.BAD, "bad", 1), r.reason


@pytest.mark.ddp
def test_a_bisect_step_as_a_job_is_judged_as_a_local_run(runner, tmp_path):
    opts = slurm_jobs.Options(time="20")
    r = slurm_jobs.run([sys.executable, FINETUNE, "--epochs", "4"], timeout=300, log_stem=tmp_path / "step",
                       signature=None, env=dict(os.environ), opts=opts, log=lambda m: None)
    # the local run: a fork of the session's preloaded runner (tests/test_equivalence.py)
    local = run_repro(runner, Path(FINETUNE), "--epochs", "4", log_stem=tmp_path / "local", timeout=300)
    assert r.code == local.code == contract.BAD
    assert r.record["details"]["first_diverging_epoch"] == local.record["details"]["first_diverging_epoch"]


def test_a_round_of_probes_is_one_job_array_and_each_probe_gets_its_own_task(tmp_path):
    """Three probes: one good run, one bad, one that ends without a run (as a cached verdict
    does). The two runs go out as one array of two tasks, each judged as a local run; a probe's
    second run (``--trials``) then goes out alone."""
    got: dict[str, list] = {}
    lines: list[str] = []
    opts = slurm_jobs.Options(time="10", ranks_per_node=1)

    def probe(name, codes):
        for i, code in enumerate(codes):
            said = f"print('marker: bug' if {code} else 'fine'); raise SystemExit({code})"
            cmd = [sys.executable, "-c", said]
            got.setdefault(name, []).append(slurm_jobs.run(
                cmd, timeout=60, log_stem=tmp_path / name / f"run{i}", signature="marker: bug",
                env=dict(os.environ), opts=opts))

    with slurm_jobs.array_round(3, opts, log=lines.append) as gathered:
        def thread(name, codes):
            try:
                probe(name, codes)
            finally:
                gathered.leave()

        threads = [threading.Thread(target=thread, args=a) for a in
                   (("good", [0, 0]), ("bad", [1]), ("cached", []))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        arrays = list(gathered.arrays)
    assert [r.code for r in got["good"]] == [contract.GOOD, contract.GOOD], got
    assert [r.code for r in got["bad"]] == [contract.BAD], got
    assert len(arrays) == 2, lines
    assert [line for line in lines if "array job" in line] == [
        f"[slurm] array job {arrays[0]}: 2 task(s), one per probe of the round",
        f"[slurm] array job {arrays[1]}: 1 task(s), one per probe of the round"]
    assert slurm_jobs._ROUND is None


def test_a_parallel_commit_bisect_on_slurm_runs_one_array_per_round(tmp_path, monkeypatch, capsys):
    import test_bisect

    from tools.environments import envs
    from tools.stages import bisect_options

    monkeypatch.setattr(envs, "ensure", lambda name, args, python="3.11", log=None: Path(sys.executable))
    monkeypatch.setattr(envs, "plan", test_bisect.fake_plan)
    monkeypatch.setattr(envs, "install_plan", lambda *args: test_bisect.fake_plan([]))
    monkeypatch.setattr(envs, "era_torch", lambda moment: "2.13.0")
    monkeypatch.setattr(bisect_options, "CACHE", tmp_path / "cache")
    repo, shas = test_bisect.make_repo(tmp_path / "lightning")
    assert test_bisect.cli(tmp_path, repo.working_dir, "--good", "1.0.0", "--bad", "master", "--jobs", "3",
                           "--executor", "slurm", "--time", "10") == 0
    data = json.loads((tmp_path / "out" / "report.json").read_text())["commits"]
    assert data["outcome"]["first_bad"] == shas[7]
    out = capsys.readouterr().out
    arrays = [line for line in out.splitlines() if "[slurm] array job" in line]
    rounds = [line for line in out.splitlines() if line.lstrip().startswith("[round ")]
    assert rounds and len(arrays) == len(rounds), out[-3000:]
    assert any(": 3 task(s)" in line for line in arrays), arrays


PROBE_ROUND = '''
import os, sys
from tools.stages import bisect
from tools.launch import slurm_jobs
here, opts = sys.argv[1], slurm_jobs.Options(time="10", ranks_per_node=1)

def test(c):
    slow = f"import pathlib, time; pathlib.Path({here!r}, {c!r} + '.started').touch(); time.sleep(300)"
    r = slurm_jobs.run([sys.executable, "-c", slow], timeout=400, log_stem=f"{here}/{c}", signature="x",
                       env=dict(os.environ), opts=opts)
    return r.code, r.reason, r.final

b = bisect.Bisector(list("abcd"), test, str, bisect.State(None), jobs=2,
                    round_scope=lambda n: slurm_jobs.array_round(n, opts))
try:
    b.probe([1, 2])
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
'''


def test_ctrl_c_during_a_round_cancels_its_job_array(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", PROBE_ROUND, str(tmp_path)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        started = [tmp_path / "b.started", tmp_path / "c.started"]
        while not all(p.exists() for p in started):  # both tasks of the one array are running
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted" in out, out
    queued = subprocess.run(["squeue", "-h", "-o", "%j %T"], capture_output=True, text=True).stdout
    left = [line for line in queued.splitlines() if line.startswith(f"bisect-round-{proc.pid}-")
            and line.split()[-1] in ("RUNNING", "PENDING")]  # cancelled ones may still be completing
    assert not left, queued
