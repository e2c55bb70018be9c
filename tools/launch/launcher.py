"""How a run is launched, decided in one place.

A ``Run`` describes one run: the program (a workspace repro, a user's script, any command), the
interpreter of its environment, its variables and folder, its time limit, the signature that
makes it bad, where its logs go, and what it is (one of the workspace's repros may be a fork of a
preloaded runner; how it runs on several nodes). A ``Launcher`` is made once from the options
(``How``: a fresh interpreter for every run or forks of a preloaded runner, N torchrun nodes on
this machine or ``srun`` inside a SLURM allocation, a SLURM job per run) and turns every
``Run`` into one ``harness.RunResult``, judged by the contract. Callers (the matrix cells, the
bisect, the minimizer, the patch validation) describe runs; none of them knows how another
launches one.

The floors below it, each knowing nothing of the ones above: ``harness`` (one process group
under a limit, judged), ``preloaded`` (forks of one import), ``nodes`` (torchrun nodes),
``slurm_jobs`` (a SLURM job).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from tools.core import contract
from tools.launch import harness, leftovers, nodes, sandbox, slurm_jobs
from tools.launch.preloaded import Runner

ROOT = Path(__file__).resolve().parents[2]  # the workspace: on the path of tools.nodes in a sandbox
INJECT = ROOT / "tools" / "inject"  # put on a run's PYTHONPATH, never imported
@dataclass(frozen=True)
class Run:
    """One run. ``argv`` is the program and its arguments: a Python script run by ``python``
    (``kind="python"``), or a command run as it is (``kind="exec"``: a ``#!`` script, ``pytest``,
    anything), with ``python``'s ``bin`` first on ``PATH`` either way."""

    argv: tuple[str, ...]
    python: Path | None = None
    kind: str = "python"
    env: dict = field(default_factory=dict)  # on top of this process's environment
    cwd: Path | None = None
    timeout: float = 600.0
    signature: str | None = None  # bad when the output shows it (a script without a verdict line)
    bad_output: str | None = None  # bad when a run that exits 0 prints it (a behaviour, no exception)
    log_stem: Path | None = None
    own: bool = False  # one of the workspace's repros: it may run as a fork of a preloaded runner
    code: str = ""  # what the preloaded imports stand for (a bisect candidate): another is a new runner
    multinode: str | None = "torchrun"  # on several nodes: "torchrun" starts it on each node,
    # "self" gives it --nodes N --ranks-per-node R (it launches its own), None: one node only
    peer_grace: float = 30.0
    check_replicas: str | None = None  # "epoch" or N: the replica check injected (inject/)
    sandbox: bool | str = False  # untrusted code: True (the sandbox, tools/launch/sandbox.py), "network" (the
    # same with the machine's network) or "none" (no sandbox: --allow-unsandboxed, said by the caller)

    def command(self) -> list[str]:
        if self.kind == "python":
            return [str(self.python or sys.executable), *self.argv]
        return list(self.argv)

    def environment(self) -> dict:
        env = {**os.environ, **self.env}
        return harness.env_for(self.python, env) if self.python else env


@dataclass(frozen=True)
class How:
    """How runs are launched, from the options, once."""

    fresh: bool = False  # a new interpreter for every run (else own repros fork from a runner)
    nodes: int = 1
    ranks_per_node: int = 1
    slurm: slurm_jobs.Options | None = None  # each run one SLURM job (sbatch)
    allocation: dict | None = None  # inside a SLURM job of several nodes: srun launches them
    runner_stderr: Path | None = None  # where a preloaded runner's own messages go

    @property
    def label(self) -> str:
        """What the results call it (a cell's ``launch``)."""
        if self.slurm is not None:
            return "slurm job per run"
        where = f", {self.nodes} nodes x {self.ranks_per_node} ranks" if self.nodes > 1 else ""
        return ("fresh-process" if self.fresh or self.nodes > 1 else "preloaded") + where


