"""Where the bug came in or went away, and what it is: the release and commit bisects (and the
bisect for the fix), the minimization, the bugs the workspace knows (their repros, the series'
fix on the reporter's script), and the release a traceback's frames fingerprint."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tools import fingerprint
from tools.core import contract
from tools.core.contract import BadInput, HarnessFailure
from tools.environments import envs, index
from tools.launch.launcher import Launcher, Run
from tools.triage import runs
from tools.triage.progress import progress

ROOT = Path(__file__).resolve().parents[2]  # the workspace


def fingerprinted(frames: list, package: str, repo: str | None, t: dict | None = None) -> str | None:
    """The newest release whose source has every quoted line of the traceback's Lightning frames
    (``nox -s fingerprint``; a Lightning checkout's tags when one is configured, else wheels);
    for a lossy traceback (a frame without its line, a line of an edited file) the newest of
    those that match the most frames, as ``nox -s fingerprint`` ranks them (``t["fingerprint"]``
    says how many matched)."""
    from packaging.version import Version

    mine = [f for f in frames if f.package in fingerprint.PACKAGES[package]]
    versions = fingerprint.releases_since(package, Version("2.0.0"), mine)
    if not versions:
        return None
    if repo:
        from tools.stages import bisect_options, gitrange

        clones = bisect_options.CACHE / "repos"  # a URL: the bisect's clone
        checkout = (gitrange.repo_at(repo) if not gitrange.is_url(repo) else
                    gitrange.open_repo(repo, clones, log=lambda m: progress("read", m)))
        tags = {t.name for t in checkout.tags}
        versions = [v for v in versions if str(v) in tags]
        sources = lambda v: fingerprint.GitSources(checkout, str(v))  # noqa: E731
    else:
        sources = lambda v: fingerprint.WheelSources(package, v)  # noqa: E731
    progress("read", f"fingerprinting {len(mine)} {package} frame(s) over {len(versions)} releases")
    try:
        total, ranking = fingerprint.rank(mine, versions, sources, log=lambda m: None)
    except (OSError, index.UnknownRelease) as err:
        progress("read", f"  fingerprint failed: {err}")
        return None
    if not total or not ranking or not ranking[0][0]:
        return None
    score, best = ranking[0]
    if score * 2 < total:  # fewer than half the frames: no release is the reporter's
        return None
    if t is not None:
        t["fingerprint"] = {"matched": score, "frames": total, "releases": best}
    return best[-1]


def bisect(script: Path, args, out: Path, oldest: str, package: str, torch: str = runs.NEWEST_TORCH,
           fix: tuple[str, str] | None = None, torch_axis: tuple[str, str, str] | None = None) -> dict | None:
    """The release bisect (then the commits with a repo) as ``nox -s bisect`` runs it; with
    ``fix`` (a release with the bug, a newer one without it) the bisect for the fix; with
    ``torch_axis`` (a Lightning release, an older and a newer torch) torch's releases, that
    Lightning release fixed."""
    cmd = [sys.executable, "-m", "tools.bisect_cli", "--tier", "both" if args.repo else "releases",
           "--package", package, "--script", str(script), "--torch", torch, "--oldest", oldest,
           "--out", str(out / "bisect"), "--timeout", str(args.timeout), *runs.sandbox_flag(args)]
    if torch_axis:
        lightning, older, newer = torch_axis
        cmd[cmd.index("--tier") + 1] = "releases"
        cmd += ["--axis", "torch", "--lightning", lightning]
        if not fix:
            cmd += ["--good", older, "--bad", newer]
    if fix:
        cmd += ["--find-fix", "--bad", fix[0], "--good", fix[1]]
    if getattr(args, "auto", False):
        cmd += ["--trials", "auto"]
    cmd += ["--jobs", args.jobs, *runs.nodes_args(args), *(["--state", args.state] if args.state else [])]
    if args.signature:
        cmd += ["--signature", args.signature]
    if args.check_replicas:
        cmd.append(f"--check-replicas={args.check_replicas}")
    if getattr(args, "hang", False):
        cmd.append("--hang")
    if getattr(args, "bad_output", None):
        cmd += ["--bad-output", args.bad_output]
    if args.repo:
        cmd += ["--repo", args.repo]
    progress("bisect", shlex.join(cmd[2:]))
    proc = subprocess.run(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(proc.stderr)
    if proc.returncode >= contract.FAIL:
        raise HarnessFailure(f"the bisect failed (exit {proc.returncode})")
    try:
        return {"exit": proc.returncode, **json.loads((out / "bisect" / "report.json").read_text()),
                "markdown": (out / "bisect" / "report.md").read_text()}
    except (OSError, ValueError):  # no report: its one-line reason (an end that does not hold)
        said = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return {"exit": proc.returncode, "markdown": None, "why": said.removeprefix("error: ")}


def minimize(script: Path, args, out: Path, python: Path) -> dict | None:
    if not args.budget:
        return None
    if getattr(args, "hang", False):  # every candidate would run to its limit
        return {"exit": None, "lines": None, "why": "a hang is not minimized"}
    if getattr(args, "bad_output", None):
        return {"exit": None, "lines": None, "why": "a behaviour without an exception is not minimized"}
    target = out / "minimize"
    cmd = [sys.executable, "-m", "tools.minimize", str(script), "--python", str(python), "--budget",
           str(args.budget), "--out", str(target)]
    cmd += runs.sandbox_flag(args)
    if args.signature:
        cmd += ["--signature", args.signature]
    if args.check_replicas:
        cmd.append(f"--check-replicas={args.check_replicas}")
    cmd += runs.nodes_args(args)
    progress("minimize", f"{args.budget:g} min")
    proc = subprocess.run(cmd, cwd=ROOT)
    result = target / "minimized.py"
    if proc.returncode == 0 and result.is_file():
        from tools.minimize.source import size

        lines, before = size({"m": result.read_text()})[0], size({"s": script.read_text()})[0]
        if lines < before:  # only a smaller one goes in the comment
            return {"lines": lines, "of": before, "code": result.read_text()}
        return {"exit": 0, "lines": None, "why": f"not smaller ({lines} of {before} lines)"}
    return {"exit": proc.returncode, "lines": None}



def known(text: str) -> list:
    """The workspace's repros (``repro/matrix.toml``) whose ``known_as`` the text shows: what a
    report's traceback, or a run of the reporter's script, has in common with a bug we know."""
    from tools.environments import matrix

    return [r for r in matrix.load().repros if r.known_as and re.search(r.known_as, text)]


def patches_for(repro) -> list:
    """The series' patches whose ``X-Repro`` is that repro: the fix the workspace has for it."""
    from tools.series import patches

    return [p for p in patches.series() if p.repro and p.repro[0] == repro.script]


def run_known(repro, package: str, lightning: str, torch: str, args, out: Path, launcher: Launcher) -> dict:
    """The workspace's repro in the reporter's versions, ``--trials`` times: its own verdicts."""
    from tools.stages import bisect_tiers

    row = {"repro": repro.name, "issue": repro.issue, "script": repro.script, "package": package,
           "lightning": lightning, "torch": torch, "verdicts": [], "reasons": []}
    progress("known", f"{repro.name} (#{repro.issue}) on {package} {lightning} + torch {torch}")
    try:
        python = bisect_tiers.release_env(package, lightning, torch, ())
    except envs.EnvError as err:
        row.update(verdicts=["skip"], reasons=[f"environment: {err}"])
        return row
    for trial in range(args.trials):
        stem = out / "logs" / f"known-{repro.name}-{trial + 1}"
        argv = [a.replace("{out}", f"{stem}.d") for a in repro.args]
        r = launcher.run(Run((str(ROOT / repro.script), *argv), python, timeout=args.timeout,
                             log_stem=stem, own=True))
        row["verdicts"].append(r.verdict)
        row["reasons"].append(r.reason or "")
        progress("known", f"  trial {trial + 1}/{args.trials}: {r.verdict} ({(r.reason or '')[:120]})")
    bad, tested = row["verdicts"].count("bad"), sum(v in ("bad", "good") for v in row["verdicts"])
    row["rate"] = f"{bad}/{tested}"
    row["tested"] = tested
    return row


def fixed_by_series(script: Path, repro, cell_id: str, args, out: Path) -> dict:
    """The reporter's script without and with the series in a cell the series targets, as
    ``nox -s patches -- --script`` runs it: the evidence that it is the known bug."""
    from tools import validate_patches
    from tools.environments import matrix
    from tools.series import patches

    cells = {c.id: c for c in matrix.load().cells}
    series = patches.series()
    progress("known", f"the reporter's script without and with the series in {cell_id}")
    row = validate_patches.script_row(
        validate_patches.Script(script, args.signature, (cell_id,), "python", args.check_replicas,
                                runs.sandbox_mode(args), getattr(args, "nodes", (1, 1))),
        cells[cell_id], series, out / "known")
    return {"repro": repro.name, "issue": repro.issue, "cell": cell_id, "patches": row["on_top_of"],
            "before": row["before"], "after": row["after"], "after_detail": row["after_detail"],
            "runs": [row["before_runs"], row["after_runs"]], "ok": row["ok"]}


def runs_made(k: dict) -> str:
    """How many runs the series' evidence took, in words."""
    before, after = k.get("runs") or (1, 1)
    if before == after == 1:
        return "one run each"
    return (f"{before} run(s) without, {after} with: a run that died of a signal before a verdict "
            "was made again")


def series_cell(package: str, lightning: str, torch: str, fixes: list) -> str | None:
    """The matrix cell of these versions, if a patch of the fix targets it."""
    from tools.environments import matrix

    for c in matrix.load().cells:
        if (c.package, c.lightning, c.torch) == (package, lightning, torch) and any(
                c.id in p.cells for p in fixes):
            return c.id
    return None


def known_bug(script: Path, package: str, cell: runs.Cell, args, out: Path, t: dict) -> str:
    """A reproduced report that shows a bug the workspace has a fix for in its series: the
    reporter's script without and with the series, in the newest cell. The status's words."""
    text = "\n".join([*t.get("tracebacks", []), script.read_text(errors="replace"),
                      runs.SEEN.get(cell.label, "")])
    said = []
    for repro in known(text):
        fixes = patches_for(repro)
        cell_id = series_cell(package, cell.lightning, cell.torch, fixes) if fixes else None
        if cell_id is None:
            t.setdefault("known", []).append({"repro": repro.name, "issue": repro.issue,
                                              "patches": [p.name for p in fixes], "ok": None})
            said.append(f"it looks like #{repro.issue} (no patch of the series to try here)")
            continue
        try:
            row = fixed_by_series(script, repro, cell_id, args, out)
        except (envs.EnvError, OSError, BadInput, subprocess.SubprocessError) as err:
            t.setdefault("known", []).append({"repro": repro.name, "issue": repro.issue, "ok": None,
                                              "patches": [p.name for p in fixes], "why": str(err)[:200]})
            said.append(f"it looks like #{repro.issue}; the series' fix could not be tried "
                        f"({str(err)[:100]})")
            continue
        t.setdefault("known", []).append(row)
        verdicts = f"{row['before']} before, {row['after']} after"
        if row["ok"]:
            said.append(f"it is #{repro.issue}: {verdicts} with the series' fix ({runs_made(row)})")
        elif row["before"] != "bad" or row["after"] == "skip":  # a run that shows nothing either way
            said.append(f"it looks like #{repro.issue}; inconclusive: {verdicts} with the series' fix")
        else:
            said.append(f"it looks like #{repro.issue}, but the series' fix does not change it ({verdicts})")
    return "".join(f"; {x}" for x in said)


def traceback_matches(matches: list, tbs: list[str], said: dict, args, out: Path, t: dict) -> str:
    """A report without a script whose traceback shows a bug the workspace knows: that bug's repro
    in the reporter's versions (stated, else fingerprinted), with its rate."""
    text = "\n".join(tbs)
    package = fingerprint.guess_package(text)
    lightning = runs.resolve(package, said["lightning"])
    how = "stated"
    if lightning is None:
        lightning, how = fingerprinted(fingerprint.parse(text), package, args.repo, t), "fingerprinted"
        found = t.get("fingerprint") or {}
        if lightning and found["matched"] < found["frames"]:
            how = f"fingerprinted: the best match, {found['matched']} of {found['frames']} frames"
    if lightning is None:
        lightning, how = runs.newest_release(package), "unknown: the newest"
    torch = said["torch"] if said["torch"] and said["torch"].count(".") == 2 else envs.era_torch(
        index.release(package, lightning).uploaded)
    t["known_cell"] = {"package": package, "lightning": lightning, "torch": torch, "versions": how}
    with Launcher() as launcher:
        rows = [run_known(r, package, lightning, torch, args, out, launcher) for r in matches]
    t["known"] = rows
    said_rows = [f"it matches #{r['issue']} (the workspace's repro `{r['repro']}`): "
                 + (f"bad {r['rate']}" if r.get("tested") else  # no run could test: no verdict
                    f"could not test ({(r['reasons'] or ['no run'])[0][:100]})")
                 + f" on {package} {lightning} + torch {torch}" for r in rows]
    return "; ".join(said_rows)
