"""Shrink a user's training script to the smallest program that still shows the bug's signature.

    nox -s minimize -- SCRIPT --signature REGEX [--cell ID | --python PATH] [--trials N|auto]
                       [--budget MINUTES] [--out DIR] [-- SCRIPT ARGS]

The reducer is pysource-minimize: it works on the syntax tree (whole statements, then
expressions, arguments, values), so every candidate parses and compiles and no DDP launch is spent
on a syntax error; its test is a plain function, so the verdict cache, the progress line and the
budget live here. The *interestingness test* is the harness verdict (``contract.judge``): a
candidate is interesting only when it is **bad with the same signature** (the ``--signature``
regex, or the verdict line of a script that prints one) and, when the original's signature was
a Python exception, raised at the same place (exception type, file and function of the innermost
frame). Good, cannot-test, timeouts and any other error are not interesting, so the reduction
cannot drift to another bug ("backward through the graph a second time" is not #20706).

Two checks run before a launch and reject a candidate without running it: a name used but
bound nowhere in its files (a removed import or definition: a NameError), and a statement marked
``# minimize: keep`` that is gone or changed. Markers are required when the script could print
the signature itself (a string literal in it matches the regex, or it prints the verdict line):
without them the smallest "interesting" program is the print statement alone.

Sibling modules of the script's folder that it imports (directly or through each other) are
reduced with it. Each candidate runs in a fresh folder holding the candidate's files and links
to everything else in the script's folder.

Outputs in ``--out`` (default ``results/minimize/<script>``): ``best/`` (the smallest
interesting files so far, written after every improvement: Ctrl-C or the end of the budget leave
a usable result), ``state.json`` (verdicts by content hash: a re-run resumes from ``best/`` and
answers known candidates from it), ``minimized.py`` (formatted), ``minimized.diff``,
``report.md`` (sizes, tests, time, the verdict of the result in fresh runs, the versions).

With a control (``--control-cell``, ``--control-python``, ``--control-env``, ``--control-patch``:
where the bug is fixed) a candidate is interesting only if it is also *good* there: a check that
tests a symptom of the bug, which a reduction can produce without the bug, cannot be faked.

Exit codes: 0 the minimized script shows the signature in every confirmation run (and is good on
the control); 1 it showed it in fewer (or is not good on the control); 2 bad input, or the script
is not bad to begin with (or not good on the control); 128 the harness failed;
130 interrupted (``best/`` stays).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from tools.core import contract, results
from tools.core.contract import BadInput
from tools.minimize.options import Config, parse_args, patched_lightning
from tools.minimize.oracle import Oracle, clock, load_best, write_files
from tools.minimize.report import report
from tools.minimize.search import last_clean_up, reduce
from tools.minimize.source import (
    formatted,
    kept_statements,
    prints_signature_itself,
    project_files,
    shown_size,
)
from tools.stages.bisect import State


def minimize(cfg: Config, log=print) -> int:
    started = time.monotonic()
    original = project_files(cfg.script)
    where = prints_signature_itself(original, cfg.signature) or (
        cfg.check_replicas and prints_signature_itself(original, contract.REPLICAS_SIGNATURE))
    if (where or cfg.verdict_line) and not any(kept_statements(s) for s in original.values()):
        raise BadInput(f"{cfg.script.name} could print the signature itself "
                       f"({where or 'it prints the verdict line'}): mark the code that decides it "
                       "with '# minimize: keep' (on the first line of each statement to keep), "
                       "or the smallest 'interesting' program is that print alone")
    try:
        cfg.out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BadInput(f"--out {cfg.out}: cannot make that folder ({err.strerror})") from None
    with holding(cfg.out, log):
        if cfg.control_patch:
            folder = patched_lightning(cfg.control_python, cfg.control_patch, cfg.out / "control")
            path = os.pathsep.join([str(folder), *[v for k, v in cfg.control_env if k == "PYTHONPATH"]])
            cfg = dataclasses.replace(cfg, control_env=(*[(k, v) for k, v in cfg.control_env
                                                          if k != "PYTHONPATH"], ("PYTHONPATH", path)))
        try:
            return reduce_into(cfg, original, started, log)
        except OSError as err:  # a full or read-only disk under --out: no traceback, no verdict
            if err.errno not in (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM):
                raise
            raise contract.HarnessFailure(
                f"cannot write in --out {cfg.out} ({err.strerror}): the best so far is in "
                f"{cfg.out / 'best'}; make room and run the same command to resume") from None


@contextlib.contextmanager
def holding(out: Path, log):
    """``out`` for this run alone: an exclusive lock on ``<out>/.running`` until the run ends,
    however it ends (the kernel frees it when the process dies); a second run on it is bad input."""
    try:
        busy = open(out / ".running", "a")  # noqa: SIM115  (closed by the with below)
    except OSError as err:
        raise BadInput(f"--out {out}: cannot write there ({err.strerror})") from None
    with busy:
        try:
            fcntl.flock(busy, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BadInput(f"{out} is being reduced by another run now: wait for it, or give "
                           "another --out") from None
        except OSError:
            log(f"[minimize] {out}: its file system cannot lock it; two runs on it at once would "
                "mix their results")
        yield


def reduce_into(cfg: Config, original: dict[str, str], started: float, log) -> int:
    """The reduction of ``original`` into ``cfg.out`` (held by this run), its outputs written."""
    meta_path = cfg.out / "original.json"
    digest = hashlib.sha256(json.dumps(sorted(original.items())).encode()).hexdigest()
    try:
        earlier = json.loads(meta_path.read_text()) if meta_path.exists() else {"sha256": digest}
    except (OSError, ValueError):
        earlier = {}
    if not isinstance(earlier, dict) or earlier.get("sha256") != digest:
        raise BadInput(f"{cfg.out} holds the reduction of another script (or of an earlier version "
                       "of this one): give another --out, or remove that folder")
    try:
        results.write_json(meta_path, {"script": str(cfg.script), "files": sorted(original),
                                       "sha256": digest})
    except OSError as err:  # nothing was reduced yet: bad input, as an unwritable --out is
        raise BadInput(f"--out {cfg.out}: cannot write there ({err.strerror})") from None
    state = State(cfg.out / "state.json")
    state.check_writable()
    oracle = Oracle(cfg, original, state, log)
    try:
        oracle.check_original()
        start = dict(original)
        best_dir = cfg.out / "best"
        resumed = load_best(cfg.out, original)
        known = state.get(oracle.key(resumed))
        if resumed != original and known and known["verdict"] == "bad":  # an earlier run's best
            start = {n: s for n, s in resumed.items() if s is not None}
            oracle.best, oracle.best_size = dict(resumed), shown_size(resumed)
            log(f"[minimize] resuming from {best_dir} ({oracle.best_size[0]} lines)")
        oracle.deadline = time.monotonic() + cfg.budget
        if cfg.max_runs is not None:
            oracle.run_limit = oracle.stats.tests + cfg.max_runs
        log(f"[minimize] reducing {', '.join(original)}: {shown_size(original)[0]} lines, budget "
            f"{clock(cfg.budget)}")
        ended = reduce(oracle, start)
        final = last_clean_up(oracle, {n: oracle.best.get(n) for n in original})
        log(f"[minimize] {ended}: {shown_size(final)[0]} lines; confirming with {cfg.confirm} fresh runs")
        final = {n: formatted(s) if s is not None else None for n, s in final.items()}
        write_files(cfg.out / "minimized", final)
        main = final[cfg.script.name]
        results.write_atomic(cfg.out / "minimized.py", main)
        diff = "".join(
            "".join(difflib.unified_diff(original[n].splitlines(True), (final[n] or "").splitlines(True),
                                         f"a/{n}", f"b/{n}" if final[n] is not None else "/dev/null"))
            for n in original)
        results.write_atomic(cfg.out / "minimized.diff", diff)
        confirmed = oracle.run_trials(final, cfg.confirm, fresh=True, stop_at_bad=False)
        control = oracle.on_control(final, fresh=True) if oracle.control else None
        text = report(cfg, oracle, original, final, ended, confirmed, time.monotonic() - started, control)
        results.write_atomic(cfg.out / "report.md", text)
    except KeyboardInterrupt:
        if (cfg.out / "best").exists():
            log(f"[minimize] the best so far ({oracle.best_size[0]} lines) is in {cfg.out / 'best'}; "
                "the same command resumes from it")
        raise
    finally:
        oracle.close()  # its runs have ended: nothing writes into the candidates' folders now
        for left in (cfg.out / "work").glob("*"):  # what a launch cut short by a signal left
            if left.is_dir() and not left.is_symlink():
                shutil.rmtree(left, ignore_errors=True)
            else:
                left.unlink(missing_ok=True)
    seen = sum(ok for ok, *_ in confirmed)
    log(text)
    log(f"[minimize] {cfg.out / 'minimized.py'}: the signature in {seen}/{cfg.confirm} fresh runs"
        + (f"; {'good' if control[0] else 'NOT good'} on the control" if control else ""))
    return 0 if seen == cfg.confirm and (control is None or control[0]) else 1


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return contract.run_main(lambda a: minimize(parse_args(a), log), argv)


def log(msg: str) -> None:
    print(msg, flush=True)


if __name__ == "__main__":
    sys.exit(main())
