"""``nox -s triage -- ISSUE``: from a reported issue to a paste-ready triage comment backed by runs.

ISSUE is a GitHub issue URL (read through GitHub's REST API, ``GITHUB_TOKEN`` if set, cached under
``.cache/issues/`` so a re-run works offline; ``GITHUB_API_URL`` points elsewhere), or a saved
file: the API's JSON, or the issue's Markdown. The headings of Lightning's bug-report form are
understood.

1. **Read**: the runnable script (the fenced blocks that import torch or Lightning and build a
   ``Trainer`` or a DDP model; blocks that belong together are joined in order), the tracebacks
   (``[rankN]:`` prefixes too), the versions the reporter states, and the signature: the reported
   exception's class and message, never generic (``--signature`` overrides). A run reproduces
   only when it fails with that exception raised at the same place. A report of ranks or results
   drifting apart turns on the replica check (``--check-replicas``).
2. **Run it safely**: pasted code is untrusted. A static check refuses downloads, shell-outs,
   ``eval``/``exec`` of built strings and writes outside the working folder (``--trust`` runs it
   anyway): a courtesy that explains a refusal early, never the defence. Every run is in the
   sandbox (``tools/launch/sandbox.py``: bubblewrap, nobody inside, loopback only, the system read-only,
   a throwaway HOME, TMPDIR and folder on a size-limited tmpfs); where the machine cannot make
   one, nothing runs, unless ``--allow-unsandboxed`` says so. A
   GPU script is ported to the CPU (accelerator, ``.cuda()``, NCCL, 16-bit precision), shown as
   a diff.
3. **Reproduce and locate**: ``--trials`` runs in the reporter's versions and in the newest
   release on the newest torch, with the rate; when it reproduces on the newest, a release
   bisect (``nox -s bisect``), then the commits with ``--repo``/``LIGHTNING_REPO``; when it
   reproduces on the reporter's versions only, the bisect for the fix (``--find-fix``) on the
   reporter's torch; a minimization within ``--budget`` minutes. A reproduced report that shows a
   bug the workspace knows (``known_as`` in ``repro/matrix.toml``) is run again with the series'
   fix (``nox -s patches -- --script``): bad before, good after. A report with a traceback and no
   script gets its frames, the workspace's repro of a bug it matches run in the reporter's
   versions (stated, else fingerprinted), and the questions for the reporter.
4. **Output**: ``results/triage/<id>/comment.md`` (its first line a status a bot can parse),
   ``triage.json`` (every field), the script as run, logs per run.

Exit codes: 0 the triage is done (whatever it found), 2 bad input (one line), 128 harness
failure, 130 interrupted.

The stages, a module each, each importing only those listed before it: ``read`` (the issue, its
blocks, tracebacks and versions), ``signatures`` (what counts as bad), ``differential`` (a release
the report says worked, against the broken one), ``port`` (the static check, the CPU port),
``runs`` (the cells), ``complete`` (a snippet made a program, against the newest release),
``locate`` (bisects, known bugs, the minimization), ``comment``. This module runs them in the
order a triage needs them (``triage``).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from tools import fingerprint
from tools.core import contract, results
from tools.core.contract import BadInput, HarnessFailure
from tools.environments import envs, index
from tools.launch import sandbox
from tools.launch.launcher import How, Launcher
from tools.triage import comment, complete, locate, port, read, runs, signatures
from tools.triage.progress import elapsed, progress

AUTO_TRIALS = 5  # --trials auto: runs per cell, the rate the bisect's own auto measures from
DEFAULT_TIMEOUT = 300.0
HANG_TIMEOUT = 120.0  # seconds: a run of a report that says it hangs is bad when it outlives this


def parser() -> contract.Parser:
    """The program's options (its ``--help``)."""
    p = contract.Parser(prog="nox -s triage --", description=__doc__.split("\n\n")[0])
    p.add_argument("issue", help="a GitHub issue URL, or a saved issue (its API JSON, or Markdown)")
    judge = p.add_argument_group("what counts as bad (default: read from the report)")
    judge.add_argument("--signature", help="regex for 'bad' (default: derived from the reported exception)")
    contract.add_check_replicas(judge)
    where = p.add_argument_group("where it runs")
    contract.add_repo(where, "the master cell and the commit bisect")
    where.add_argument("--trust", action="store_true", help="run a script the static check refuses")
    where.add_argument("--allow-network", action="store_true",
                       help="the sandbox with the machine's network (a script that downloads its data)")
    where.add_argument("--allow-unsandboxed", action="store_true",
                       help="run the pasted code without any sandbox, as you (where the machine cannot "
                            "make one; read the script first)")
    budget = p.add_argument_group("how long, and how sure")
    budget.add_argument("--trials", default="3",
                        help=f"runs per cell, or auto: {AUTO_TRIALS} per cell, and the "
                             "bisect's --trials auto (from the rate at its bad end)")
    budget.add_argument("--timeout", type=contract.seconds, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"wall-clock limit of a run (default: {DEFAULT_TIMEOUT:g} s; {HANG_TIMEOUT:g} s "
                             "for a report that says it hangs, whose runs are bad when they outlive it)")
    budget.add_argument("--budget", type=float, default=5.0, metavar="MINUTES",
                        help="minutes of minimization (0 skips it)")
    contract.add_old_name(budget, "--minimize-budget", "--budget", type=float)
    budget.add_argument("--no-bisect", action="store_true", help="run the cells only")
    budget.add_argument("--jobs", default="auto", metavar="K",
                        help="the bisect's candidates tested at once per round (nox -s bisect --jobs)")
    output = p.add_argument_group("results")
    output.add_argument("--out", help="results folder (default: results/triage/<report name>-<8 hex>/, "
                                      "the same for the same report: a second triage resumes)")
    output.add_argument("--state", help="the bisect's verdict cache (default nox -s bisect's, shared: a "
                                        "re-run, or a bisect of the same script, runs no step twice)")
    return p


