"""``nox -s patches``: does each patch apply, and does it turn its bug from bad into good?

The series is quilt's: patch k is validated on top of patches 1..k-1. For every patch and every
matrix cell it names (``X-Cells``): the cell's era-correct environment with the earlier patches
that target the cell applied is the *before*; the same plus this patch is the *after* (both are
throwaway uv environments, cheap from uv's cache; the cached cell environment is never modified).
The patch's repro runs in both through the harness, and the earlier patches' repros run again in
the *after* environment: the series must stay fixed.

Then the gates, once per patch (``GATES``; each ``{"ok", "text"}``, any failed gate fails the
row). With a Lightning checkout (``LIGHTNING_REPO``) each Lightning patch is applied to worktrees
at its ``X-Base`` and at master, and Lightning's own tests run at master: the patch's new tests
must fail without it and its test files pass with it; the existing tests covering what it changes
must still pass (``upstream_tests.py``); its new multi-process tests must pass ``--repeat`` times;
types, lint, license headers and the CHANGELOG entry come from ``tools/series/gates.py``; the
unmerged PRs that change the same files or name the issue from ``tools/series/open_work.py``; the
claims of the description and their evidence from ``tools/series/claims.py``.

    nox -s patches [-- --patch NAME] [--cell ID] [--repeat K]
                   [--script PATH (--signature REGEX | --verdict-line | --check-replicas)]

``--script``: a user's own script, unmodified, in each cell the series targets (or ``--cell``)
without any patch and with every patch that targets the cell: extra rows, as required when it is
bad before and good after.

Writes ``results/patches/<time>/summary.md`` and ``summary.json``; exit 1 when a row is not as
required, 2 for bad input (a malformed patch, an unknown cell, a missing script; before anything
is made), 130 when interrupted (Ctrl-C or SIGTERM: the rows done are kept, the throwaway
environments removed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from tools.core import contract, results
from tools.environments import envs, matrix
from tools.launch import harness
from tools.launch.launcher import How, Launcher, Run
from tools.series import claims, kept, patches
from tools.series.patched import patched_env, run, scratch, site_packages
from tools.series.series_gates import REPEAT, summary, upstream

TRIES = 3  # runs of a user's script that keeps dying of a signal before its row says "skip"
INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def interrupts_unwind():
    """SIGINT and SIGTERM raise KeyboardInterrupt, so that ``finally`` blocks run: ``scratch``
    removes the throwaway environments (~800 MB each), the harness kills the repro's ranks.

    A Ctrl-C comes more than once (from the terminal, then forwarded by the noxfile's runner; plain
    ``session.run`` sends SIGTERM 0.3 s after it): once the first interrupt is on its way, later
    ones are ignored, or they would cut that cleanup short, and they stay ignored to the exit.
    A signal ignored when we started (a job started in the background) stays ignored.
    """
    def interrupted(signum, frame):
        fired.append(signum)
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    # None: a handler not installed from Python, which could not be put back
    previous = {sig: handler for sig in INTERRUPTS
                if (handler := signal.getsignal(sig)) not in (signal.SIG_IGN, None)}
    fired: list[int] = []
    for sig in previous:
        signal.signal(sig, interrupted)
    try:
        yield
    finally:
        # once interrupted the program is ending: a late second Ctrl-C (a forwarded one, on a busy
        # machine) must not turn the exit 130 into a death by SIGINT
        for sig, handler in previous.items() if not fired else ():
            signal.signal(sig, handler)


def validate(patch: patches.Patch, cell: matrix.Cell, out: Path, earlier: list[patches.Patch],
             log=print, repeat: int = REPEAT) -> dict:
    """``earlier``: the patches before this one in the series that target this cell."""
    args = envs.install_args(cell.package, cell.lightning, cell.torch)
    cell_py = envs.ensure(f"{cell.package}-{cell.lightning}-torch{cell.torch}", args, log=log)
    row = {"patch": patch.name, "cell": cell.id, "on_top_of": [e.name for e in earlier]}
    logs = out / "logs" / patch.name / cell.id
    with scratch("patched-") as tmp:
        before_py = patched_env(args, tmp / "before", earlier, cell_py) if earlier else cell_py
        root, level = patches.installed_root(site_packages(before_py), patch)
        checked = patches.check(patch, root, level, patches.installable_for(patch, root))
        row["applies"] = checked.state + (f" ({checked.detail})" if checked.detail else "")
        before = run(patch, before_py, logs / "before")
        fixed = earlier + ([patch] if checked.state in ("applies", "drift") else [])
        after_py = patched_env(args, tmp / "after", fixed, cell_py)
        after = run(patch, after_py, logs / "after")
        still = {e.name: run(e, after_py, logs / f"after-{e.path.stem}").verdict for e in earlier}
        # the setups test torch's DDP as much as Lightning: they run for a torch patch too
        setups = kept.kept_gate(before_py, after_py, tuple(e.name for e in earlier),
                                tuple(e.name for e in fixed), cell.id, logs / "kept", log=log)
    row["before"], row["after"] = before.verdict, after.verdict
    row["after_detail"] = detail(after)
    row["series_still_fixed"] = still
    row["checkouts"], gates = upstream(patch, cell, out, repeat, log)
    row["gates"] = {**gates, "setups kept": setups}  # upstream's answer is shared by the patch's cells
    row["upstream_tests"] = row["gates"]["upstream tests"]["text"]  # what `nox -s pr` quotes
    row["ok"] = ("fails" not in row["checkouts"]
                 and checked.state in ("applies", "drift")
                 and before.verdict == patch.headers["X-Expect-Before"]
                 and after.verdict == patch.headers["X-Expect-After"]
                 and all(holds(still[e.name], e.headers["X-Expect-After"]) for e in earlier)
                 and all(g["ok"] for g in row["gates"].values()))
    failed = [name for name, g in row["gates"].items() if not g["ok"]]
    log(f"  {patch.name} x {cell.id}: {row['applies']}; before {row['before']}, "
        f"after {row['after']} ({row['after_detail']}); earlier patches still: {still or '-'}; "
        f"gates failed: {', '.join(failed) or 'none'}")
    return row


def holds(verdict: str, expected: str) -> bool:
    """An earlier patch's repro in a later patch's environment: what it promised, or better (a
    patch that only explains a crash expects bad after; a later one may fix it)."""
    return verdict in (expected, "good")


def detail(result: harness.RunResult) -> str | None:
    return ((result.record or {}).get("details") or {}).get("summary") or result.reason


def plan(patch: str | None, cell: str | None) -> tuple[list[patches.Patch], dict, list[tuple]]:
    """The whole series, the matrix cells, and the (patch, cell id) pairs to validate: every
    input read and checked (a PatchError) before the first environment is made."""
    everything = patches.series()
    chosen = patches.named(patch)
    cells = {c.id: c for c in matrix.load().cells}
    for s in chosen:
        unknown = [c for c in s.cells if c not in cells]
        if unknown:
            raise patches.PatchError(f"{s.name}: unknown cell {unknown[0]}")
    work = [(s, c) for s in chosen for c in s.cells if cell in (None, c)]
    if not work:
        raise patches.PatchError(f"no patch of the series targets cell {cell!r}")
    claims.load()  # a malformed patches/claims.toml is bad input, before anything is made
    return everything, cells, work


# -- a user's own script, with and without the series ------------------------------------------

@dataclass(frozen=True)
class Script:
    path: Path
    signature: str | None
    cells: tuple[str, ...]  # the cells it runs in: every cell the series targets, or --cell
    kind: str = "python"  # how it runs (harness.how_to_run)
    check_replicas: str | None = None  # the replica check injected (--check-replicas)
    sandbox: bool | str = False  # the launcher's sandbox (a triaged issue's script: untrusted)
    nodes: tuple[int, int] = (1, 1)  # a job of N nodes with R ranks each (tools.nodes)


def check_script(script: str, signature: str | None, verdict_line: bool,
                 check_replicas: str | None = None) -> Path:
    """The rule of ``nox -s repro -- --script``: an existing file, judged by ``--signature`` (a
    valid regex) or the replica check, unless it prints the contract's verdict line."""
    path = Path(script)
    harness.how_to_run(path, "--script", script)  # the bisect's rule: a file that can be run
    if not (signature or verdict_line or check_replicas):
        raise contract.BadInput("--script needs --signature REGEX (what its output shows when the bug is "
                                "there), --check-replicas for a silent divergence, or --verdict-line "
                                "if it prints the contract's verdict line")
    contract.check_signature(signature)
    return path.resolve()


