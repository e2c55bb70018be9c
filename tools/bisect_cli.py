"""``nox -s bisect``: find where a regression came in, releases first, then Lightning commits.

    nox -s bisect -- [options] [-- repro options]

With ``--find-fix`` it looks for where a bug went away instead: ``--bad`` is a release (or ref)
with the bug, ``--good`` one without it (default: the newest release), and the answer is the
first fixed release, then the commit that fixed it. The verdict cache is shared with regression
bisects: the same repro in the same environment is not run twice.

Exit codes: 0 a first bad release/commit (the fix, with ``--find-fix``) was found, 3 no good
boundary ("never worked": every candidate tested was bad; with ``--find-fix``: no candidate
tested showed the bug), 4 ambiguous (the first bad is among candidates that could not be
tested), 5 untestable (an end, or every candidate that could be good, could not be tested: no
verdict on the bug), 2 bad input, 128 a harness failure, 130 interrupted.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from tools.core import contract, results
from tools.core.contract import BadInput
from tools.environments import index
from tools.stages import bisect_options
from tools.stages.bisect import State
from tools.stages.bisect_options import EXIT, Config, log, parse_args
from tools.stages.bisect_report import report
from tools.stages.bisect_tiers import ENV_NOTES, close_launcher, commit_tier, release_ends, release_tier


def writable(folder: Path | None, what: str) -> Path:
    """``folder`` (None: a new ``results/bisect/<time>``), made and checked before any step."""
    where = Path(folder) if folder else results.kind_dir("bisect")
    try:
        folder = Path(folder) if folder else results.run_dir("bisect", latest=False)
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise BadInput(f"{what} {where}: cannot write there ({err.strerror})") from None
    return folder


def bisect(cfg: Config, argv: list[str], log) -> int:
    """Both tiers; the report written atomically; the exit code of the outcome."""
    start = time.monotonic()
    state = State(cfg.state)  # a broken state file is bad input, before anything runs
    state.check_writable()
    release_ends_ = release_ends(cfg) if cfg.tier in ("releases", "both") else None
    if cfg.torch != "auto":  # an unknown release is bad input now, not at the first step
        index.release("torch", cfg.torch)
    if cfg.lightning:
        index.release(cfg.package, cfg.lightning)
    writable(bisect_options.CACHE, "the cache folder")
    out = writable(cfg.out, "--out") if cfg.out else writable(None, "the results folder")
    try:
        return _tiers(cfg, argv, log, out, release_ends_, start)
    except contract.BadInput:
        if not cfg.out:
            results.forget(out)  # nothing was written there: no empty folder left behind
        raise


def _tiers(cfg: Config, argv: list[str], log, out: Path, release_ends_, start: float) -> int:
    release = commit = None
    status = "found"
    try:
        if release_ends_:
            outcome, names, b = release_tier(cfg, release_ends_, log, out)
            release = {"outcome": outcome, "candidates": names, "bisector": b}
            status = outcome.status
        if cfg.tier == "commits":  # the engine's old end, then its new end
            good, bad = (cfg.bad, cfg.good) if cfg.find_fix else (cfg.good, cfg.bad)
        elif status == "found" and cfg.axis == "lightning" and cfg.tier == "both" and cfg.repo:
            good, bad = release["outcome"].last_good, release["outcome"].first_bad
        elif status == "found" and cfg.axis == "lightning" and cfg.tier == "both":
            log(f"[commits] not searched: no Lightning repository ({contract.REPO_HOW})")
            good = bad = None
        else:
            good = bad = None
        if good and bad:
            first_bad = release and release["outcome"].first_bad if cfg.tier == "both" else None
            outcome, candidates, notes, torch, source, b, how = commit_tier(cfg, good, bad, log, out,
                                                                            first_bad)
            commit = {"outcome": outcome, "candidates": candidates, "notes": notes,
                      "source": source, "torch": torch, "bisector": b, "how": how}
            status = outcome.status
    finally:
        close_launcher()
    text = report(cfg, argv, release, commit, time.monotonic() - start)
    data = {"status": status, "find_fix": cfg.find_fix, "axis": cfg.axis, "argv": argv,
            "environments": dict(ENV_NOTES),
            "seconds": round(time.monotonic() - start, 1),
            "releases": release and {"outcome": release["outcome"].to_dict(),
                                     "trials": release["bisector"].trials,
                                     "rate": release["bisector"].rate},
            "commits": commit and {"outcome": commit["outcome"].to_dict(),
                                   "trials": commit["bisector"].trials,
                                   "rate": commit["bisector"].rate,
                                   "notes": commit["notes"], "how": commit["how"],
                                   "commits": [c.__dict__ for c in commit["candidates"]]}}
    try:
        results.write_atomic(out / "report.md", text)
        results.write_json(out / "report.json", data)
    except OSError as err:
        print(text)
        raise BadInput(f"cannot write the report in {out} ({err.strerror}); it is printed above") from None
    if not cfg.out:
        results.point_latest(out)
    print(text)
    print(f"report: {out / 'report.md'}")
    return EXIT[status]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return contract.run_main(lambda a: bisect(parse_args(a), a, log), argv,
                                 "interrupted: verdicts so far are kept; run the same command to resume")
    finally:
        close_launcher()


if __name__ == "__main__":
    sys.exit(main())
