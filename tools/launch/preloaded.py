"""Run repro scripts in one environment with torch and Lightning imported once for all of them.

The runner side is this file run by an environment's own interpreter (it needs only the standard
library and the harness):

    <env>/bin/python tools/launch/preloaded.py    # one job per stdin line, one result per stdout line

It imports torch and Lightning, then runs each job as ``python SCRIPT ARGS`` would, but in a fork
of itself under ``harness.run_forked``: its own session, time limit, logs and verdict, and a fresh
fork for every job (nothing one job does reaches the next). A job is ``{"argv": [SCRIPT, ARG...],
"timeout", "log_stem", "signature"}`` and optionally ``"cwd"`` (where it runs); its answer is
``harness.RunResult`` as a dict. If the preload fails, the failure is said once on stderr and every
job runs in a fresh interpreter instead (a repro reports its own import error as "cannot test").

The caller side is ``Runner``: it starts the runner on first use, sends jobs one at a time and
bounds every answer, so a runner that dies or hangs is an error result, never a hang.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # this folder is sys.path[0]: its bisect.py would shadow the stdlib's
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import runpy  # noqa: E402
import selectors  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from tools.core import contract
from tools.launch import harness  # noqa: E402

PRELOAD = ("torch", "lightning.pytorch|pytorch_lightning")  # a|b: the first of the two that imports


def preload(names=PRELOAD) -> str | None:
    """Import each module; None, or why one could not be imported."""
    for alternatives in names:
        errors = []
        for name in alternatives.split("|"):
            try:
                module = importlib.import_module(name)
            except Exception as err:  # any import failure: the jobs run fresh instead
                errors.append(f"{name}: {type(err).__name__}: {err}")
                continue
            if hasattr(module, "Trainer") or not name.endswith("pytorch_lightning"):
                break
            errors.append(f"{name}: an empty namespace package")
        else:
            return "; ".join(errors)
    return None


def exec_script(argv: list[str], cwd: str | None = None) -> None:
    """In the fork: what ``python SCRIPT ARGS`` does (in ``cwd``), minus the imports already done."""
    if cwd:
        os.chdir(cwd)
    script = os.path.abspath(argv[0])
    sys.argv = [script, *argv[1:]]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


def run_job(job: dict, forked: bool) -> harness.RunResult:
    options = {"timeout": job["timeout"], "log_stem": job.get("log_stem"),
               "signature": job.get("signature")}
    if forked:
        return harness.run_forked(lambda: exec_script(job["argv"], job.get("cwd")), **options)
    return harness.run([sys.executable, *job["argv"]], cwd=job.get("cwd"), **options)


def serve() -> int:
    harness.die_with_parent(os.getppid())  # a killed caller (nox, a bisect) leaves no runner behind
    # answers go to the original stdout; anything else printed here (an import's message) to stderr
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    os.register_at_fork(after_in_child=answers.close)  # no job or rank holds the answers pipe
    why = preload()
    if why:
        print(f"[preloaded] import failed ({why}): each job runs in a fresh interpreter",
              file=sys.stderr, flush=True)
    for line in sys.stdin:
        if line.strip():
            result = run_job(json.loads(line), forked=why is None)
            print(json.dumps({**result.to_dict(), "forked": why is None}, default=str),
                  file=answers, flush=True)
    return 0


class Runner:
    """One preloaded runner in the environment of ``python`` (with ``env``), started on first use."""

    STARTUP = 120.0  # seconds allowed for the runner's own imports, on top of a job's timeout

    def __init__(self, python: str | Path, env: dict | None = None, stderr: Path | None = None):
        self.python, self.env, self.stderr = str(python), env, stderr
        self.proc: subprocess.Popen | None = None
        self.forked: bool | None = None  # did the last job run as a fork (False: the preload failed)

    def run(self, job: dict) -> harness.RunResult:
        first = self.proc is None
        try:
            if first:
                self._start()
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            line = self._readline(job["timeout"] + 30 + (self.STARTUP if first else 0))
        except OSError as err:  # could not start it, or it died between two jobs (broken pipe)
            line, why = "", f"failed: {err}"
        else:
            why = None
        if not line:
            code = self.close()
            why = why or ("did not answer in time" if code is None else f"exited {code}")
            return harness.RunResult(contract.FAIL, "error", f"the preloaded runner {why} "
                                     f"(see {self.stderr or 'its stderr'})", 0.0, None)
        answer = json.loads(line)
        self.forked = answer.pop("forked", None)
        return harness.RunResult(**answer)

    def _start(self) -> None:
        err = open(self.stderr, "a") if self.stderr else None
        try:
            self.proc = subprocess.Popen(
                [self.python, str(Path(__file__).resolve())], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, env=self.env, text=True, errors="replace")
        finally:
            if err:
                err.close()

    def _readline(self, bound: float) -> str:
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + bound
            while time.monotonic() < deadline:
                if sel.select(timeout=1.0):
                    return self.proc.stdout.readline()
            return ""

    def close(self) -> int | None:
        """Stop the runner (it finishes no job); its exit code, None if it had to be killed."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        try:
            proc.stdin.close()
        except OSError:  # the runner is gone: nothing to flush to
            pass
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
        proc.stdout.close()
        return code

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


if __name__ == "__main__":
    sys.exit(serve())
