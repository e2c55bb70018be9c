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

import functools
import hashlib
import json
import os
import platform
import queue
import re
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from packaging.version import InvalidVersion, Version

from tools import contract, envs, harness, index, matrix, results, slurm_jobs
from tools.bisect import Bisector, Outcome, State
from tools.launcher import How, Launcher, Run

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
EXIT = {"found": 0, "no-good": 3, "ambiguous": 4, "untestable": 5}
INJECT = ROOT / "tools" / "inject"  # on a commit's PYTHONPATH: its source under every import name
# a run that failed to import what it needs (another dependency set may serve)
IMPORT_FAILED = re.compile(r"ImportError|ModuleNotFoundError|cannot import name|No module named")
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"


BadInput = contract.BadInput


@dataclass(frozen=True)
class Config:
    """The bisect's options, validated once; nothing changes them afterwards."""

    tier: str
    axis: str
    package: str
    good: str | None
    bad: str | None
    oldest: str
    torch: str
    lightning: str | None
    repo: str | None
    repro: Path
    repro_args: tuple[str, ...]
    run_as: str  # "python": run with the candidate's interpreter; "exec": its own #! line
    verdict_line: bool  # prints the contract's verdict line (else judged by --signature)
    preload: bool  # one of the workspace's repros: its runs may be forks of a preloaded runner
    trials: int | str
    timeout: float
    signature: str | None
    state: Path
    out: Path | None
    fresh_process: bool
    slurm: object = None  # slurm_jobs.Options with --executor slurm: each run is one SLURM job
    extra: tuple[str, ...] = ()  # --with: what the repro needs besides Lightning and torch
    check_replicas: str | None = None  # --check-replicas: the replica check's interval
    sandbox: bool | str = False  # --sandbox[=network]: untrusted code (a triaged issue's script)
    find_fix: bool = False  # --find-fix: the first release/commit without the bug after one with it
    jobs: int = 1  # --jobs: candidates tested at once per round
    nodes: tuple[int, int] = (1, 1)  # --nodes, --ranks-per-node: every run as a job of N nodes
    hang: bool = False  # --hang: the bug is a hang; a run that outlives --timeout is bad
    bad_output: str | None = None  # --bad-output: bad when a run that exits 0 prints it

    @property
    def repro_text(self) -> str:
        return f"{self.repro.name} {' '.join(self.repro_args)}".strip()

    @functools.cached_property
    def repro_key(self) -> str:
        """The repro as the verdict cache names it: its text and a hash of its content (with the
        sibling modules a Python repro imports), read once (at the first verdict), so an edited
        repro, or another one of the same name (every reduction writes a ``minimized.py``), is
        run again, not answered from the verdicts of the one before. Files it reads otherwise
        (a config named in its arguments, an installed package) are not in the hash."""
        from tools.minimize.source import project_files

        try:
            files = project_files(self.repro) if self.run_as == "python" else {}
        except BadInput:  # a sibling that cannot be read or parsed: the repro's bytes alone
            files = {}
        digest = hashlib.sha256(self.repro.read_bytes())
        for name in sorted(set(files) - {self.repro.name}):
            digest.update(f"\0{name}\0{files[name]}".encode())
        return f"{self.repro_text} @{digest.hexdigest()[:12]}"