def parse_args(argv) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    args.auto = args.trials == "auto"
    args.hang = False  # set when the report says it hangs
    args.bad_output = None  # set by the differential: a behaviour the broken release prints
    args.trials = AUTO_TRIALS if args.auto else (int(args.trials) if args.trials.isdigit() else 0)
    if args.trials < 1:
        raise BadInput("--trials takes a number >= 1, or auto")
    if args.jobs != "auto" and not (args.jobs.isdigit() and int(args.jobs) >= 1):
        raise BadInput("--jobs takes a number >= 1, or auto")
    if args.budget < 0:
        raise BadInput("--budget takes minutes >= 0")
    contract.check_signature(args.signature)
    return args


@dataclass
class Report:
    """What the read stage took from the issue."""

    issue: read.Issue
    text: str  # the body and the comments
    script: read.Script | None  # the runnable script its blocks make, if any
    tbs: list[str]  # its tracebacks
    said: dict  # the versions it states (``stated_versions``)


def triage(args) -> dict:
    """The stages in order: read the report; what counts as bad; a script to run (or the comment
    a report without one gets); the cells; where the bug came in or went away."""
    runs.SEEN.clear()  # what this triage's runs showed, not an earlier one's in the same process
    runs.RUNS.clear()
    issue = read.read_issue(args.issue)
    out = Path(args.out) if args.out else results.kind_dir("triage") / issue.folder
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BadInput(f"--out {out}: cannot write there ({err.strerror})") from None
    r, t = _read(args, issue, out)
    _signature(args, r, t)
    script = r.script or complete.completed_script(issue, r.text, t)
    if script is None:
        return _finish(_without_a_script(args, r, t, out), out)
    prepared = _prepare(args, r, script, t, out)
    if prepared is None or not _judged(args, r, *prepared, t, out):
        return _finish(t, out)
    path, code, package = prepared
    cells, master = _run_cells(args, r, t, out, path, code, package)
    _conclude(args, issue, t, out, path, package, cells, master)
    return _finish(t, out)


def _read(args, issue: read.Issue, out: Path) -> tuple[Report, dict]:
    text = "\n\n".join([issue.body, *issue.comments])
    script = read.pick_script(read.code_blocks(issue.body)) or next(
        (s for c in issue.comments if (s := read.pick_script(read.code_blocks(c)))), None)
    tbs = read.tracebacks(text)
    said = read.stated_versions(issue)
    # the comment names the URL or the file's name, never a path of this machine
    reproduce = issue.url or (args.issue if read.ISSUE_URL.match(args.issue) else Path(args.issue).name)
    t: dict = {"input": args.issue, "id": issue.id, "folder": issue.folder, "title": issue.title,
               "url": issue.url, "reproduce": reproduce,
               "versions_said": said, "tracebacks": tbs, "sandbox": None, "out": str(out.resolve()),
               "repo": args.repo}
    progress("read", f"{issue.title!r}: {'a script' if script else 'no script'}, {len(tbs)} traceback(s), "
             f"versions said: Lightning {said['lightning'] or '?'}, torch {said['torch'] or '?'}")
    return Report(issue, text, script, tbs, said), t


