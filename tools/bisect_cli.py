"""``nox -s bisect``: find where a regression came in, releases first, then Lightning commits.

    nox -s bisect -- [options] [-- repro options]

Exit codes: 0 a first bad release/commit was found, 3 no good boundary ("never worked"),
4 ambiguous (the first bad is among candidates that could not be tested), 2 bad input,
128 a harness failure, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path

from packaging.version import InvalidVersion, Version

from tools import envs, harness, index, matrix, results
from tools.bisect import Bisector, HarnessFailure, Outcome, State, trials_for
from tools.preloaded import Runner

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
OWN_REPROS = {"backbone_finetuning_ddp.py", "ddp_weakref_stress.py", "finetuning_resume.py"}
EXIT = {"found": 0, "no-good": 3, "ambiguous": 4}
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"


class BadInput(ValueError):
    pass


def parse_args(argv):
    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise BadInput(message)

    p = Parser(prog="nox -s bisect --", description=__doc__.split("\n\n")[0])
    p.add_argument("--tier", choices=("releases", "commits", "both"), default="both")
    p.add_argument("--axis", choices=("lightning", "torch"), default="lightning",
                   help="bisect Lightning releases, or torch releases with Lightning fixed")
    p.add_argument("--package", choices=("pytorch-lightning", "lightning"),
                   default="pytorch-lightning")
    p.add_argument("--good", help="release (or, with --tier commits, git ref) without the bug; "
                                  "omitted: search backwards")
    p.add_argument("--bad", help="release or git ref with the bug (default: the newest release)")
    p.add_argument("--oldest", default="1.9.5", help="search back no further than this release")
    p.add_argument("--torch", default="auto",
                   help="torch for Lightning candidates (auto: the newest out at each one's date)")
    p.add_argument("--lightning", help="the fixed Lightning release on the torch axis")
    p.add_argument("--repo", default=None, help="Lightning git repository, path or URL "
                                                "(default: upstream, cloned once into .cache)")
    p.add_argument("--repro", default="repro/backbone_finetuning_ddp.py")
    p.add_argument("--trials", default="1", help="runs per step, or 'auto' (from the bad end's rate)")
    p.add_argument("--timeout", type=float, default=600.0, help="wall-clock limit of one run")
    p.add_argument("--signature", help="for a user script without verdict line: regex for 'bad'")
    p.add_argument("--state", default=str(ROOT / "results" / "bisect" / "state.json"))
    p.add_argument("--out", default=None, help="report folder (default results/bisect/<time>)")
    p.add_argument("--fresh-process", action="store_true",
                   help="a new interpreter for every run (default: the runs of one candidate, its "
                        "trials included, are forks of one process that imported torch and "
                        "Lightning once)")
    argv, rest = list(argv), None
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1:]
    args = p.parse_args(argv)
    args.repro_args = rest or []
    repro = Path(args.repro)
    if not repro.is_absolute():
        repro = (ROOT / repro) if (ROOT / repro).exists() else repro.resolve()
    if not repro.exists():
        raise BadInput(f"repro not found: {args.repro}")
    args.repro = repro
    if args.trials != "auto":
        try:
            args.trials = int(args.trials)
            assert args.trials >= 1
        except (ValueError, AssertionError):
            raise BadInput("--trials takes a number >= 1 or 'auto'") from None
    if args.axis == "torch" and not args.lightning:
        raise BadInput("--axis torch needs --lightning VERSION")
    return args


# -- predicates ----------------------------------------------------------------------------

def is_own(repro: Path) -> bool:
    """One of the workspace's repros (a verdict line, fine to preload) - not a user's script."""
    return repro.resolve().parent == ROOT / "repro" and repro.name in OWN_REPROS


def fresh_args(repro: Path) -> list[str]:
    """What the repro needs to start each rank in a new interpreter too (``matrix.toml``)."""
    for r in matrix.load().repros:
        if (ROOT / r.script).resolve() == repro.resolve():
            return list(r.fresh_args)
    return []


class Runners:
    """The preloaded runner of the candidate being tested: one import for all its runs."""

    def __init__(self):
        self.key, self.runner = None, None

    def get(self, key: str, python: Path, env: dict, stderr: Path) -> Runner:
        if key != self.key:
            self.close()
            stderr.parent.mkdir(parents=True, exist_ok=True)
            self.key, self.runner = key, Runner(python, env=env, stderr=stderr)
        return self.runner

    def close(self) -> None:
        if self.runner:
            self.runner.close()
        self.key, self.runner = None, None


RUNNERS = Runners()


def run_repro(args, python: Path, extra_env: dict | None = None, import_name: str | None = None,
              log_stem: Path | None = None, candidate: str = "") -> tuple[int, str | None]:
    """One run of the repro in ``python``. The workspace's own repros run as forks of the
    candidate's preloaded runner unless ``--fresh-process``; a user's script always runs fresh."""
    import os

    own = is_own(args.repro)
    argv = [str(args.repro), *args.repro_args, *(fresh_args(args.repro) if args.fresh_process else [])]
    if own and import_name and "--import-name" not in args.repro_args:
        argv += ["--import-name", import_name]
    env = {**os.environ, **(extra_env or {})}
    options = {"timeout": args.timeout, "log_stem": log_stem, "require_record": own,
               "signature": args.signature}
    if own and not args.fresh_process:
        runner = RUNNERS.get(f"{python}|{candidate}|{json.dumps(extra_env)}", python, env,
                             Path(args.out_dir) / "logs" / "preloaded.stderr")
        r = runner.run({"argv": argv, **options, "log_stem": log_stem and str(log_stem)})
    else:
        r = harness.run([str(python), *argv], env=env, **options)
    return r.code, r.reason if r.code != 1 else (r.reason or "bug signature seen")


def release_predicate(args, out: Path):
    def test(candidate: str):
        if args.axis == "torch":
            package, version, torch = args.package, args.lightning, candidate
        else:
            package, version = args.package, candidate
            torch = args.torch if args.torch != "auto" else envs.era_torch(
                index.release(package, version).uploaded)
        try:
            python = envs.ensure(f"{package}-{version}-torch{torch}",
                                 envs.install_args(package, version, torch), log=print)
        except envs.EnvError as err:
            return 125, f"[{package} {version}, torch {torch}] environment: {err}"
        code, reason = run_repro(args, python,
                                 log_stem=out / "logs" / f"{package}-{version}-torch{torch}",
                                 candidate=candidate)
        return code, f"[{package} {version}, torch {torch}] {reason or 'clean'}"
    return test


def mode(args) -> str:
    """The state keeps the faithful mode's verdicts apart: re-checking with it runs again."""
    return "|fresh-process" if args.fresh_process else ""