def parser() -> contract.Parser:
    """The program's options (its ``--help``)."""
    p = contract.Parser(prog="nox -s bisect --", description=__doc__.split("\n\n")[0])
    target = p.add_argument_group("what is bisected")
    target.add_argument("--tier", choices=("releases", "commits", "both"), default="both",
                        help="what to bisect: PyPI releases, Lightning git commits (needs --good "
                             "and --bad refs), or both, the commits between the releases the first "
                             "tier names")
    target.add_argument("--axis", choices=("lightning", "torch"), default="lightning",
                        help="bisect Lightning releases, or torch releases with Lightning fixed")
    target.add_argument("--package", choices=("pytorch-lightning", "lightning"),
                        default="pytorch-lightning",
                        help="the PyPI package whose releases are bisected")
    target.add_argument("--good", help="release (or, with --tier commits, git ref) without the bug; "
                                       "omitted: search backwards (with --find-fix: the newest release)")
    target.add_argument("--bad", help="release or git ref with the bug (default: the newest release; "
                                      "with --find-fix: omitted, search backwards from --good)")
    target.add_argument("--find-fix", action="store_true",
                        help="find where the bug went away: the first release, then commit, without it "
                             "after --bad")
    target.add_argument("--oldest", default="1.9.5", help="search back no further than this release")
    target.add_argument("--torch", default="auto",
                        help="torch for Lightning candidates (auto: the newest out at each one's date)")
    target.add_argument("--lightning", help="the fixed Lightning release on the torch axis")
    contract.add_repo(target)
    judge = p.add_argument_group("the script, and what counts as bad")
    judge.add_argument("--script",
                       help="the script to bisect (required): a .py file or an executable with a #! "
                            "line (run with the candidate's environment first on PATH); the "
                            "workspace's own, e.g. repro/backbone_finetuning_ddp.py for #20340")
    contract.add_old_name(judge, "--repro", "--script")
    contract.add_judges(judge, "--script")
    judge.add_argument("--hang", action="store_true",
                       help="the bug is a hang: a run that outlives --timeout is bad (no --signature "
                            "needed)")
    judge.add_argument("--bad-output", metavar="REGEX",
                       help="the bug is a behaviour, no exception: a run that exits 0 and prints a "
                            "line REGEX matches is bad (no --signature needed)")
    judge.add_argument("--with", dest="extra", action="append", default=[], metavar="REQUIREMENT",
                       help="a package the repro needs besides Lightning and torch (repeatable), "
                            "installed in every candidate's environment as of that candidate's "
                            "date, e.g. --with 'jsonargparse[signatures]'")
    running = p.add_argument_group("how it runs")
    running.add_argument("--trials", default="1",
                         help="runs per step, or 'auto' (from the bad end's rate)")
    running.add_argument("--timeout", type=contract.seconds, default=600.0,
                         help="wall-clock limit of one run")
    running.add_argument("--jobs", default="auto", metavar="K",
                         help="candidates tested at once per round, each a fresh process (default "
                              "auto: one per two cores for a script of yours; 1 for the workspace's "
                              "own repros, whose runs fork from a preloaded runner, and with "
                              "--executor slurm, where --jobs K makes each round one job array of K "
                              "tasks)")
    running.add_argument("--fresh-process", action="store_true",
                         help="a new interpreter for every run (default: the runs of one candidate, "
                              "its trials included, are forks of one process that imported torch and "
                              "Lightning once)")
    contract.add_nodes(running)
    contract.add_sandbox(running, "run the repro")
    cluster = p.add_argument_group("SLURM (--executor slurm)")
    slurm_jobs.add_options(cluster)
    output = p.add_argument_group("results")
    output.add_argument("--state", default=str(ROOT / "results" / "bisect" / "state.json"),
                        help="the verdict cache: a verdict already in it is not run again")
    output.add_argument("--out", default=None, help="report folder (default: results/bisect/<time>)")
    return p


