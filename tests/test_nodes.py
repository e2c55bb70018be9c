"""Several nodes of one job on this machine (tools/nodes.py): one torchrun per node with the c10d
rendezvous, the job's verdict from global rank 0, the workers' own exit codes, and a dead node
never leaving the others blocked. The workers here are tiny scripts (no DDP); the ``ddp`` tests
run the real repros as 2 nodes x 1 rank and compare with one node."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tools.core import contract
from tools.launch import nodes

ROOT = Path(__file__).resolve().parent.parent

WORKER = textwrap.dedent('''
    import json, os, sys, time
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    mode = sys.argv[1]
    print(f"rank {rank} of {world} on node {os.environ['GROUP_RANK']}", flush=True)
    if mode == "verdict":
        code = int(sys.argv[2])
        if rank == 0:
            verdict = {0: "good", 1: "bad", 125: "skip"}[code]
            print(json.dumps({"repro": "t", "verdict": verdict, "exit_code": code}), flush=True)
        os._exit(code)
    if mode == "one-dies":  # the last rank crashes; the others would wait for it forever
        if rank == world - 1:
            os._exit(3)
        time.sleep(600)
    if mode == "signature":
        if rank == 1:
            raise AttributeError("'NoneType' object has no attribute 'reducer'")
        time.sleep(1)
''')


@pytest.fixture
def worker(tmp_path) -> Path:
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return path


def job(worker: Path, tmp_path: Path, *args: str, n: int = 2, per: int = 1, **kw) -> nodes.JobResult:
    return nodes.run_job([sys.executable, str(worker), *args], nodes=n, per_node=per, timeout=120,
                         log_stem=tmp_path / "logs" / "job", **kw)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("code", [0, 1, 125])
def test_the_verdict_is_rank_0s_with_the_workers_own_exit_code(worker, tmp_path, code):
    r = job(worker, tmp_path, "verdict", str(code), n=2, per=2)
    assert r.code == code  # torchrun itself exits 1 for any failure: 125 must not become "bad"
    assert r.record and r.record["exit_code"] == code
    assert len(r.nodes) == 2
    if code:  # every rank of every node exited with the same code
        assert r.ranks == {0: code, 1: code, 2: code, 3: code}
    outputs = "".join(Path(n["stdout"]).read_text() for n in r.nodes)
    # the ranks of a node share its stdout: a print's text and its newline are two writes, and
    # another rank's may land between them; each text itself is one write
    assert sorted(re.findall(r"rank \d of 4", outputs)) == [f"rank {i} of 4" for i in range(4)]


@pytest.mark.timeout(300)
def test_a_dead_node_never_leaves_the_others_blocked(worker, tmp_path):
    started = time.monotonic()
    r = job(worker, tmp_path, "one-dies", n=2, per=1, peer_grace=5)
    took = time.monotonic() - started
    assert took < 60  # the survivor (sleeping 600 s) was killed soon after the grace
    assert r.code == contract.SKIP  # no verdict line, no signature: cannot test
    assert r.ranks.get(1) == 3


@pytest.mark.timeout(300)
def test_a_signature_on_any_node_is_bad_without_a_verdict_line(worker, tmp_path):
    # node 0's agent waits for the failed node at its exit barrier: a short grace ends it
    r = job(worker, tmp_path, "signature", signature="'NoneType' object has no attribute 'reducer'",
            peer_grace=3)
    assert r.code == contract.BAD
    r = job(worker, tmp_path, "signature", signature="something else entirely", peer_grace=3)
    assert r.code == contract.SKIP


def test_failure_reports_are_read_per_rank():
    text = ("Root Cause (first observed failure):\n[0]:\n  time      : x\n  host      : vm\n"
            "  rank      : 3 (local_rank: 1)\n  exitcode  : 125 (pid: 7)\n"
            "Failures:\n[1]:\n  rank      : 2 (local_rank: 0)\n  exitcode  : -9 (pid: 8)\n")
    assert nodes.failed_ranks(text) == {3: 125, 2: -9}


def test_bad_input_is_one_line_and_exit_129_as_tools_run():
    done = subprocess.run([sys.executable, "-m", "tools.nodes", "--nodes", "0", "--", sys.executable, "x.py"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 129 and len(done.stderr.strip().splitlines()) == 1
    done = subprocess.run([sys.executable, "-m", "tools.nodes", "--nodes", "2"], capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 129 and "give the command" in done.stderr


def test_the_command_line_prints_the_result_as_json(worker, tmp_path):
    done = subprocess.run([sys.executable, "-m", "tools.nodes", "--nodes", "2", "--log",
                           str(tmp_path / "l" / "run"), "--", sys.executable, str(worker), "verdict", "1"],
                          capture_output=True, text=True, cwd=ROOT, timeout=200)
    assert done.returncode == 1
    assert json.loads(done.stdout.strip().splitlines()[-1])["verdict"] == "bad"


def test_a_matrix_says_how_each_repro_runs_on_several_nodes(tmp_path):
    from tools.environments import matrix

    m = matrix.load()
    assert {r.name: r.multinode for r in m.repros}["20340"] == "torchrun"
    assert {r.name: r.multinode for r in m.repros}["20706-stress"] == "self"
    bad = tmp_path / "m.toml"
    bad.write_text('torch = ["2.13.0"]\n[[repro]]\nname = "x"\nscript = "x.py"\nmultinode = "mpi"\n')
    with pytest.raises(ValueError, match="multinode is 'torchrun' or 'self'"):
        matrix.load(bad)


def test_a_one_node_repro_is_a_not_run_row_with_several_nodes(tmp_path, monkeypatch):
    from tools.environments import matrix
    from tools.stages import cells

    path = tmp_path / "m.toml"
    path.write_text('torch = ["2.13.0"]\n[lightning]\npytorch-lightning = ["2.6.6"]\n'
                    '[[repro]]\nname = "resume"\nscript = "repro/last_batch_resume.py"\n')
    monkeypatch.setenv("REPRO_MATRIX", str(path))
    m = matrix.load()
    outcome = cells.run_cell(m.cells[0], m, sys.executable, tmp_path / "out", [], 60, log=lambda _: None,
                             nodes=2, ranks_per_node=1)
    assert outcome["results"]["resume"]["verdict"] == "skip"
    assert "one node only" in outcome["results"]["resume"]["reason"]
    assert outcome["launch"].endswith("2 nodes x 1 ranks")


@pytest.mark.parametrize(("args", "message"), [
    (["--ranks-per-node", "2"], "goes with --nodes"),
    (["--nodes", "0"], "must be >= 1"),
    (["--executor", "pbs"], "invalid choice"),
])
def test_bad_node_options_are_refused(args, message, capsys):
    from tools.stages import cells

    with pytest.raises(SystemExit) as exc:
        cells.parse_posargs(args)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_a_harness_failure_on_every_node_is_never_a_verdict(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a log folder that is a file: the harness cannot start a node
    r = nodes.run_job([sys.executable, "-c", "pass"], nodes=2, per_node=1, timeout=30,
                      log_stem=blocked / "sub" / "run")
    assert r.code == contract.FAIL and "harness failure" in r.reason


def test_rank_0_good_while_another_rank_fails_is_cannot_test():
    out = '{"repro": "t", "verdict": "good", "exit_code": 0}\n'
    err = "  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 9)\n"
    j = nodes.judge_merged(1, out, err, None)  # srun: the highest code of its tasks
    assert j.code == contract.SKIP and "another rank exited 1" in j.reason
    j = nodes.judge_merged(125, '{"repro": "t", "verdict": "bad", "exit_code": 1}\nrank 1 line\n', "", None)
    assert j.code == contract.BAD  # rank 0's verdict line, with its own code, decides


@pytest.mark.timeout(300)
def test_rank_0_good_with_a_failed_peer_on_its_node_is_cannot_test(tmp_path):
    worker = tmp_path / "w.py"
    worker.write_text(textwrap.dedent('''
        import json, os
        rank = int(os.environ["RANK"])
        if rank == 0:
            print(json.dumps({"repro": "t", "verdict": "good", "exit_code": 0}), flush=True)
        os._exit(0 if rank == 0 else 125)
    '''))
    r = nodes.run_job([sys.executable, str(worker)], nodes=1, per_node=2, timeout=120,
                      log_stem=tmp_path / "l" / "job")
    assert r.code == contract.SKIP and "rank 1 exited 125" in r.reason


def test_inside_a_multi_node_allocation_srun_launches_the_torchrun_repros(tmp_path, monkeypatch):
    """The branch of a SLURM job of several nodes, with a stand-in ``srun`` on PATH (the local
    cluster has one node): srun's merged output and highest exit code are judged as rank 0's."""
    from tools.environments import matrix
    from tools.stages import cells

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\n'
                                  'echo "srun task 1 says hello"\n"$@"\n'
                                  'exit 125\n')  # another task exited 125: srun gives the highest
    (bin_dir / "srun").chmod(0o755)
    script = tmp_path / "repro.py"
    script.write_text('import json, sys\nprint("nodes", sys.argv[1:])\n'
                      'print(json.dumps({"repro": "t", "verdict": "bad", "exit_code": 1}))\nsys.exit(1)\n')
    path = tmp_path / "m.toml"
    path.write_text('torch = ["2.13.0"]\n[lightning]\npytorch-lightning = ["2.6.6"]\n'
                    f'[[repro]]\nname = "t"\nscript = "{script}"\nmultinode = "torchrun"\n')
    monkeypatch.setenv("REPRO_MATRIX", str(path))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    m = matrix.load()
    outcome = cells.run_cell(m.cells[0], m, sys.executable, tmp_path / "out", [], 60, log=lambda _: None,
                             nodes=2, ranks_per_node=1, allocation={"SLURM_JOB_ID": "7"})
    result = outcome["results"]["t"]
    assert result["verdict"] == "bad" and result["record"]["exit_code"] == 1
    assert "--num-nodes', '2', '--devices', '1'" in Path(result["stdout_path"]).read_text()
    assert (tmp_path / "out" / "cells" / f"{m.cells[0].id}.json").exists()