def _signature(args, r: Report, t: dict) -> None:
    """What counts as bad, from the report alone: ``args.signature`` (the traceback's exception, or
    one quoted in prose), ``args.check_replicas`` (ranks said to drift apart), ``args.hang``;
    ``t`` says where each came from, and the place the report's exception was raised."""
    signature, site, why = args.signature, None, None
    exc = next((e for e in map(read.exception_line, reversed(r.tbs)) if e), None)
    if not signature and exc:
        signature, why = signatures.derive_signature(*exc), f"from the reported `{exc[0]}`"
    elif not signature and not r.tbs and (quoted := signatures.prose_exception(r.text)):
        signature = signatures.derive_signature(*quoted, quoted=True)
        why = f"from the `{quoted[0]}` the report quotes"
        t["quoted_error"] = f"{quoted[0]}: {quoted[1]}"
    if signature and r.tbs:
        site = signatures.report_site("\n".join(r.tbs), signature)
        t["failing_line"] = signatures.failing_line("\n".join(r.tbs), signature)
    check = args.check_replicas
    drift = signatures.DRIFT.search(re.sub(r"(?<!\n)\n(?!\n)", " ", r.text))  # (a paragraph over lines)
    if not check and drift and not exc:
        check = "epoch"
        t["replicas_why"] = f"the report says {drift[0]!r} and shows no exception"
    elif check:
        t["replicas_why"] = "asked for"
    hang = None if (exc or check or signature) else signatures.hang_said(r.issue.body)
    if hang:  # a hang is its own signature: a run that outlives the (shorter) limit is bad
        args.hang = True
        if args.timeout == DEFAULT_TIMEOUT:
            args.timeout = HANG_TIMEOUT
        t["hang_why"] = f"the report says {hang[0]!r} and shows no exception"
    args.signature, args.check_replicas = signature, check
    t.update(signature=signature, signature_from=why, check_replicas=check, site=site)
    t["frames"] = [f.label for f in fingerprint.parse("\n".join(r.tbs))] if r.tbs else []


def _without_a_script(args, r: Report, t: dict, out: Path) -> dict:
    """A report with nothing to run: "needs a repro" (what is missing, what it shows, the
    questions), or with a traceback, its frames and the repro of a known bug it matches."""
    if not r.tbs:
        t["status"] = "needs a repro: " + "; ".join(t.get("missing") or ["the report holds no code"])
        if t.get("quoted_error"):
            t["status"] += f"; the error it quotes: `{t['quoted_error'][:200]}`"
        matches = locate.known(r.text)
        t["questions"] = comment.questions(r.issue, next((m.issue for m in matches if m.issue), None))
        if matches:
            t["known_said"] = [m.issue or m.name for m in matches]
        return t
    t["status"] = (f"no runnable script in the report; {len(t['frames'])} Lightning/torch frames in its "
                   f"traceback, signature `{args.signature}`")
    matches = locate.known("\n".join(r.tbs))
    t["questions"] = comment.questions(r.issue, next((m.issue for m in matches if m.issue), None))
    if matches:
        t["status"] += "; " + locate.traceback_matches(matches, r.tbs, r.said, args, out, t)
    return t


def _prepare(args, r: Report, script: read.Script, t: dict, out: Path) -> tuple[Path, str, str] | None:
    """The script made safe to run and runnable here (checked, ported, its nodes): its path, its
    code and its package; None when it cannot run (``t["status"]`` says why)."""
    package = t.get("package") or ("lightning" if re.search(r"^\s*(?:import|from)\s+lightning\b", script.code,
                                                           re.M) else "pytorch-lightning")
    t.update(script_origin=script.origin, package=package)
    if script.problem:
        t["status"] = f"cannot run the script: {script.problem}"
        t["questions"] = comment.questions(r.issue)
        return None
    refused = port.dangerous(script.code)
    if refused and not args.trust:
        t.update(status="not run: the script could reach outside its sandbox", refused=refused)
        return None
    why = None if args.allow_unsandboxed else sandbox.unavailable()
    if why:
        raise BadInput(f"{why}; nothing was run (--allow-unsandboxed runs the pasted code without it, "
                       "as you)")
    t["sandbox"] = ("none: the pasted code ran as this user, with its network and files (--allow-unsandboxed)"
                    if args.allow_unsandboxed else
                    "bubblewrap: nobody, no capabilities, seccomp, the system read-only, a throwaway HOME, "
                    "TMPDIR and folder on a size-limited tmpfs, " +
                    ("the machine's network (--allow-network)" if args.allow_network else "loopback only"))
    # the report's failing line against the code as posted (completed), before the CPU port edits it
    t["failing_line_posted"] = not signatures.posted_without(t.get("failing_line"), script.code)
    code, changes, diff = port.cpu_port(script.code)
    nodes = port.topology(code)
    if nodes[0] > 1:  # the script's own num_nodes, run as that many nodes of one job here
        changes.append(f"num_nodes={nodes[0]}: run as {nodes[0]} nodes of one job on this machine (a "
                       f"torchrun each, c10d rendezvous), {nodes[1]} rank(s) per node")
    args.nodes = nodes
    t.update(port_changes=changes, port_diff=diff, nodes=list(nodes))
    path = out / "script.py"
    results.write_atomic(path, code)
    return path, code, package