def parse_args(argv) -> Config:
    p = parser()
    argv, rest = list(argv), None
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1:]
    args = p.parse_args(argv)
    slurm = slurm_jobs.options(args) if args.executor == "slurm" else None
    if not args.script:
        raise BadInput("--script is required: the script to bisect (e.g. --script "
                       "repro/backbone_finetuning_ddp.py, the workspace's repro of #20340)")
    repro = Path(args.script)
    if not repro.is_absolute():
        repro = (ROOT / repro) if (ROOT / repro).exists() else repro.resolve()
    run_as = harness.how_to_run(repro, "--script", args.script)
    own = own_repro(repro)
    verdict_line = own is not None and own.verdict_line or args.verdict_line
    if not (verdict_line or args.signature or args.check_replicas or args.hang or args.bad_output):
        raise BadInput(f"--script {args.script} prints no verdict line: give --signature REGEX (what "
                       "its output shows when the bug is there), --check-replicas for a silent "
                       "divergence, --hang for a hang, --bad-output REGEX for a behaviour, or "
                       "--verdict-line if it prints the contract's verdict line")
    contract.check_signature(args.signature)
    contract.check_signature(args.bad_output, "--bad-output")
    trials = contract.check_trials(args.trials)
    if args.axis == "torch" and not args.lightning:
        raise BadInput("--axis torch needs --lightning VERSION")
    if args.tier == "commits" and not (args.good and args.bad):
        raise BadInput("a commit bisect needs --good and --bad refs")
    if args.tier == "commits" and not args.repo:
        raise BadInput(f"a commit bisect needs a Lightning repository: {contract.REPO_HOW}")
    if args.jobs == "auto":  # parallel fresh processes, or one at a time forked from a preloaded runner
        preloaded = own is not None and not args.fresh_process
        jobs = 1 if preloaded or args.executor == "slurm" else default_jobs()
    else:
        jobs = int(args.jobs) if args.jobs.isdigit() else 0
    if jobs < 1:
        raise BadInput("--jobs takes a number >= 1, or auto")
    contract.check_nodes(args)
    if args.nodes > 1 and args.executor == "slurm":
        raise BadInput("--nodes is the local nodes' way; with --executor slurm give the job's own")
    from packaging.requirements import InvalidRequirement, Requirement

    for requirement in args.extra:
        try:
            Requirement(requirement)
        except InvalidRequirement:
            raise BadInput(f"--with {requirement!r} is not a requirement (e.g. 'jsonargparse>=4.39')") \
                from None
    return Config(args.tier, args.axis, args.package, args.good, args.bad, args.oldest, args.torch,
                  args.lightning, args.repo, repro, tuple(rest or ()), run_as, verdict_line,
                  own is not None, trials, args.timeout, args.signature, Path(args.state),
                  Path(args.out) if args.out else None, args.fresh_process, slurm, tuple(args.extra),
                  args.check_replicas, args.sandbox, args.find_fix, jobs, (args.nodes, args.ranks_per_node),
                  args.hang, args.bad_output)


def round_scope(cfg: Config):
    """With ``--executor slurm`` and ``--jobs K``: each round of probes is one job array."""
    if cfg.slurm is None or cfg.jobs < 2:
        return None
    return lambda probes: slurm_jobs.array_round(probes, cfg.slurm, log)


