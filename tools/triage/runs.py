"""The runs: a cell (a Lightning release on a torch) run ``--trials`` times in the sandbox, resumed
from an earlier triage of the same input; Lightning master from a checkout; the releases a
report names, resolved; the differential of a release that worked against the broken one."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.core import contract
from tools.core.contract import BadInput, HarnessFailure
from tools.environments import envs, index
from tools.launch.launcher import How, Launcher, Run
from tools.triage import read, signatures
from tools.triage.progress import progress

NEWEST_TORCH = "2.13.0"  # the newest torch this workspace runs on (its CPU build)


def resolve(package: str, version: str | None) -> str | None:
    """A stated Lightning version as a release: ``2.4`` is the newest 2.4.x; None if unknown."""
    if not version:
        return None
    known = [str(v) for v, r in index.releases(package).items() if not v.is_prerelease and not r.yanked]
    if version in known:
        return version
    series = [v for v in known if v.startswith(version + ".")]
    return series[-1] if series else None



@dataclass
class Cell:
    label: str  # "reporter's", "newest"
    package: str
    lightning: str
    torch: str
    verdicts: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0
    python: Path | None = None  # its environment's interpreter, once made
    source: str | None = None  # a Lightning checkout run from source (master), on ``base``'s environment
    base: str | None = None

    @property
    def bad(self) -> int:
        return self.verdicts.count("bad")

    @property
    def tested(self) -> int:
        return self.bad + self.verdicts.count("good")

    @property
    def rate(self) -> str:
        """bad of the runs that could test, and the ones that could not apart."""
        skips = len(self.verdicts) - self.tested
        return f"{self.bad}/{self.tested}" + (f" ({skips} could not test)" if skips else "")


RUNS: list[float] = []  # seconds of each run of the cells so far (the ETA)


def eta(left: int) -> str:
    """``left`` more runs at the mean pace so far."""
    return f", ETA ~{left * sum(RUNS) / len(RUNS):.0f} s for the cells" if RUNS and left else ""


def run_cell(cell: Cell, script: Path, args, out: Path, launcher: Launcher, site, after: int = 0) -> None:
    """``--trials`` runs of the script in ``cell``; ``after``: the runs of the cells still to come."""
    from tools.stages import bisect_tiers

    progress("run", f"{cell.label} cell: {cell.package} {cell.lightning} + torch {cell.torch}")
    try:
        python = bisect_tiers.release_env(cell.package, cell.base or cell.lightning, cell.torch, ())
    except envs.EnvError as err:
        cell.verdicts, cell.reasons = ["skip"], [f"environment: {err}"]
        return
    cell.python = python
    env = bisect_tiers.source_env(Path(cell.source)) if cell.source else {}
    started = time.monotonic()
    for trial in range(args.trials):
        name = cell.lightning.replace(" ", "-")
        stem = out / "logs" / f"{cell.package}-{name}-torch{cell.torch}-{trial + 1}"
        r = launcher.run(Run((str(script),), python, env=env, timeout=args.timeout, signature=args.signature,
                             bad_output=args.bad_output, log_stem=stem, check_replicas=args.check_replicas,
                             sandbox=sandbox_mode(args)))
        verdict, reason = r.verdict, r.reason or ""
        logs = [Path(p) for p in (r.stdout_path, r.stderr_path) if p and Path(p).exists()]
        logs += sorted(stem.parent.glob(f"{stem.name}.node*"))  # a job of several nodes: each one's
        text = "\n".join(p.read_text(errors="replace")[-200_000:] for p in logs) if verdict == "bad" else ""
        if verdict == "bad" and site is not None:
            raw = _crash_site(text, args.signature)
            here = signatures.normal_site(raw)
            own = signatures.same_exception_in_own_code(here, site) and Path(raw[1]).name == script.name
            if here != site and own:
                # the posted script is often not the one that made the traceback (a helper
                # inlined, renamed): in the reporter's own code the exception is what counts
                reason = (f"the signature, raised in the script's `{here[2]}` (the report's traceback: "
                          f"`{site[2]}`; the script was edited since?)")
            elif here != site:
                verdict, reason = "skip", (f"the signature, but raised elsewhere: {here} (reported: "
                                           f"{site})")
        if getattr(args, "hang", False) and reason.startswith("timed out"):  # the hang the report says
            verdict, reason = "bad", f"it hangs: {reason}"
        if r.code >= contract.FAIL:
            if r.returncode is None or (r.reason or "").startswith("harness failure"):
                # the harness could not start it or keep its logs (a full disk): never the script's
                raise HarnessFailure(f"{cell.label} cell: {reason}")
            verdict, reason = "skip", f"the script exited {r.returncode} (its own failure): {reason}"
        cell.verdicts.append(verdict)
        cell.reasons.append(reason)
        if verdict == "bad":
            SEEN.setdefault(cell.label, text)
        RUNS.append(r.seconds)
        left = args.trials - trial - 1 + after
        progress("run", f"  trial {trial + 1}/{args.trials}: {verdict} ({reason[:120]}){eta(left)}")
    cell.seconds = round(time.monotonic() - started, 1)


SEEN: dict[str, str] = {}  # a cell's label -> the output of its first bad run (for known bugs)


def cells_key(code: str, args) -> str:
    """What a cell's runs depend on besides its versions: the script as run, how it is judged."""

    said = json.dumps([code, args.signature, args.check_replicas, args.timeout, args.trials,
                       list(getattr(args, "nodes", (1, 1))), sandbox_mode(args),
                       getattr(args, "hang", False), getattr(args, "bad_output", None)])
    return hashlib.sha256(said.encode()).hexdigest()