def _judged(args, r: Report, path: Path, code: str, package: str, t: dict, out: Path) -> bool:
    """Without a signature from the report: the script's own ``assert``, else the differential of
    a release the report says worked. False when nothing tells bad from good (the status says so)."""
    if args.signature or args.check_replicas or args.hang:
        return True
    if asserted := signatures.assert_message(code):  # its own check
        args.signature = signatures.derive_signature("AssertionError", asserted)
        t.update(signature=args.signature, signature_from="the script's own `assert`")
        return True
    if runs.run_differential(r.issue, path, args, out, package, r.said, t):
        return True
    t["status"] = "no signature: the report shows no exception and no drift; give --signature"
    if (t.get("differential") or {}).get("why"):
        t["status"] += f"; the differential: {t['differential']['why']}"
    t["questions"] = comment.questions(r.issue)
    return False


def _run_cells(args, r: Report, t: dict, out: Path, path: Path, code: str,
               package: str) -> tuple[list[runs.Cell], runs.Cell | None]:
    """The script in the reporter's release (stated, else fingerprinted from the traceback), the
    newest on the newest torch, and master with a checkout; cells an earlier triage of the same
    input finished are read back."""
    reporter = runs.resolve(package, r.said["lightning"])
    if reporter is None and r.tbs:  # not stated: the release whose source has the traceback's lines
        reporter = locate.fingerprinted(fingerprint.parse("\n".join(r.tbs)), package, args.repo, t)
        if reporter:
            t["versions_fingerprinted"] = reporter
    newest = runs.newest_release(package)
    cells = []
    if reporter:
        torch = r.said["torch"] if r.said["torch"] and r.said["torch"].count(".") == 2 else envs.era_torch(
            index.release(package, reporter).uploaded)
        if (reporter, torch) != (newest, runs.NEWEST_TORCH):  # the newest release on another torch too
            cells.append(runs.Cell("reporter's", package, reporter, torch))
    cells.append(runs.Cell("newest", package, newest, runs.NEWEST_TORCH))
    master = runs.master_cell(args, package, newest)
    if master is not None:
        cells.append(master)
    earlier = runs.earlier_cells(out, code, args)
    with Launcher(How(nodes=args.nodes[0], ranks_per_node=args.nodes[1])) as launcher:
        for i, cell in enumerate(cells):
            if not runs.resume(cell, earlier, out):
                after = (len(cells) - i - 1) * args.trials  # runs of the cells still to come
                runs.run_cell(cell, path, args, out, launcher, t["site"], after=after)
            t["cells"] = [{**asdict(c), "python": str(c.python), "rate": c.rate} for c in cells]
            t["cells_key"] = runs.cells_key(code, args)
            _save(t, out)
    return cells, master


