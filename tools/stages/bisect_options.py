"""``nox -s bisect``'s options and the run's ``Config``, checked before anything runs."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from tools.core import contract
from tools.environments import matrix
from tools.launch import harness, slurm_jobs

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache"
EXIT = {"found": 0, "no-good": 3, "ambiguous": 4, "untestable": 5}
INJECT = ROOT / "tools" / "inject"  # on a commit's PYTHONPATH: its source under every import name
# a run that failed to import what it needs (another dependency set may serve)
IMPORT_FAILED = re.compile(r"ImportError|ModuleNotFoundError|cannot import name|No module named")
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
BadInput = contract.BadInput
DESCRIPTION = "``nox -s bisect``: find where a regression came in, releases first, then Lightning commits."


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
        from tools.stages.project import project_files

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
    p = contract.Parser(prog="nox -s bisect --", description=DESCRIPTION)
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
    target.add_argument("--lightning",
                        help="the fixed Lightning release on the torch axis (needed with --axis torch)")
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
    running.add_argument("--timeout", type=contract.seconds, default=600.0, metavar="SECONDS",
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


def log(msg: str) -> None:
    print(msg, flush=True)