def earlier_cells(out: Path, code: str, args) -> list[dict]:
    """The cells an earlier triage of the same input finished with the same script and judgement
    (an interrupted or repeated triage resumes there)."""
    try:
        t = json.loads((out / "triage.json").read_text())
    except (OSError, ValueError):
        return []
    if t.get("cells_key") != cells_key(code, args):
        return []
    return [c for c in t.get("cells") or [] if len(c.get("verdicts") or []) == args.trials]


def resume(cell: Cell, earlier: list[dict], out: Path) -> bool:
    """``cell``'s runs from the earlier triage, when it made them all; its first bad run's output
    read back from its logs."""
    done = next((c for c in earlier if (c["label"], c["package"], c["lightning"], c["torch"]) ==
                 (cell.label, cell.package, cell.lightning, cell.torch)), None)
    if done is None:
        return False
    cell.verdicts, cell.reasons, cell.seconds = list(done["verdicts"]), list(done["reasons"]), done["seconds"]
    cell.python = Path(done["python"]) if done.get("python") not in (None, "None") else None
    if "bad" in cell.verdicts:
        stem = out / "logs" / f"{cell.package}-{cell.lightning.replace(' ', '-')}-torch{cell.torch}-" \
                              f"{cell.verdicts.index('bad') + 1}"
        logs = [Path(f"{stem}.stdout"), Path(f"{stem}.stderr"),
                *sorted(stem.parent.glob(f"{stem.name}.node*"))]
        SEEN.setdefault(cell.label, "\n".join(p.read_text(errors="replace")[-200_000:] for p in logs
                                               if p.exists()))
    progress("run", f"{cell.label} cell: {cell.rate} bad, from the earlier triage of this input")
    return True


def master_cell(args, package: str, newest: str) -> Cell | None:
    """Lightning's master of the configured checkout, its source on the newest release's
    environment (as the commit bisect runs commits); None without a checkout."""
    if not args.repo:
        return None
    import git

    from tools.stages import bisect_options, gitrange

    try:
        repo = gitrange.open_repo(args.repo, bisect_options.CACHE / "repos", log=lambda m: progress("run", m))
        try:  # the source's master now (a local source was fetched by open_repo)
            repo.git.fetch("--quiet", "origin", "+refs/heads/master:refs/remotes/origin/master")
        except git.GitCommandError as err:
            progress("run", f"master not fetched ({str(err).strip().splitlines()[-1][:120]}): the clone's")
        try:
            sha = gitrange.resolve(repo, "origin/master")
        except BadInput:
            sha = gitrange.resolve(repo, "master")
        worktrees = bisect_options.CACHE / "worktrees"
        tree = gitrange.Worktree.claim(repo, worktrees / repo.working_dir.split("/")[-1])
        path = tree.checkout(sha)
    except (BadInput, OSError, git.GitError) as err:
        progress("run", f"no master cell: {err}")
        return None
    return Cell("master", package, f"master {sha[:12]}", NEWEST_TORCH, source=str(path), base=newest)