def _conclude(args, issue: read.Issue, t: dict, out: Path, path: Path, package: str, cells: list[runs.Cell],
              master: runs.Cell | None) -> None:
    """The status from the cells, and where the bug came in (reproduced on the newest) or went
    away (on the reporter's release only): the bisect, then the minimization."""
    new = next(c for c in cells if c.label == "newest")
    old = cells[0] if cells[0].label == "reporter's" else None
    where = f"{package} {new.lightning} + torch {new.torch} (CPU)"
    at_master = f"; {master.rate} at {master.lightning}" if master is not None else ""
    unstable = [c for c in cells if 0 < c.bad < c.tested]
    if unstable:  # a rate below 1: a bisect of one run a step can name a wrong culprit
        args.auto = True
    if new.bad:
        t["status"] = f"reproduced {new.rate} on {where}{at_master}"
        if args.hang and any(r.startswith("it hangs") for r in new.reasons):
            t["status"] += f" (it hangs: each bad run outlived its {args.timeout:g} s limit)"
        if old is not None:
            t["status"] += f"; {old.rate} on the reporter's {old.lightning} + torch {old.torch}"
        t["status"] += comment.unstable_note(unstable) + locate.known_bug(path, package, new, args, out, t)
        if not args.no_bisect:
            t["status"] += "; " + _came_in(args, t, out, path, package, new, old)
        t["minimized"] = locate.minimize(path, args, out, new.python) if new.python else None
    elif old is not None and old.bad:
        t["status"] = (f"reproduced {old.rate} on the reporter's {old.lightning} + torch {old.torch}, "
                       f"not on {where} ({new.rate}){at_master}{comment.unstable_note(unstable)}")
        if args.no_bisect:
            t["status"] += ": fixed since; the fix was not bisected (--no-bisect)"
        elif old.lightning == new.lightning:  # the same release, a newer torch: torch fixed it
            t["bisect"] = locate.bisect(path, args, out, "2.0.0", package, fix=(old.torch, new.torch),
                                 torch_axis=(new.lightning, old.torch, new.torch))
            t["status"] += "; " + comment.bisect_status(t["bisect"])
        else:  # where it went away, on the reporter's torch
            t["bisect"] = locate.bisect(path, args, out, old.lightning, package, old.torch,
                                 fix=(old.lightning, new.lightning))
            t["status"] += "; " + comment.bisect_status(t["bisect"])
        t["minimized"] = locate.minimize(path, args, out, old.python) if old.python else None
    elif master is not None and master.bad:  # not in a release yet
        reporter = f", {old.rate} on the reporter's {old.lightning}" if old is not None else ""
        t["status"] = (f"reproduced {master.rate} at {master.lightning} only, not in a release: {new.rate} "
                       f"on {where}{comment.unstable_note(unstable)}{reporter}")
    elif not any(c.tested for c in cells):
        why = next((r for c in cells for r in c.reasons), "no run ended")
        line = t.get("failing_line")
        if (t.get("site") or ("", ""))[1] == "(script)" and line and not t.get("failing_line_posted", True):
            # the traceback came from code the report does not show: the run cannot reach its line
            t["status"] = (f"needs a repro: the line that raised in the report's traceback (`{line[:100]}`) "
                           f"is not in the posted code, which stops before it ({why[:120]})")
        else:
            t["status"] = f"could not test: every run ended without a verdict ({why[:160]})"
        t["questions"] = comment.questions(issue)
    else:
        t["status"] = f"did not reproduce: {', '.join(f'{c.rate} on {c.lightning}' for c in cells)}"
        t["questions"] = comment.questions(issue)


def _came_in(args, t: dict, out: Path, path: Path, package: str, new: runs.Cell,
             old: runs.Cell | None) -> str:
    """The bisect of a bug the newest release shows: torch's releases when the reporter's run of
    the same Lightning on an older torch was good, else Lightning's from the release that worked
    (the differential's), or the oldest of 2.0.0 and the reporter's."""
    if old is not None and old.lightning == new.lightning and old.tested and not old.bad:  # torch brought it
        t["bisect"] = locate.bisect(path, args, out, "2.0.0", package,
                             torch_axis=(new.lightning, old.torch, new.torch))
        return comment.bisect_status(t["bisect"])
    oldest = t.get("worked") or min(["2.0.0", *([old.lightning] if old is not None else [])],
                                    key=runs.version_key)
    torch = (t.get("differential") or {}).get("torch") or runs.NEWEST_TORCH
    t["bisect"] = locate.bisect(path, args, out, oldest, package, torch)
    said = comment.bisect_status(t["bisect"])
    if ((t["bisect"] or {}).get("releases") or {}).get("outcome", {}).get("status") == "no-good":
        said += signatures.deliberate(runs.SEEN.get(new.label, ""))
    return said


def _save(t: dict, out: Path) -> None:
    results.write_json(out / "triage.json", t)


def _finish(t: dict, out: Path) -> dict:
    if t.get("completion") and not t["status"].startswith(comment.COMPLETED):  # a verdict on an assumption
        t["status"] = comment.COMPLETED + t["status"]
    t["seconds"] = round(elapsed(), 1)
    _save(t, out)
    results.write_atomic(out / "comment.md", comment.comment(t))
    progress("done", f"{t['status']}; {out / 'comment.md'}")
    return t


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        triage(args)
    except (contract.Failure, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001  (a crash of the triage itself: never a verdict)
        raise HarnessFailure(f"{type(err).__name__}: {err}") from err
    return 0