def script_row(script: Script, cell: matrix.Cell, everything: list[patches.Patch], out: Path,
               log=print) -> dict:
    """The script in the cell's environment (before) and with every patch of the series that
    targets the cell applied (after): as required when it is bad before and good after."""
    applied = [p for p in everything if cell.id in p.cells]
    args = envs.install_args(cell.package, cell.lightning, cell.torch)
    cell_py = envs.ensure(f"{cell.package}-{cell.lightning}-torch{cell.torch}", args, log=log)
    logs = out / "logs" / "script" / cell.id
    with scratch("script-") as tmp:
        before, before_runs = judged_run(script, cell_py, logs / "before")
        after, after_runs = judged_run(script, patched_env(args, tmp / "after", applied, cell_py),
                                       logs / "after")
    row = {"patch": f"(your script) {script.path.name}", "cell": cell.id,
           "on_top_of": [p.name for p in applied], "applies": "-", "checkouts": "-",
           "before": before.verdict, "before_detail": before.reason, "after": after.verdict,
           "after_detail": detail(after), "before_runs": before_runs, "after_runs": after_runs,
           "series_still_fixed": {}, "upstream_tests": "-", "gates": {},
           "ok": before.verdict == "bad" and after.verdict == "good"}
    runs = "" if before_runs == after_runs == 1 else f" (runs: {before_runs} before, {after_runs} after)"
    log(f"  {row['patch']} x {cell.id}: before {before.verdict} ({before.reason}), after {after.verdict} "
        f"({row['after_detail']}) with {len(applied)} patches{runs}")
    return row