def release_key(args, candidate: str) -> str:
    what = (f"{args.package}=={args.lightning}|torch=={candidate}" if args.axis == "torch" else
            f"{args.package}=={candidate}|torch=={args.torch}")
    return f"{args.repro.name} {' '.join(args.repro_args)}|{what}|py{PY}{mode(args)}"


# -- tiers ---------------------------------------------------------------------------------

def candidate_releases(args) -> list[str]:
    name = "torch" if args.axis == "torch" else args.package
    found = index.releases(name)
    oldest = Version(args.oldest) if args.axis == "lightning" else Version("1.13.0")
    return [str(v) for v, r in found.items() if v >= oldest and r.installable_on(PY)]


def release_tier(args, bisector_log, out: Path) -> tuple[Outcome, list[str], Bisector]:
    names = candidate_releases(args)
    for v in filter(None, [args.good, args.bad]):
        try:
            Version(v)
        except InvalidVersion:
            raise BadInput(f"{v!r} is not a release version") from None
        if v not in names:
            raise BadInput(f"unknown or uninstallable release {v!r} (candidates: "
                           f"{names[0]} .. {names[-1]})")
    bad = names.index(args.bad) if args.bad else len(names) - 1
    good = names.index(args.good) if args.good else None
    if good is not None and good >= bad:
        raise BadInput("--good must be older than --bad")
    state = State(Path(args.state))
    test = release_predicate(args, out)
    b = Bisector(names, test, lambda c: release_key(args, c), state, 1, bisector_log)
    b.trials = pick_trials(args, b, names[bad])
    return b.run(good, bad), names, b


