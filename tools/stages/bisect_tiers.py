"""The bisect's two tiers: PyPI releases, each in its era's environment, then Lightning's
first-parent commits, each on the first bad release's environment with the commit's source; the
predicate a candidate is judged by, and the launcher its runs go through."""

from __future__ import annotations

import hashlib
import json
import os
import queue
from datetime import datetime
from pathlib import Path

from packaging.version import InvalidVersion, Version

from tools.core import contract
from tools.core.contract import BadInput
from tools.environments import envs, index
from tools.launch import slurm_jobs
from tools.launch.launcher import How, Launcher, Run
from tools.stages import bisect_options
from tools.stages.bisect import Bisector, Outcome, State
from tools.stages.bisect_options import IMPORT_FAILED, INJECT, PY, Config, log, own_repro


def round_scope(cfg: Config):
    """With ``--executor slurm`` and ``--jobs K``: each round of probes is one job array."""
    if cfg.slurm is None or cfg.jobs < 2:
        return None
    return lambda probes: slurm_jobs.array_round(probes, cfg.slurm, log)


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
    from tools.stages import gitrange

    source = cfg.repo
    repo = gitrange.open_repo(source, bisect_options.CACHE / "repos")
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
        worktrees = bisect_options.CACHE / "worktrees"
        trees.put(gitrange.Worktree.claim(repo, worktrees / repo.working_dir.split("/")[-1]))
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