def default_jobs(ranks: int = 2) -> int:
    """What the machine's cores allow: one probe per ``ranks`` cores (the repro's processes)."""
    return max(1, (os.cpu_count() or 1) // ranks)


# -- predicates ----------------------------------------------------------------------------

def own_repro(repro: Path) -> matrix.Repro | None:
    """The ``matrix.toml`` entry of one of the workspace's repros, or None for a user's script."""
    for r in matrix.load().repros:
        if (ROOT / r.script).resolve() == repro.resolve():
            return r
    return None


LAUNCHER: Launcher | None = None  # the bisect's, made once from its options (bisect())


def launcher_for(cfg: Config, out: Path) -> Launcher:
    """How every run of this bisect is launched, chosen once: a SLURM job per run, or each
    candidate's runs (its trials included) as forks of one preloaded runner (the workspace's own
    repros), or a new interpreter per run (a user's script, ``--fresh-process``)."""
    return Launcher(How(fresh=cfg.fresh_process or not cfg.preload or cfg.jobs > 1, slurm=cfg.slurm,
                        nodes=cfg.nodes[0], ranks_per_node=cfg.nodes[1],
                        runner_stderr=out / "logs" / "preloaded.stderr"), log=log)


def run_repro(cfg: Config, out: Path, python: Path, extra_env: dict | None = None,
              import_name: str | None = None, log_stem: Path | None = None,
              candidate: str = "") -> tuple[int, str | None, bool]:
    """One run of the repro in ``python``'s environment: (code, reason, final)."""
    global LAUNCHER
    own = own_repro(cfg.repro)
    argv = [str(cfg.repro), *cfg.repro_args, *(own.fresh_args if own and cfg.fresh_process else ())]
    if own and import_name and "--import-name" not in cfg.repro_args:
        argv += ["--import-name", import_name]
    if LAUNCHER is None:
        LAUNCHER = launcher_for(cfg, out)
    r = LAUNCHER.run(Run(tuple(argv), python, kind=cfg.run_as, env=extra_env or {}, timeout=cfg.timeout,
                         signature=cfg.signature, bad_output=cfg.bad_output, log_stem=log_stem,
                         own=cfg.preload, code=candidate,
                         check_replicas=cfg.check_replicas, sandbox=cfg.sandbox,
                         multinode=own.multinode if own else "torchrun"))
    if cfg.hang and (r.reason or "").startswith("timed out"):  # a hang is the bug's signature
        return contract.BAD, f"it hangs: {r.reason}", False
    reason = r.reason if r.code != 1 else (r.reason or "bug signature seen")
    if r.leftovers:  # processes that left the run's group and outlived it (daemons): killed
        reason = f"{reason or 'clean'}; it left {len(r.leftovers)} process(es) behind, killed"
    return r.code, reason, r.final


def close_launcher() -> None:
    global LAUNCHER
    if LAUNCHER is not None:
        LAUNCHER.close()
    LAUNCHER = None


def release_predicate(cfg: Config, out: Path):
    def test(candidate: str):
        if cfg.axis == "torch":
            package, version, torch = cfg.package, cfg.lightning, candidate
        else:
            package, version = cfg.package, candidate
            torch = cfg.torch if cfg.torch != "auto" else envs.era_torch(
                index.release(package, version).uploaded)
        what = f"[{package} {version}, torch {torch}]"
        ENV_OF[candidate] = env_name(package, version, torch, cfg.extra)
        try:
            python = release_env(package, version, torch, cfg.extra)
        except envs.EnvError as err:
            return 125, f"{what} environment: {err}", False  # offline now, fine later: retried
        code, reason, final = run_repro(cfg, out, python,
                                        log_stem=out / "logs" / f"{package}-{version}-torch{torch}",
                                        candidate=candidate)
        return code, f"{what} {reason or 'clean'}", final
    return test


ENV_NOTES: dict[str, str] = {}  # environment name -> how it was resolved (for the report)
ENV_OF: dict[str, str] = {}  # release candidate -> the name of its environment in this run


def release_env(package: str, version: str, torch: str, extra: tuple[str, ...] = ()) -> Path:
    """The cached era-correct environment of one release with one torch (``envs.plan``, the same
    resolution as a matrix cell's), with the repro's ``--with`` requirements."""
    name = env_name(package, version, torch, extra)
    plan = envs.install_plan(package, version, torch, extra)
    ENV_NOTES[name] = plan.describe()
    return envs.ensure(name, plan.args, log=print)


def env_name(package: str, version: str, torch: str, extra: tuple[str, ...] = ()) -> str:
    tail = f"-with-{hashlib.sha256(json.dumps(extra).encode()).hexdigest()[:8]}" if extra else ""
    return f"{package}-{version}-torch{torch}{tail}"


def mode(cfg: Config) -> str:
    """The state keeps the faithful mode's verdicts apart: re-checking with it runs again."""
    return "|fresh-process" if cfg.fresh_process else ""


def release_key(cfg: Config, candidate: str) -> str:
    what = (f"{cfg.package}=={cfg.lightning}|torch=={candidate}" if cfg.axis == "torch" else
            f"{cfg.package}=={candidate}|torch=={cfg.torch}")
    return f"{cfg.repro_key}|{what}|py{PY}{mode(cfg)}{signature_key(cfg)}"


def signature_key(cfg: Config) -> str:
    """The rest of a verdict's key: the signature, and what ``--with`` adds to the environments."""
    return ((f"|signature={cfg.signature}" if cfg.signature else "")
            + (f"|with={','.join(cfg.extra)}" if cfg.extra else "")
            + (f"|check-replicas={cfg.check_replicas}" if cfg.check_replicas else "")
            + (f"|nodes={cfg.nodes[0]}x{cfg.nodes[1]}" if cfg.nodes[0] > 1 else "")
            + (f"|hang={cfg.timeout:g}" if cfg.hang else "")
            + (f"|bad-output={cfg.bad_output}" if cfg.bad_output else ""))


# -- tiers ---------------------------------------------------------------------------------

def candidate_releases(cfg: Config) -> list[str]:
    name = "torch" if cfg.axis == "torch" else cfg.package
    found = index.releases(name)
    oldest = Version(cfg.oldest) if cfg.axis == "lightning" else Version("1.13.0")
    return [str(v) for v, r in found.items() if v >= oldest and r.installable_on(PY)]


def release_ends(cfg: Config) -> tuple[list[str], int | None, int]:
    """The candidates and the indexes of the given ends, checked before anything runs."""
    try:
        Version(cfg.oldest)
    except InvalidVersion:
        raise BadInput(f"--oldest {cfg.oldest!r} is not a release version") from None
    names = candidate_releases(cfg)
    if not names:
        raise BadInput(f"no installable release of {cfg.package} since {cfg.oldest}")
    for v in filter(None, [cfg.good, cfg.bad]):
        try:
            Version(v)
        except InvalidVersion:
            raise BadInput(f"{v!r} is not a release version") from None
        if v not in names:
            raise BadInput(f"unknown or uninstallable release {v!r} (candidates: "
                           f"{names[0]} .. {names[-1]})")
    if cfg.find_fix:  # the engine's old state is "the bug is there", its new state "fixed"
        bad = names.index(cfg.good) if cfg.good else len(names) - 1
        good = names.index(cfg.bad) if cfg.bad else None
        if good is not None and good >= bad:
            raise BadInput("with --find-fix, --bad (with the bug) must be older than --good (fixed)")
        return names, good, bad
    bad = names.index(cfg.bad) if cfg.bad else len(names) - 1
    good = names.index(cfg.good) if cfg.good else None
    if good is not None and good >= bad:
        raise BadInput("--good must be older than --bad")
    return names, good, bad


def release_tier(cfg: Config, ends, log, out: Path) -> tuple[Outcome, list[str], Bisector]:
    names, good, bad = ends
    b = Bisector(names, release_predicate(cfg, out), lambda c: release_key(cfg, c),
                 State(cfg.state), 1, log, fix=cfg.find_fix, jobs=cfg.jobs, round_scope=round_scope(cfg))
    # the rate is measured where the bug shows: the old end of a fix bisect
    at = names[good if cfg.find_fix and good is not None else bad]
    if cfg.trials == "auto" and cfg.find_fix and good is None:
        raise BadInput("--find-fix --trials auto needs --bad (a release with the bug) to measure its rate")
    b.trials = b.auto_trials(at) if cfg.trials == "auto" else cfg.trials
    return b.run(good, bad), names, b


def base_release(cfg: Config, bad_ref: str, bad_date: str, first_bad: str | None) -> str | None:
    """The release whose resolved dependency set the commits run on: the release tier's first bad
    release, else the bad ref when it names a release, else the newest release out by the bad
    commit's date (None: there is none; the commits' own requirements are used)."""
    if first_bad:
        return first_bad
    found = index.releases(cfg.package)
    try:
        if Version(bad_ref) in found and found[Version(bad_ref)].installable_on(PY):
            return str(Version(bad_ref))
    except InvalidVersion:
        pass
    moment = datetime.fromisoformat(bad_date)
    out = [v for v, r in found.items() if r.uploaded <= moment and r.installable_on(PY)]
    return str(max(out)) if out else None


def source_env(path: Path) -> dict:
    """What a run needs to import the checkout at ``path`` under every Lightning import name."""
    pythonpath = os.pathsep.join(filter(None, [str(INJECT), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": pythonpath, "WORKSPACE_LIGHTNING_SRC": str(path / "src")}


def commit_tier(cfg: Config, good_ref: str, bad_ref: str, log, out: Path, first_bad: str | None = None):
    from tools import gitrange

    source = cfg.repo
    repo = gitrange.open_repo(source, CACHE / "repos")
    good, bad = gitrange.resolve(repo, good_ref), gitrange.resolve(repo, bad_ref)
    good, bad, notes = gitrange.mainline(repo, good, bad)
    commits = gitrange.first_parent(repo, good, bad)
    if not commits:
        raise BadInput(f"no commits between {good_ref} and {bad_ref} along the first parent")
    candidates = [gitrange.commit_info(repo, good), *commits]
    by_sha = {c.sha: c for c in candidates}
    # a worktree of its own: a second bisect at the same time takes the next one (and each of
    # this one's parallel probes one of its own)
    trees = queue.SimpleQueue()
    for _ in range(min(cfg.jobs, len(candidates))):
        trees.put(gitrange.Worktree.claim(repo, CACHE / "worktrees" / repo.working_dir.split("/")[-1]))
    base = base_release(cfg, bad_ref, candidates[-1].date, first_bad)
    if cfg.torch != "auto":
        torch = cfg.torch
    elif base:  # the torch the release tier gave that release: its environment is reused as it is
        torch = envs.era_torch(index.release(cfg.package, base).uploaded)
    else:
        torch = envs.era_torch(datetime.fromisoformat(candidates[-1].date))
    base_name = base and f"{cfg.package} {base}'s dependencies"
    used = {"base": 0, "own": 0}

    def own_requirements(sha: str, tree):
        reqs = [*tree.requirements(), *cfg.extra]
        moment = datetime.fromisoformat(by_sha[sha].date)
        key = hashlib.sha256(json.dumps([reqs, torch]).encode()).hexdigest()[:12]
        plan = envs.plan(reqs, torch, moment)
        ENV_NOTES[f"commit-{key}"] = plan.describe()
        return envs.ensure(f"commit-{key}", plan.args, log=log)

    def test(sha: str):
        tree = trees.get()  # held for the whole step: its files are the commit's source
        try:
            return _test(sha, tree)
        finally:
            trees.put(tree)

    def _test(sha: str, tree):
        path = tree.checkout(sha)
        if not (path / "src" / "lightning" / "pytorch").is_dir():  # the layout before 1.8
            return 125, "no src/lightning/pytorch at this commit: cannot run it from source", True
        note = ""
        if base:
            try:
                python = release_env(cfg.package, base, torch, cfg.extra)
            except envs.EnvError as err:
                return 125, f"environment of {base_name}: {err}", False
            code, reason, final = run_repro(cfg, out, python, source_env(path), "lightning.pytorch",
                                            out / "logs" / sha[:12], candidate=sha)
            if not (code == contract.SKIP and reason and IMPORT_FAILED.search(reason)):
                used["base"] += 1
                return code, reason, final
            note = f"on {base_name} the import failed ({reason[:100]}); "
        try:
            python = own_requirements(sha, tree)
        except envs.EnvError as err:
            return 125, f"{note}environment of the commit's own requirements: {err}", False
        used["own"] += 1
        code, reason, final = run_repro(cfg, out, python, source_env(path), "lightning.pytorch",
                                        out / "logs" / f"{sha[:12]}-own", candidate=f"{sha}-own")
        return code, f"{note}with the commit's own requirements: {reason or 'clean'}", final

    def key(sha: str) -> str:
        on = f"|on {cfg.package}=={base}" if base else ""
        return f"{cfg.repro_key}|commit {sha}|torch=={torch}{on}|py{PY}{mode(cfg)}{signature_key(cfg)}"

    b = Bisector([c.sha for c in candidates], test, key, State(cfg.state), 1, log,
                 label=lambda sha: by_sha[sha].label, fix=cfg.find_fix, jobs=cfg.jobs,
                 round_scope=round_scope(cfg))
    at = candidates[0 if cfg.find_fix else -1].sha  # where the bug shows
    b.trials = b.auto_trials(at) if cfg.trials == "auto" else cfg.trials
    outcome = b.run(0, len(candidates) - 1)
    base_note = ENV_NOTES.get(env_name(cfg.package, base, torch, cfg.extra), "made by an earlier run")
    how = (f"each commit's source (not installed) on the environment of {cfg.package} {base} with "
           f"torch {torch} ({base_note})"
           if base else f"each commit's source on its own requirements with torch {torch}")
    if used["own"] and base:
        how += f"; {used['own']} commit(s) could not import there and ran on their own requirements"
    return outcome, candidates, [*notes], torch, source, b, how


# -- report --------------------------------------------------------------------------------

def github(source: str | None) -> str | None:
    from tools import gitrange

    src = source or gitrange.UPSTREAM
    return src.removesuffix(".git") if src.startswith("https://github.com/") else gitrange.UPSTREAM


def end_name(end: str, words: dict) -> str:
    """An end by the engine's term in the report's words: "bad end", "end with the bug"."""
    return "end with the bug" if words[end] == "with the bug" else f"{words[end]} end"


def tier_facts(o: Outcome, label, what: str, words: dict) -> list[str]:
    """What every report says of a tier: the tally, the order of the verdicts, the ends' rates."""
    tally = o.tally()
    reasons = {}
    for s in o.steps:
        if s.candidate in tally["untestable"] and s.reason:
            reasons[label(s.candidate)] = s.reason
    lines = [f"- {what} tested: {len(tally['good'])} {words['good']}, {len(tally['bad'])} {words['bad']}, "
             f"{len(tally['untestable'])} could not be tested"
             + (":" if reasons else ".")]
    lines += [f"  - {name}: {reason[:200]}" for name, reason in reasons.items()]
    if o.non_monotonic:
        lines.append("- **Not monotonic**: " + "; ".join(o.non_monotonic) + ". The bug comes and "
                     "goes in this range: the boundary named is the one nearest the bad end.")
    elif len(tally["good"]) + len(tally["bad"]) > 1:
        lines.append(f"- Monotonic over what was tested: every candidate {words['good']} is older "
                     f"than every one {words['bad']}.")
    for end in ("bad", "good"):
        e = o.ends.get(end)
        if e:
            lines.append(f"- Reproduction rate at the {end_name(end, words)} {label(e['candidate'])}: "
                         "the bug "
                         f"showed in {e['bad']}/{e['runs']} runs.")
    return lines


def report(cfg: Config, argv, release: dict | None, commit: dict | None, seconds: float) -> str:
    lines = ["## Bisect result" + (" (the fix)" if cfg.find_fix else ""), ""]
    cmd = "nox -s bisect -- " + shlex.join(argv)
    words = {"good": "with the bug", "bad": "fixed"} if cfg.find_fix else {"good": "good", "bad": "bad"}
    first = "First fixed" if cfg.find_fix else "First bad"
    if release:
        o = release["outcome"]
        what = "torch" if cfg.axis == "torch" else cfg.package
        if o.status == "no-good" and cfg.find_fix:
            lines.append(f"**The bug showed in no {what} release tested** (searched back from "
                         f"{(o.ends.get('bad') or {}).get('candidate') or cfg.good} to {o.first_bad}, "
                         f"the oldest tested; --oldest {cfg.oldest}): no fix to find in this range.")
        elif o.status == "no-good":
            lines.append(f"**Bad in every {what} release tested — not a regression in this range** "
                         f"(searched back from {(o.ends.get('bad') or {}).get('candidate') or cfg.bad} "
                         f"to {o.first_bad}, the oldest tested; --oldest {cfg.oldest}).")
        elif o.status == "found" and cfg.find_fix:
            lines.append(f"First fixed {what} release: **{o.first_bad}** (the last with the bug: "
                         f"{o.last_good}).")
        elif o.status == "found":
            lines.append(f"First bad {what} release: **{o.first_bad}** (last good: {o.last_good}).")
        elif o.status == "untestable":
            lines.append(f"**No answer: {o.why}.** This is no verdict on the bug: the candidates "
                         "below could not be tested.")
        else:
            lines.append(f"{first} {what} release is one of {', '.join(o.skipped_between)}, "
                         f"{o.first_bad} (the others could not be tested).")
        lines += ["", *tier_facts(o, str, f"{what} releases", words)]
        for end in ("bad", "good"):
            e = o.ends.get(end)
            if e:
                name = ENV_OF.get(e["candidate"])
                lines.append(f"- Environment of the {end_name(end, words)}: " + (
                    f"`{name}`, {ENV_NOTES[name]}." if name in ENV_NOTES else
                    "not made by this run (its verdicts came from the state file)."))
    if not commit and not cfg.repo and release and release["outcome"].status == "found" \
            and cfg.axis == "lightning":
        lines += ["", f"Commits not searched: no Lightning repository ({contract.REPO_HOW})."]
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
            lines.append(f"{first} commit{' (the fix)' if cfg.find_fix else ''}: "
                         f"[`{c.sha[:12]}`]({base}/commit/{c.sha}) "
                         f"{c.subject}{pr}")
        elif o.status == "untestable":
            lines.append(f"**No commit named: {o.why}.** This is no verdict on the bug.")
        else:
            lines.append(f"{first} commit is one of: "
                         f"{', '.join(s[:12] for s in [*o.skipped_between, o.first_bad])}")
        label = lambda sha: by_sha[sha].label if sha in by_sha else sha  # noqa: E731
        lines += ["", *tier_facts(o, label, "commits", words),
                  f"- How commits ran: {commit['how']}."]
    torch = commit["torch"] if commit else cfg.torch
    lines += ["", f"Repro: `{cfg.repro_text}`" +
              (f", bad when the output matches `/{cfg.signature}/`" if cfg.signature else "") +
              (f", bad when a run that exits 0 prints `/{cfg.bad_output}/`" if cfg.bad_output else "") +
              (f", replicas checked (`--check-replicas={cfg.check_replicas}`: bad when they "
               "diverge)" if cfg.check_replicas else "") +
              "; trials per step: " + "; ".join(trials_text(t["bisector"]) for t in
                                                filter(None, [release, commit])),
              f"Python {platform.python_version()}, "
              f"torch {torch if cfg.axis != 'torch' else 'bisected'}"
              f"{f', Lightning {cfg.lightning}' if cfg.lightning else ''}; {seconds:.0f} s.",
              "", "Reproduce the bisect:", "", f"```\n{cmd}\n```", "",
              "<details><summary>Step log</summary>", "",
              "| candidate | verdict | runs | s | cached | note |",
              "|---|---|---|---|---|---|"]
    subjects = {c.sha: c.label for c in (commit or {}).get("candidates", [])}
    for tier in filter(None, [release, commit]):
        for s in tier["outcome"].steps:
            name = subjects.get(s.candidate, s.candidate).replace("|", "/")
            verdict = words.get(s.verdict, s.verdict)
            lines.append(f"| {name} | {verdict} | {len(s.codes)} | {s.seconds:.0f} | "
                         f"{'yes' if s.cached else ''} | {(s.reason or '').replace('|', '/')[:140]} |")
    lines += ["", "</details>", ""]
    return "\n".join(lines)


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


def trials_text(b: Bisector) -> str:
    if b.rate is None:
        return str(b.trials)
    return (f"N = {b.trials} (auto: the bug showed in p = {b.rate:.2f} of 5 runs at the bad end; "
            f"a bad step is missed with probability {(1 - b.rate) ** b.trials:.3f})")


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
    writable(CACHE, "the cache folder")
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


def log(msg: str) -> None:
    print(msg, flush=True)


if __name__ == "__main__":
    sys.exit(main())