def pick_trials(args, b: Bisector, bad: str) -> int:
    if args.trials != "auto":
        return args.trials
    runs = 5
    codes = [b.test(bad)[0] for _ in range(runs)]
    rate = codes.count(1) / runs
    args.trials_rate = rate
    n = trials_for(rate)
    b.log(f"[trials auto] bug seen in {codes.count(1)}/{runs} runs at {bad}: p = {rate:.2f}, "
          f"N = {n} runs per step (a bad step is missed with probability {(1 - rate) ** n:.3f})")
    return n


def commit_tier(args, good_ref: str, bad_ref: str, log, out: Path):
    from tools import gitrange

    source = args.repo or gitrange.UPSTREAM
    repo = gitrange.open_repo(source, CACHE / "repos")
    good, bad = gitrange.resolve(repo, good_ref), gitrange.resolve(repo, bad_ref)
    good, bad, notes = gitrange.mainline(repo, good, bad)
    commits = gitrange.first_parent(repo, good, bad)
    if not commits:
        raise BadInput(f"no commits between {good_ref} and {bad_ref} along the first parent")
    candidates = [gitrange.commit_info(repo, good), *commits]
    by_sha = {c.sha: c for c in candidates}
    wt = gitrange.Worktree(repo, CACHE / "worktrees" / repo.working_dir.split("/")[-1])
    torch = args.torch if args.torch != "auto" else envs.era_torch(
        datetime.fromisoformat(candidates[-1].date))

    def test(sha: str):
        path = wt.checkout(sha)
        reqs = wt.requirements()
        moment = datetime.fromisoformat(by_sha[sha].date)
        import hashlib

        key = hashlib.sha256(json.dumps([reqs, torch]).encode()).hexdigest()[:12]
        try:
            python = envs.ensure(f"commit-{key}", envs.era_args(reqs, torch, moment), log=log)
        except envs.EnvError as err:
            return 125, f"environment: {err}"
        return run_repro(args, python, {"PYTHONPATH": str(path / "src")}, "lightning.pytorch",
                         out / "logs" / sha[:12], candidate=sha)

    def key(sha: str) -> str:
        return (f"{args.repro.name} {' '.join(args.repro_args)}|commit {sha}|torch=={torch}|py{PY}"
                f"{mode(args)}")

    state = State(Path(args.state))
    b = Bisector([c.sha for c in candidates], test, key, state, 1, log,
                 label=lambda sha: by_sha[sha].label)
    b.trials = args.trials if args.trials != "auto" else pick_trials(args, b, candidates[-1].sha)
    outcome = b.run(0, len(candidates) - 1)
    return outcome, candidates, notes, torch, source


# -- report --------------------------------------------------------------------------------

def github(source: str | None) -> str | None:
    from tools import gitrange

    src = source or gitrange.UPSTREAM
    return src.removesuffix(".git") if src.startswith("https://github.com/") else gitrange.UPSTREAM


