import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, alive

from tools.core import contract
from tools.launch import harness

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "dead_peer.py")


def script(tmp_path, body: str) -> list[str]:
    path = tmp_path / "s.py"
    path.write_text(body)
    return [sys.executable, str(path)]


def test_verdict_line_and_logs_are_kept(tmp_path):
    cmd = script(tmp_path, "import json,sys\nprint('hello')\n"
                           "print(json.dumps({'verdict':'bad','exit_code':1,'signature':'s'}))\n"
                           "sys.exit(1)\n")
    r = harness.run(cmd, timeout=30, log_stem=tmp_path / "logs" / "run")
    assert (r.code, r.verdict, r.reason) == (1, "bad", "s")
    assert open(r.stdout_path).read().startswith("hello\n")


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="no autogroups in this kernel: "
                    "a run's share of the CPU is its processes' own niceness, which it inherits")
def test_a_run_keeps_the_niceness_of_the_process_that_starts_it(tmp_path):
    # each run leads a session of its own, and with autogroups a new session's share of the CPU
    # is weighed by the session's own nice value, 0 from the start: `nice nox ...` would not be
    # nice where it matters. Both kinds of run, started by a process 3 nicer than this one.
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from tools.launch import harness\n"
        "os.nice(3)\n"
        "show = 'print(open(\"/proc/self/autogroup\").read().split()[-1])'\n"
        f"r = harness.run([sys.executable, '-c', show], timeout=60, log_stem={str(tmp_path / 'new')!r})\n"
        f"f = harness.run_forked(lambda: exec(show), timeout=60, log_stem={str(tmp_path / 'fork')!r})\n"
        "gone = [harness.run([p], timeout=60) for p in sys.argv[1:]]\n"
        "print(os.getpriority(os.PRIO_PROCESS, 0), open(r.stdout_path).read().strip(),\n"
        "      open(f.stdout_path).read().strip(), *(g.reason.startswith('could not start') for g in gone),\n"
        "      *(g.code for g in gone))\n")
    # programs exec cannot start, whatever a shell would make of them: as at nice 0, Popen's error
    text = tmp_path / "text"
    text.write_text("echo ran as a shell script\n")
    text.chmod(0o755)
    cannot = ["/no/such/program", str(tmp_path), str(text)]
    proc = subprocess.run([sys.executable, str(driver), *cannot], capture_output=True, text=True,
                          timeout=120)
    nice, fresh, forked, *gone = proc.stdout.split()
    assert int(nice) == min(os.getpriority(os.PRIO_PROCESS, 0) + 3, 19), proc.stderr
    assert (fresh, forked) == (nice, nice)  # as each run began: set before its own code starts
    assert gone == ["True"] * 3 + [str(contract.FAIL)] * 3, proc.stdout


def test_timeout_kills_the_whole_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    cmd = script(tmp_path, "import subprocess,sys,time\n"
                           "p=subprocess.Popen([sys.executable,'-c','import time; time.sleep(600)'])\n"
                           f"open({str(pidfile)!r},'w').write(str(p.pid))\ntime.sleep(600)\n")
    start = time.monotonic()
    r = harness.run(cmd, timeout=3)
    assert time.monotonic() - start < 15
    assert (r.code, r.verdict) == (125, "skip") and "timed out" in r.reason
    assert r.leftovers == [] and not alive(int(pidfile.read_text()))


@pytest.mark.ddp
@pytest.mark.timeout(120)
@pytest.mark.parametrize("launch", [[], ["fork"]], ids=["new_interpreter", "forked_rank"])
def test_rank_blocked_in_a_collective_after_rank0_dies_is_ended(tmp_path, launch):
    pids = tmp_path / "pid"
    start = time.monotonic()
    r = harness.run([sys.executable, FIXTURE, "leader-dies", str(pids), *launch], timeout=90,
                    log_stem=tmp_path / "run")
    assert time.monotonic() - start < 60  # ended when the leader died, not at the limit
    assert r.returncode == 1 and (r.code, r.verdict) == (125, "skip")
    assert "AssertionError: rank died" in r.reason
    rank1 = int((tmp_path / "pid.1").read_text())
    assert r.leftovers == [] and not alive(rank1)