class Launcher:
    """Turns ``Run``s into results as ``How`` says. Keeps one preloaded runner at a time (the one
    of the environment and variables of the last own repro): a run of another environment
    replaces it. Close it (or use it as a context manager) to stop the runner."""

    def __init__(self, how: How = How(), log=print):
        self.how, self.log = how, log
        self.runner: Runner | None = None
        self.runner_key: str | None = None
        self.forked: bool | None = None  # did the last preloaded run fork (False: the preload failed)

    def run(self, run: Run) -> harness.RunResult:
        if run.bad_output:
            return self._behaved(run)
        if run.check_replicas:
            return self._checked(run)
        if run.sandbox:
            return self._sandboxed(run)
        how = self.how
        if how.slurm is not None:
            return slurm_jobs.run(run.command(), timeout=run.timeout, log_stem=run.log_stem,
                                  signature=run.signature, env=run.environment(), opts=how.slurm)
        if how.nodes > 1:
            return self._nodes(run)
        if run.own and not how.fresh and run.kind == "python" and run.python:
            return self._preloaded(run)
        return harness.run(run.command(), timeout=run.timeout, log_stem=run.log_stem,
                           env=run.environment(), cwd=run.cwd, signature=run.signature,
                           peer_grace=run.peer_grace)

    def _preloaded(self, run: Run) -> harness.RunResult:
        key = f"{run.python}|{run.code}|{json.dumps(run.env, sort_keys=True)}"
        if key != self.runner_key:
            self.close()
            stderr = self.how.runner_stderr
            if stderr:
                stderr.parent.mkdir(parents=True, exist_ok=True)
            self.runner, self.runner_key = Runner(run.python, env=run.environment(), stderr=stderr), key
        job = {"argv": list(run.argv), "timeout": run.timeout, "signature": run.signature,
               "log_stem": str(run.log_stem) if run.log_stem else None}
        if run.cwd:
            job["cwd"] = str(run.cwd)
        result = self.runner.run(job)
        self.forked = self.runner.forked
        return result

    def _nodes(self, run: Run) -> harness.RunResult:
        how, argv = self.how, list(run.argv)
        if run.multinode == "self":
            argv += ["--nodes", str(how.nodes), "--ranks-per-node", str(how.ranks_per_node)]
            return harness.run(Run(tuple(argv), run.python, run.kind).command(), timeout=run.timeout,
                               log_stem=run.log_stem, env=run.environment(), cwd=run.cwd,
                               signature=run.signature)
        if run.multinode != "torchrun" or run.kind != "python":
            return harness.RunResult(contract.SKIP, "skip", "runs on one node only (no multinode in "
                                     "repro/matrix.toml)", 0.0, None)
        if run.own:
            argv += ["--num-nodes", str(how.nodes), "--devices", str(how.ranks_per_node)]
        python = str(run.python or sys.executable)
        if how.allocation:  # inside a SLURM job of several nodes: srun starts the ranks
            srun = ["srun", f"--nodes={how.nodes}", f"--ntasks-per-node={how.ranks_per_node}",
                    "--kill-on-bad-exit=1", python, *argv]
            res = harness.run(srun, timeout=run.timeout, log_stem=run.log_stem, signature=run.signature,
                              env={**run.environment(), **how.allocation}, cwd=run.cwd)
            if res.returncode is not None and res.returncode >= 0:  # srun merges its tasks
                text, err = (Path(p).read_text(errors="replace") for p in (res.stdout_path, res.stderr_path))
                j = nodes.judge_merged(res.returncode, text, err, run.signature)
                res.code, res.verdict, res.reason = j.code, contract.name(j.code), j.reason
                res.record = j.record
            return res
        return nodes.run_job([python, *argv], nodes=how.nodes, per_node=how.ranks_per_node,
                             timeout=run.timeout, log_stem=run.log_stem, signature=run.signature,
                             env=run.environment(), progress=self.log)

    def _behaved(self, run: Run) -> harness.RunResult:
        """``run`` judged by what it prints as well: a run that exits 0 (good by the contract) and
        prints ``bad_output`` behaves as the broken release does, and is bad. A regression that
        raises nothing (the triage's differential finds the line)."""
        result = self.run(replace(run, bad_output=None))
        if result.code == contract.GOOD and printed(result, run.bad_output, run.log_stem):
            result.code, result.verdict, result.final = contract.BAD, "bad", True
            result.reason = f"exit 0, but it prints /{run.bad_output}/: the broken release's behaviour"
        return result

    def _checked(self, run: Run) -> harness.RunResult:
        """``run`` with the replica check on its path (a fresh interpreter: the check hooks into
        torch as it is imported), judged with what the check reported."""
        with tempfile.TemporaryDirectory(prefix="replicas-") as tmp:
            # one report per process that checked, beside the logs when there are (a SLURM job
            # writes where the submitter reads)
            report = Path(f"{run.log_stem}.replicas") if run.log_stem else Path(tmp) / "replicas"
            shutil.rmtree(report, ignore_errors=True)
            paths = (run.env.get("PYTHONPATH") or os.environ.get("PYTHONPATH") or "").split(os.pathsep)
            pythonpath = os.pathsep.join([str(INJECT), *(p for p in paths if p and p != str(INJECT))])
            env = {**run.env, "PYTHONPATH": pythonpath, "WORKSPACE_CHECK_REPLICAS": run.check_replicas,
                   "WORKSPACE_CHECK_REPLICAS_REPORT": str(report)}
            signature = contract.REPLICAS_SIGNATURE
            if run.signature:
                signature = f"(?:{run.signature})|(?:{signature})"
            result = self.run(replace(run, env=env, signature=signature, own=False, check_replicas=None))
            said = []
            for path in sorted(report.glob("*.json")):
                try:
                    said.append(json.loads(path.read_text()))
                except (OSError, ValueError):
                    continue
            said = contract.merge_replica_reports(said)
        code, reason = contract.judge_replicas(result.code, result.reason, said)
        if (code, reason) != (result.code, result.reason):
            result.code, result.verdict, result.reason, result.final = code, contract.name(code), reason, True
        return result

    def _sandboxed(self, run: Run) -> harness.RunResult:
        """``run`` in the sandbox (``tools/launch/sandbox.py``): only ``sandbox.PASSED_ENV`` of this
        process's variables, a HOME, TMPDIR and working folder of its own on a size-limited
        tmpfs, its logs capped. ``sandbox="none"``: a plain run (the caller's explicit choice)."""
        if run.sandbox == "none":
            return self.run(replace(run, sandbox=False))
        why = sandbox.unavailable()
        if why:
            return harness.RunResult(contract.FAIL, "error", why, 0.0, None)
        if self.how.nodes > 1 and (run.kind != "python" or run.multinode != "torchrun"):
            return harness.RunResult(contract.SKIP, "skip", "several nodes in the sandbox: only a Python "
                                     "script a torchrun starts on each node", 0.0, None)
        env = {k: v for k, v in os.environ.items() if k in sandbox.PASSED_ENV}
        env = {**env, **run.env}
        if run.python:
            env = harness.env_for(run.python, env)
        outputs, visible = [], []
        report = run.env.get("WORKSPACE_CHECK_REPLICAS_REPORT")
        if report:  # the replica check writes its reports there
            outputs.append((Path(report), "*.json"))
        command, timeout, signature = run.command(), run.timeout, run.signature
        with contextlib.ExitStack() as stack:
            nodes_log = None
            if self.how.nodes > 1 and run.kind == "python":  # tools.nodes inside writes the nodes' logs
                # into a folder handed back afterwards: the script can reach neither the run's
                # other logs nor the file its judgement is read from
                folder = leftovers.owned_tempdir("sandbox")
                stack.callback(shutil.rmtree, folder, True)
                nodes_log = folder / "nodes" / "job"
                outputs.append((nodes_log.parent, f"{nodes_log.name}.node*"))
                visible += [ROOT / "tools", ROOT / "repro", *sandbox.interpreter_folders(sys.executable)]
                # the workspace on tools.nodes' own path only (not on the script's: its modules
                # must not shadow the reporter's)
                start = (f"import runpy, sys; sys.path.insert(0, {str(ROOT)!r}); "
                         "runpy.run_module('tools.launch.nodes', run_name='__main__', alter_sys=True)")
                command = [sys.executable, "-c", start, "--nodes", str(self.how.nodes),
                           "--ranks-per-node", str(self.how.ranks_per_node), "--timeout", str(run.timeout),
                           "--log", str(nodes_log),
                           *(["--signature", run.signature] if run.signature else []),
                           "--", *command]
                timeout, signature = run.timeout + 60, None  # the job's own limit ends it first
            box = stack.enter_context(sandbox.Sandbox(
                command, env, cwd=run.cwd, outputs=tuple(outputs), network=run.sandbox == "network",
                visible=tuple(visible)))
            result = harness.run(box.argv, timeout=timeout, log_stem=run.log_stem, env=box.outer_env,
                                 signature=signature, peer_grace=run.peer_grace, log_limit=sandbox.LOG_LIMIT,
                                 exit_is_signal=True)
            if nodes_log is not None:
                if run.log_stem:  # the nodes' logs next to the run's: <stem>.node0.stdout, ...
                    for log in nodes_log.parent.glob(f"{nodes_log.name}.node*"):
                        shutil.copyfile(log, f"{run.log_stem}{log.name.removeprefix(nodes_log.name)}")
                result = _job_result(result)
            return box.judge(result)  # (a limit reached, a sandbox never built: whatever it printed)

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
        self.runner, self.runner_key = None, None

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _job_result(outer: harness.RunResult) -> harness.RunResult:
    """The judgement ``tools.nodes`` printed inside the sandbox (its last stdout line), as the
    run's; the sandbox's own result when there is none (it could not start the job). The code
    inside could print that line too: only a well-formed one counts, a verdict of the contract
    (never a harness failure), its reason cut short."""
    try:
        lines = Path(outer.stdout_path).read_text(errors="replace").strip().splitlines()
        job = json.loads(lines[-1]) if lines else None
    except (OSError, TypeError, ValueError):
        job = None
    if not isinstance(job, dict) or type(job.get("code")) is not int or job["code"] not in contract.NAMES \
            or not isinstance(job.get("reason"), str | None):
        return outer
    code, record = job["code"], job.get("record")
    return harness.RunResult(code, contract.name(code), (job.get("reason") or "")[:500] or None,
                             outer.seconds, outer.returncode, record if isinstance(record, dict) else None,
                             stdout_path=outer.stdout_path, stderr_path=outer.stderr_path,
                             leftovers=outer.leftovers, final=job.get("final") is True)


def printed(result: harness.RunResult, pattern: str, stem: Path | None = None) -> bool:
    """Whether a run's output (its logs as capped where it ran, and each node's of a job of
    several nodes: ``stem``, its ``log_stem``) has a line ``pattern`` matches."""
    found = re.compile(pattern, re.M)
    paths = [p for p in (getattr(result, "stdout_path", None), getattr(result, "stderr_path", None)) if p]
    if stem is not None:
        paths += sorted(Path(stem).parent.glob(f"{Path(stem).name}.node*"))
    for path in paths:
        try:
            if found.search(Path(path).read_text(errors="replace")):
                return True
        except OSError:
            continue
    return False