def judged_run(script: Script, python: Path, log_stem: Path,
               tries: int = TRIES) -> tuple[harness.RunResult, int]:
    """``run_script``, made again (at most ``tries`` runs) while the script's process dies of a
    signal on its own: torch 2.13 + gloo now and then aborts as the interpreter exits, after
    training. Such a run cannot test the bug (as a bisect's skip, it is tried again); a timeout
    or an error of the script is not retried. The last run, and how many were made."""
    for n in range(1, tries + 1):
        r = run_script(script, python, log_stem if n == 1 else log_stem.with_name(f"{log_stem.name}-{n}"))
        if r.final or not (r.reason or "").startswith(contract.KILLED):
            break
    return r, n


def run_script(script: Script, python: Path, log_stem: Path) -> harness.RunResult:
    how = How(nodes=script.nodes[0], ranks_per_node=script.nodes[1])
    return Launcher(how).run(Run((str(script.path),), python, kind=script.kind, log_stem=log_stem,
                              signature=script.signature, check_replicas=script.check_replicas,
                              sandbox=script.sandbox))


def parser() -> contract.Parser:
    """The program's options (its ``--help``)."""
    p = contract.Parser(prog="nox -s patches --", description=__doc__.split("\n\n")[0])
    what = p.add_argument_group("what is validated")
    what.add_argument("--patch", help="only this patch of the series (default: every patch)")
    what.add_argument("--cell", help="only this matrix cell, by its name (e.g. pl2_6_6_torch2_13_0, as "
                                     "nox -s repro -k takes it; default: every cell a patch names)")
    contract.add_repo(what, "upstream's gates (the series applied to master)", "no upstream gates")
    yours = p.add_argument_group("a script of yours")
    yours.add_argument("--script", help="also run this script of yours without and with the series")
    contract.add_judges(yours, "--script")
    sure = p.add_argument_group("how sure")
    sure.add_argument("--repeat", type=int, default=REPEAT,
                      help="runs of each new multi-process test (the flaky gate)")
    return p


def parse_args(argv) -> argparse.Namespace:
    p = parser()
    a = p.parse_args(argv)
    if a.repo != os.environ.get("LIGHTNING_REPO"):  # --repo given: read where the repository is used
        os.environ["LIGHTNING_REPO"] = a.repo
    if a.repeat < 1:
        raise contract.BadInput("--repeat takes a number >= 1")
    if a.script:
        a.script = check_script(a.script, a.signature, a.verdict_line, a.check_replicas)
    elif a.signature or a.verdict_line or a.check_replicas:
        raise contract.BadInput("--signature, --verdict-line and --check-replicas go with --script")
    return a


def main(argv=None) -> int:
    with interrupts_unwind():
        try:
            a = parse_args(argv)
            everything, cells, work = plan(a.patch, a.cell)
            script = None
            if a.script:
                targeted = {c for p in everything for c in p.cells}
                script = Script(a.script, a.signature,
                                tuple(c for c in cells if c in targeted and a.cell in (None, c)),
                                harness.how_to_run(a.script, "--script"), a.check_replicas)
        except contract.BadInput as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted: before any work; nothing made, nothing kept", file=sys.stderr)
            return 130
        return validate_all(everything, cells, work, a.repeat, script)


def validate_all(everything: list[patches.Patch], cells: dict, work: list[tuple], repeat: int = REPEAT,
                 script: Script | None = None) -> int:
    out = results.run_dir("patches")
    rows: list[dict] = []
    jobs = [*work, *((None, c) for c in (script.cells if script else ()))]
    try:
        for i, (s, cell_id) in enumerate(jobs, 1):
            name = s.name if s else f"(your script) {script.path.name}"
            print(f"[{i}/{len(jobs)}] {name} x {cell_id}", flush=True)
            earlier = [e for e in everything[:everything.index(s)] if cell_id in e.cells] if s else []
            try:
                rows.append(validate(s, cells[cell_id], out, earlier, repeat=repeat) if s else
                            script_row(script, cells[cell_id], everything, out))
            except patches.PatchError as err:  # e.g. an earlier patch of the series fails here
                print(f"  {name} x {cell_id}: {err}", flush=True)
                rows.append({"patch": name, "cell": cell_id, "on_top_of": [e.name for e in earlier],
                             "applies": f"fails ({err})", "checkouts": "-", "before": "-", "after": "-",
                             "after_detail": "not run", "series_still_fixed": {}, "upstream_tests": "-",
                             "gates": {}, "ok": False})
            # a row at a time: an interrupt keeps them, both tables
            results.write_json(out / "summary.json", rows)
            results.write_atomic(out / "summary.md", summary(rows))
    except KeyboardInterrupt:
        kept = (f"{len(rows)} of {len(jobs)} rows kept in {out / 'summary.json'} and summary.md" if rows else
                f"0 of {len(jobs)} rows finished, nothing kept")
        print(f"interrupted: {kept}; the throwaway environments were removed", file=sys.stderr)
        return 130
    table = summary(rows)
    results.write_atomic(out / "summary.md", table)
    print(table)
    print(f"results: {out}")
    return contract.GOOD if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