@pytest.mark.ddp
@pytest.mark.timeout(120)
@pytest.mark.parametrize("launch", [[], ["fork"]], ids=["new_interpreter", "forked_rank"])
def test_leader_blocked_after_its_peer_died_is_ended(tmp_path, launch):
    pids = tmp_path / "pid"
    r = harness.run([sys.executable, FIXTURE, "peer-dies", str(pids), *launch], timeout=90,
                    peer_grace=3)
    assert (r.code, r.reason) == (125, "a rank died and its peer did not exit; process group killed")
    assert r.seconds < 60
    assert not alive(int((tmp_path / "pid.0").read_text()))
    assert json.dumps(r.to_dict())  # serialisable for the results files


ORPHAN = """import os, sys, time
if os.fork() == 0:  # a child in a group of its own, still in the run's session: it outlives the run
    os.setpgid(0, 0)
    open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.05)
    os._exit(0)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


def state(pid: int) -> tuple[str, int] | None:
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def test_a_process_that_leaves_its_runs_group_but_not_its_session_is_killed_and_reaped(tmp_path):
    """A child that moved to a group of its own (``setpgid``, a shell's job control) inside the
    run's session outlives the kill of the run's group: it is killed too, named in the run's
    ``leftovers``, and reaped (it came back to us, the subreaper: no zombie piles up either)."""
    pid_file, never = tmp_path / "orphan.pid", tmp_path / "never"
    r = harness.run([sys.executable, "-c", ORPHAN, str(pid_file), str(never)], timeout=60,
                    log_stem=tmp_path / "r")
    assert r.code == 0, r.reason
    pid = int(pid_file.read_text())
    assert pid in r.leftovers, r.leftovers
    assert state(pid) is None, state(pid)  # neither alive nor our zombie


def test_a_helper_process_that_ends_is_not_a_dead_rank(tmp_path):
    # a script that runs a 3 s helper (a compile step, a git call) and then keeps working
    cmd = script(tmp_path, "import subprocess, sys, time\n"
                           "subprocess.run([sys.executable, '-c', 'import time; time.sleep(3)'])\n"
                           "time.sleep(6)\nprint('done')\n")
    r = harness.run(cmd, timeout=60, peer_grace=1)
    assert (r.code, r.verdict) == (0, "good"), r.reason


def test_a_rank_declared_by_a_launcher_that_dies_ends_the_run(tmp_path):
    # a rank forked by the repro (repro/_launch.py) is declared in the harness's ranks file
    cmd = script(tmp_path, "import os, sys, time\n"
                           f"sys.path.insert(0, {str(ROOT / 'repro')!r})\nimport _launch\n"
                           "if _launch.fork_ranks(2) == 1:\n    time.sleep(1)\n    os._exit(3)\n"
                           "time.sleep(120)\n")
    r = harness.run(cmd, timeout=100, peer_grace=1)
    assert r.reason == "a rank died and its peer did not exit; process group killed"
    assert r.seconds < 30


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_a_healthy_ddp_run_with_dataloader_workers_is_good(tmp_path):
    # real Lightning DDP, two ranks started by Lightning's launcher, each with 2 loader workers
    # that end at every epoch end: none of them is a rank
    r = harness.run([sys.executable, str(ROOT / "tests" / "fixtures" / "loader_workers.py"), "4"],
                    timeout=200, peer_grace=2, log_stem=tmp_path / "run")
    assert (r.code, r.verdict) == (0, "good"), (r.reason, open(r.stderr_path).read()[-2000:])
    assert "trained 4 epochs" in open(r.stdout_path).read()


USER_SCRIPT = os.path.join(os.path.dirname(__file__), "fixtures", "user_hash_check.py")


@pytest.mark.ddp
@pytest.mark.timeout(300)
@pytest.mark.parametrize("extra, code", [([], 1), (["--no-callback"], 0)])
def test_a_users_own_script_is_judged_by_its_signature(tmp_path, extra, code):
    from tools import run

    out = tmp_path / "out"
    rc = run.main(["--timeout", "240", "--signature", "AssertionError: replicas differ",
                   "--log", str(out), "--", sys.executable, USER_SCRIPT, *extra])
    assert rc == code, open(f"{out}.stderr").read()[-3000:]


@pytest.mark.parametrize("signature, code", [("ValueError: the bug", 1), ("not printed", 125)])
def test_a_signature_printed_before_a_crash_at_exit_still_counts(tmp_path, signature, code):
    # a run that shows the bug and then aborts at interpreter exit (as torch 2.13 + gloo sometimes
    # does) is bad only if the signature really was printed; a timeout or a kill never is
    cmd = script(tmp_path, "import os, sys\nprint('ValueError: the bug', file=sys.stderr, flush=True)\n"
                           "os.abort()\n")
    r = harness.run(cmd, timeout=30, signature=signature)
    assert r.returncode == -6 and r.code == code, r.reason


# -- faults around the run: its logs, its output, what it leaves behind ----------------------

SIGNATURE_SCRIPT = "import sys\nprint('oops: the bug')\nsys.exit(1)\n"


@pytest.mark.parametrize("which", ["stdout", "stderr"])
def test_a_log_that_cannot_be_written_is_a_harness_failure_never_a_verdict(tmp_path, which):
    # /dev/full answers every write with ENOSPC, as a full disk does
    stem = tmp_path / "logs" / "run"
    stem.parent.mkdir()
    (tmp_path / "logs" / f"run.{which}").symlink_to("/dev/full")
    body = f"import sys\nprint('oops: the bug', file=sys.{which})\nsys.exit(1)\n"
    r = harness.run(script(tmp_path, body), timeout=30, log_stem=stem, signature="oops: the bug")
    assert (r.code, r.verdict) == (128, "error"), r.reason
    assert "cannot write the run's logs" in r.reason and "the disk is full" in r.reason


def test_a_log_folder_that_cannot_be_made_is_a_harness_failure(tmp_path):
    (tmp_path / "file").write_text("")
    r = harness.run(script(tmp_path, SIGNATURE_SCRIPT), timeout=30, log_stem=tmp_path / "file" / "run",
                    signature="oops")
    assert r.code == 128 and "cannot write the run's logs" in r.reason


def test_a_huge_output_is_streamed_to_the_logs_and_its_signature_still_counts(tmp_path):
    import resource

    # the signature comes first, then 100 MB: far beyond what is kept in memory for the verdict
    body = ("import sys\nprint('oops: the bug', flush=True)\nline = 'x' * 1023 + '\\n'\n"
            "for _ in range(100 * 1024):\n    sys.stdout.write(line)\nsys.exit(1)\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = harness.run(script(tmp_path, body), timeout=120, log_stem=tmp_path / "run", signature="oops: the bug")
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024  # MB (Linux: kB)
    assert (r.code, r.verdict) == (1, "bad"), r.reason
    assert os.path.getsize(r.stdout_path) == 100 * 1024 * 1024 + len("oops: the bug\n")
    assert grown < 50, f"the harness grew by {grown:.0f} MB for 100 MB of output"


def test_a_daemon_the_run_starts_is_killed_and_reported(tmp_path):
    # it leaves the run's process group on purpose (a new session), and outlives the run
    pidfile = tmp_path / "daemon.pid"
    body = ("import os, subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],\n"
            "                     start_new_session=True)\n"
            f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n")
    r = harness.run(script(tmp_path, body), timeout=60)
    daemon = int(pidfile.read_text())
    assert r.verdict == "good" and r.leftovers == [daemon]
    assert not alive(daemon)


def test_a_harness_started_in_the_background_still_gives_its_runs_ctrl_c(tmp_path):
    """``nox ... &`` starts the harness with SIGINT ignored, and its children would inherit that:
    a repro of Ctrl-C (it sends itself SIGINT) would then run on as if the bug were gone."""
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "sys.path.insert(0, '.'); from tools.launch import harness\n"
            "r = harness.run([sys.executable, '-c', 'import os, signal, time; os.kill(os.getpid(), "
            "signal.SIGINT); time.sleep(5); print(\"ignored\")'], timeout=60)\n"
            "print(r.returncode)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120).stdout
    assert out.strip().splitlines()[-1] == str(-signal.SIGINT)


def test_a_program_started_in_the_background_still_stops_on_sigint(tmp_path):
    code = ("import signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "sys.path.insert(0, '.'); from tools.core import contract\n"
            "def main(argv):\n    import os; os.kill(os.getpid(), signal.SIGINT); time.sleep(5); return 0\n"
            "sys.exit(contract.run_main(main, []))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr.strip()) == (130, "interrupted")