def report(args, argv, release: dict | None, commit: dict | None, seconds: float) -> str:
    lines = ["## Bisect result", ""]
    cmd = "nox -s bisect -- " + shlex.join(argv)
    if release:
        o = release["outcome"]
        what = "torch" if args.axis == "torch" else args.package
        if o.status == "no-good":
            lines.append(f"**Bad in every {what} release tested — not a regression in this range** "
                         f"(searched back from {o.first_bad} to {args.oldest}).")
        elif o.status == "found":
            lines.append(f"First bad {what} release: **{o.first_bad}** (last good: {o.last_good}).")
        else:
            lines.append(f"First bad {what} release is one of {', '.join(o.skipped_between)}, "
                         f"{o.first_bad} (the others could not be tested).")
    if commit:
        o, candidates = commit["outcome"], commit["candidates"]
        by_sha = {c.sha: c for c in candidates}
        base = github(commit["source"])
        lines.append("")
        for note in commit["notes"]:
            lines.append(f"Note: {note}.")
        lines.append(f"Commits searched: {len(candidates) - 1} first-parent commits, "
                     f"[compare]({base}/compare/{candidates[0].sha[:12]}...{candidates[-1].sha[:12]}).")
        if o.status == "found":
            c = by_sha[o.first_bad]
            pr = f" — PR [#{c.pr}]({base}/pull/{c.pr})" if c.pr else ""
            lines.append(f"First bad commit: [`{c.sha[:12]}`]({base}/commit/{c.sha}) "
                         f"{c.subject}{pr}")
        else:
            lines.append(f"First bad commit is one of: "
                         f"{', '.join(s[:12] for s in [*o.skipped_between, o.first_bad])}")
    lines += ["", f"Repro: `{args.repro.name} {' '.join(args.repro_args)}`; trials per step: "
              f"{args.trials}" + (f" (p = {args.trials_rate:.2f} at the bad end)"
                                  if getattr(args, "trials_rate", None) is not None else ""),
              f"Python {platform.python_version()}, "
              f"torch {args.torch if args.axis != 'torch' else 'bisected'}"
              f"{f', Lightning {args.lightning}' if args.lightning else ''}; {seconds:.0f} s.",
              "", "Reproduce the bisect:", "", f"```\n{cmd}\n```", "",
              "<details><summary>Step log</summary>", "",
              "| candidate | verdict | runs | s | cached | note |",
              "|---|---|---|---|---|---|"]
    subjects = {c.sha: c.label for c in (commit or {}).get("candidates", [])}
    for tier in filter(None, [release, commit]):
        for s in tier["outcome"].steps:
            name = subjects.get(s.candidate, s.candidate).replace("|", "/")
            lines.append(f"| {name} | {s.verdict} | {len(s.codes)} | {s.seconds:.0f} | "
                         f"{'yes' if s.cached else ''} | {(s.reason or '').replace('|', '/')[:140]} |")
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    start = time.monotonic()
    try:
        args = parse_args(argv)
        out = Path(args.out) if args.out else results.run_dir("bisect")
        args.out_dir = str(out)
        log = lambda msg: print(msg, flush=True)  # noqa: E731
        release = commit = None
        status = "found"
        if args.tier in ("releases", "both"):
            outcome, names, _ = release_tier(args, log, out)
            release = {"outcome": outcome, "candidates": names}
            status = outcome.status
            if args.tier == "both" and outcome.status == "found" and args.axis == "lightning":
                args.good, args.bad = outcome.last_good, outcome.first_bad
        if args.tier == "commits" or (args.tier == "both" and status == "found"
                                      and args.axis == "lightning"):
            if not (args.good and args.bad):
                raise BadInput("a commit bisect needs --good and --bad refs")
            outcome, candidates, notes, torch, source = commit_tier(args, args.good, args.bad, log, out)
            args.torch = torch
            commit = {"outcome": outcome, "candidates": candidates, "notes": notes, "source": source}
            status = outcome.status
    except (BadInput, index.UnknownRelease, ValueError) as err:
        # bad options, unknown versions or refs, a missing repo, an end that fails verification
        print(f"error: {err}", file=sys.stderr)
        return 2
    except HarnessFailure as err:
        print(f"error: harness failure: {err}", file=sys.stderr)
        return 128
    except KeyboardInterrupt:
        print("interrupted: verdicts so far are kept; run the same command to resume",
              file=sys.stderr)
        return 130
    finally:
        RUNNERS.close()
    text = report(args, argv, release, commit, time.monotonic() - start)
    data = {"status": status, "argv": argv,
            "releases": release and {"outcome": release["outcome"].to_dict()},
            "commits": commit and {"outcome": commit["outcome"].to_dict(),
                                   "notes": commit["notes"],
                                   "commits": [c.__dict__ for c in commit["candidates"]]}}
    results.write_atomic(out / "report.md", text)
    results.write_json(out / "report.json", data)
    print(text)
    print(f"report: {out / 'report.md'}")
    return EXIT[status]


if __name__ == "__main__":
    sys.exit(main())