def _crash_site(text: str, signature: str):
    from tools.minimize.source import crash_site

    return crash_site(text, signature, ())


def sandbox_mode(args) -> bool | str:
    """What a run's ``sandbox`` is: the sandbox (True), with the machine's network ("network"),
    or none at all ("none": ``--allow-unsandboxed``)."""
    return "none" if args.allow_unsandboxed else "network" if args.allow_network else True


def sandbox_flag(args) -> list[str]:
    """The same for ``tools.bisect_cli`` and ``tools.minimize`` run as programs."""
    mode = sandbox_mode(args)
    return [] if mode == "none" else ["--sandbox=network"] if mode == "network" else ["--sandbox"]


def nodes_args(args) -> list[str]:
    n, r = getattr(args, "nodes", (1, 1))
    return ["--nodes", str(n), "--ranks-per-node", str(r)] if n > 1 else []


def run_differential(issue: read.Issue, path: Path, args, out: Path, package: str, said: dict,
                     t: dict) -> bool:
    """A report that names a release that worked and shows no exception: the script run once in
    that release and once in the broken one, and what tells them apart made the predicate
    (``differential``). True when it found one (``args.signature`` or
    ``args.bad_output`` set); ``t["differential"]`` says what ran, or why there is none."""
    from tools.stages import bisect_tiers
    from tools.triage import differential as diff

    worked = diff.worked_release(issue.body)
    if worked is None:
        return False
    good = resolve(package, worked.release)
    bad = resolve(package, said["lightning"] or worked.broken) or newest_release(package)
    d = t["differential"] = {"said": worked.phrase, "worked": good, "broken": bad}
    if good is None or version_key(good) >= version_key(bad):
        d["why"] = (f"the release it says worked ({worked.release}) is no {package} release older than "
                    f"{bad}")
        return False
    torch = said["torch"] if said["torch"] and said["torch"].count(".") == 2 else envs.era_torch(
        index.release(package, bad).uploaded)
    d["torch"] = torch
    ran = {}
    with Launcher(How(nodes=args.nodes[0], ranks_per_node=args.nodes[1])) as launcher:
        for label, release in (("broken", bad), ("worked", good)):
            progress("run", f"differential: the {label} {package} {release} + torch {torch}, once")
            try:
                python = bisect_tiers.release_env(package, release, torch, ())
            except envs.EnvError as err:
                d["why"] = f"no environment for {release}: {err}"
                return False
            stem = out / "logs" / f"differential-{label}-{package}-{release}"
            r = launcher.run(Run((str(path),), python, timeout=args.timeout, sandbox=sandbox_mode(args),
                                 log_stem=stem))
            if r.code >= contract.FAIL and (r.returncode is None or (r.reason or "").startswith("harness")):
                raise HarnessFailure(f"the differential's {label} run: {r.reason}")
            ran[label] = (r.returncode, diff.output(r, stem))
            d[f"{label}_exit"] = r.returncode
    raised = next((e for e in map(read.exception_line, reversed(read.tracebacks(ran["broken"][1]))) if e),
                  None)
    found = diff.predicate(ran["broken"], ran["worked"], "\n".join([issue.body, *issue.comments]),
                           signatures.derive_signature(*raised) if raised else None)
    if isinstance(found, str):
        d["why"] = f"{found} ({bad} against {good})"
        return False
    setattr(args, found.option, found.regex)
    t["worked"] = good
    t.update(signature=args.signature, bad_output=args.bad_output,
             signature_from=f"the differential of {bad} against {good}: {found.why}")
    return True


def newest_release(package: str) -> str:
    return str(max(v for v, r in index.releases(package).items() if not v.is_prerelease and not r.yanked))


def version_key(version: str):
    from packaging.version import Version

    return Version(version)
