"""The bisect's ``report.md``: the answer, each tier's facts, the environments, the steps."""

from __future__ import annotations

import platform
import shlex

from tools.core import contract
from tools.stages.bisect import Bisector, Outcome
from tools.stages.bisect_options import Config
from tools.stages.bisect_tiers import ENV_NOTES, ENV_OF

# -- report --------------------------------------------------------------------------------

def github(source: str | None) -> str | None:
    from tools.stages import gitrange

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


def trials_text(b: Bisector) -> str:
    if b.rate is None:
        return str(b.trials)
    return (f"N = {b.trials} (auto: the bug showed in p = {b.rate:.2f} of 5 runs at the bad end; "
            f"a bad step is missed with probability {(1 - b.rate) ** b.trials:.3f})")
