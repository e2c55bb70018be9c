"""Run one program as several nodes of one job on this machine, launched as a cluster does it.

    python -m tools.nodes --nodes 2 --ranks-per-node 1 [--timeout S] [--signature REGEX]
                          [--log STEM] -- python repro/backbone_finetuning_ddp.py --num-nodes 2 --devices 1

Every node is one ``torchrun`` (``python -m torch.distributed.run``, the interpreter of the
command) with ``--nnodes``, ``--node-rank``, ``--nproc-per-node`` and the c10d rendezvous on a
free local port, as each node of a cluster job would start it; each runs under the harness (its
own process group, the wall-clock limit, a rank that died and a launcher that did not follow).
**A dead node never leaves the others blocked**: once one node has ended, the others get
``--peer-grace`` seconds to end too, then their groups are killed.

One verdict for the job: global rank 0's verdict line (whichever node it landed on: c10d assigns
node ranks by arrival), judged by the contract with the exit code its own processes had (torchrun
exits 1 for any failed worker, so the workers' codes are read from its failure report). A node
that failed while rank 0 says good makes the job "cannot test"; without a verdict line (a user's
script and ``--signature``), the job is bad when any node shows the signature. Exit codes: the
contract's, as ``tools.run``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.core import contract, results
from tools.launch import harness

# torchrun's failure report: "rank      : 3 (local_rank: 1)" then "exitcode  : 125 (pid: ...)"
FAILED_RANK = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


@dataclass
class JobResult(harness.RunResult):
    """The verdict of the whole job (rank 0's), as one run's, with its nodes and ranks."""

    nodes: list[dict] = field(default_factory=list)  # each node's harness result
    ranks: dict[int, int] = field(default_factory=dict)  # exit code of each failed rank


def torchrun(python: str, nodes: int, per_node: int, node_rank: int, endpoint: str, run_id: str,
             argv: list[str]) -> list[str]:
    return [python, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--node-rank={node_rank}",
            f"--nproc-per-node={per_node}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={run_id}", "--max-restarts=0", "--monitor-interval=0.5", *argv]


def failed_ranks(stderr: str) -> dict[int, int]:
    """Global rank -> exit code of every worker torchrun reports as failed."""
    return {int(rank): int(code) for rank, code in FAILED_RANK.findall(stderr)}


def verdict_last(stdout: str) -> str:
    """``stdout`` with its verdict line moved to the end: the other ranks of rank 0's node share
    its stdout, and may print after it."""
    lines = stdout.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if contract.parse_verdict_line(lines[i]) is not None:
            return "\n".join(lines[:i] + lines[i + 1:] + [lines[i]]) + "\n"
    return stdout


def _read(path: str | None) -> str:
    return Path(path).read_text(errors="replace") if path and Path(path).exists() else ""


def run_job(cmd: list[str], *, nodes: int, per_node: int, timeout: float, log_stem: str | Path,
            signature: str | None = None, peer_grace: float = 20.0, env: dict | None = None,
            progress=None) -> JobResult:
    """Run ``cmd`` (``python script.py ...``: the interpreter starts torchrun) as ``nodes`` nodes
    of ``per_node`` ranks; its verdict (see the module docstring)."""
    if nodes < 1 or per_node < 1:
        raise contract.BadInput("--nodes and --ranks-per-node must be >= 1")
    python, argv = cmd[0], cmd[1:]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{sock.getsockname()[1]}"
    run_id = f"nodes-{time.time_ns()}"
    stop = threading.Event()
    found: list[harness.RunResult | None] = [None] * nodes
    started = time.monotonic()

    def node(i: int) -> None:
        try:
            found[i] = harness.run(torchrun(python, nodes, per_node, i, endpoint, run_id, argv),
                                   timeout=timeout, log_stem=f"{log_stem}.node{i}", env=env,
                                   peer_grace=peer_grace, stop=stop, signature=signature)
        except Exception as err:  # the harness itself failed for this node: never a verdict
            found[i] = harness.RunResult(contract.FAIL, "error", f"node {i}: harness failure: "
                                         f"{type(err).__name__}: {err}", 0.0, None)
            stop.set()

    threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in range(nodes)]
    for t in threads:
        t.start()
    try:
        while all(t.is_alive() for t in threads):
            time.sleep(0.1)
        first = time.monotonic()
        for t in threads:  # the others get peer_grace to end on their own
            t.join(max(0.0, peer_grace - (time.monotonic() - first)))
        if any(t.is_alive() for t in threads):
            if progress:
                progress(f"a node ended {peer_grace:g} s ago and the others did not: killing them")
            stop.set()
        for t in threads:
            t.join()
    except BaseException:  # Ctrl-C, SIGTERM: every node's group is killed before leaving
        stop.set()
        for t in threads:
            t.join()
        raise
    done = [r if r is not None else harness.RunResult(contract.FAIL, "error", f"node {i}: no result",
                                                      0.0, None) for i, r in enumerate(found)]
    return judge_job(done, signature, time.monotonic() - started)


STOPPED = ("timed out after", "a rank died", "another node")  # the harness's own reasons (contract.judge)


def judge_merged(rc: int, stdout: str, stderr: str, signature: str | None) -> contract.Judgement:
    """The verdict of a launcher that merges its ranks' output and exit codes (``srun`` exits
    with the highest code of its tasks): rank 0's verdict line, with rank 0's own code."""
    stdout = verdict_last(stdout)
    record = contract.parse_verdict_line(stdout)
    if record is None or record.get("exit_code") == rc or not isinstance(record.get("exit_code"), int):
        return contract.judge(rc, stdout, stderr, signature=signature)
    said = record["exit_code"]
    if said == contract.GOOD:
        return contract.Judgement(contract.SKIP, f"rank 0 says good but another rank exited {rc}",
                                  record, False)
    return contract.judge(said, stdout, stderr, signature=signature)


def judge_job(found: list[harness.RunResult], signature: str | None, seconds: float) -> JobResult:
    failed = next((r for r in found if r.code >= contract.FAIL and r.returncode is None), None)
    if failed is not None:  # the harness failed on a node: no verdict for the job
        nodes = [{"node": i, "verdict": r.verdict, "reason": r.reason} for i, r in enumerate(found)]
        return JobResult(contract.FAIL, "error", failed.reason, round(seconds, 2), None, nodes=nodes)
    outputs = [(verdict_last(_read(r.stdout_path)), _read(r.stderr_path)) for r in found]
    ranks: dict[int, int] = {}
    for _, err in outputs:
        ranks.update(failed_ranks(err))
    summary = [{"node": i, "verdict": r.verdict, "reason": r.reason, "returncode": r.returncode,
                "seconds": r.seconds, "stdout": r.stdout_path, "stderr": r.stderr_path}
               for i, r in enumerate(found)]

    def result(code: int, reason: str | None, record=None) -> JobResult:
        return JobResult(code, contract.name(code), reason, round(seconds, 2), None, record,
                         nodes=summary, ranks=ranks, final=code in (contract.GOOD, contract.BAD))

    judged = []
    for (out, err), r in zip(outputs, found, strict=True):
        if r.returncode is None or r.returncode < 0 or (r.reason or "").startswith(STOPPED):
            judged.append(r)  # stopped by the harness: its judgement stands
            continue
        codes = failed_ranks(err)
        if r.returncode == 0:
            rc = 0
        elif contract.parse_verdict_line(out) is not None:  # global rank 0 is on this node
            rc = codes.get(0, contract.GOOD)  # its own code (torchrun reports failed workers only)
        else:
            rc = codes.popitem()[1] if len(set(codes.values())) == 1 else r.returncode
        j = contract.judge(rc, out, err, signature=signature)
        judged.append(harness.RunResult(j.code, contract.name(j.code), j.reason, r.seconds, rc, j.record))
    lead = next((i for i, j in enumerate(judged) if j.record is not None), None)
    if lead is not None:
        head = judged[lead]
        others = [f"node {i}: {j.verdict} ({j.reason})" for i, j in enumerate(judged)
                  if i != lead and j.code not in (contract.GOOD, head.code)]
        others += [f"rank {k} exited {c}" for k, c in ranks.items() if k != 0 and c != head.code]
        if head.code == contract.GOOD and others:
            return result(contract.SKIP, f"rank 0 says good but {others[0]}", head.record)
        return result(head.code, head.reason, head.record)
    bad = [j for j in judged if j.code == contract.BAD]
    if bad:
        return result(contract.BAD, bad[0].reason)
    if all(j.code == contract.GOOD for j in judged):
        return result(contract.GOOD, None)
    worst = next(j for j in judged if j.code != contract.GOOD)
    return result(worst.code if worst.code != contract.BAD else contract.SKIP,
                  f"node {judged.index(worst)}: {worst.reason}")


def main(argv=None) -> int:
    p = contract.Parser(prog="python -m tools.nodes", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=2, help="nodes of the job, each a torchrun here")
    p.add_argument("--ranks-per-node", type=int, default=1, help="ranks each torchrun starts")
    p.add_argument("--timeout", type=contract.seconds, default=600.0, metavar="SECONDS",
                   help="wall-clock limit of each node")
    p.add_argument("--peer-grace", type=contract.seconds, default=20.0,
                   help="seconds the other nodes get to end once one has ended")
    p.add_argument("--signature", help="regex that must appear in the output for 'bad'")
    p.add_argument("--log", help="logs: LOG.nodeN.stdout/.stderr (default: a new folder under "
                                 "results/nodes/, so two jobs at once never share one)")
    p.add_argument("cmd", nargs=argparse.REMAINDER,
                   help="the program each node runs (a .py script, after --)")
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if len(cmd) < 2:
        raise contract.BadInput("give the command after --: PYTHON SCRIPT [ARGS]")
    if args.timeout <= 0 or args.peer_grace < 0:
        raise contract.BadInput("--timeout must be > 0 and --peer-grace >= 0")
    args.log = args.log or str(results.run_dir("nodes") / f"job-{os.getpid()}")
    try:
        Path(args.log).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{args.log}.node0.stdout").touch()
    except OSError as err:
        raise contract.BadInput(f"--log {args.log}: cannot write there ({err.strerror})") from None
    contract.check_signature(args.signature)
    result = run_job(cmd, nodes=args.nodes, per_node=args.ranks_per_node, timeout=args.timeout,
                     log_stem=args.log, signature=args.signature, peer_grace=args.peer_grace,
                     progress=lambda m: print(f"[nodes] {m}", file=sys.stderr, flush=True))
    print(json.dumps(result.to_dict(), default=str))
    return result.code


if __name__ == "__main__":
    sys.exit(contract.bisect_entry(main))
