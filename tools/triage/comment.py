"""The comment: its first line a status a bot can parse, how it was run, the cells, the bisect,
the questions for the reporter; capped, redacted, and with no path of this machine."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

from tools.triage import locate, read

ROOT = Path(__file__).resolve().parents[2]  # the workspace


def questions(issue: read.Issue, like: int | None = None) -> list[str]:
    """The questions for the reporter: ``patches/questions.toml``'s for this issue, or for the
    known bug it matches (``like``), else the "needs a repro" template."""
    number = issue.id.rsplit("-", 1)[-1]
    asked = tomllib.loads((ROOT / "patches" / "questions.toml").read_text())
    return asked.get(number) or (like and asked.get(str(like))) or [
        "Can you share a self-contained script that shows it on one node with two devices (or two "
        "CPU processes), with the smallest model and random data?",
        "How many nodes and devices per node, and which launcher (Lightning's own, torchrun, SLURM)?",
        "The exact versions: `python -m lightning.pytorch.utilities.collect_env_details` or `pip list`.",
        "The full log of every rank (with `[rankN]:` prefixes), not only rank 0's.",
    ]


def _fence(code: str) -> str:
    longest = max((len(m) for m in re.findall(r"`{3,}", code)), default=2)
    return "`" * max(3, longest + 1)


# what a secret looks like, wherever it came from (a run's output reaches the comment's reasons)
SECRETS = [re.compile(p) for p in (
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)",
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})",  # GitHub
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}",  # Slack
    r"\b(?:sk|pk|rk)[-_](?:live|test|proj)?[-_]?[A-Za-z0-9_-]{20,}",  # OpenAI, Stripe, ...
    r"\bhf_[A-Za-z0-9]{20,}",  # Hugging Face
    r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # JSON web tokens
    r"(?i)\b(?:password|passwd|secret|token|api[_-]?key|access[_-]?key)\b\s*[=:]\s*['\"]?[^\s'\",;]{6,}",
    # lines of a password or shadow file: name:pw:uid:gid:... / name:hash:lastchange:...
    r"\b[a-z_][a-z0-9_.-]*:[^:\s]*:\d+:\d+:[^:\n]*:[^:\n]*:[^:\s]*",
    r"\b[a-z_][a-z0-9_.-]*:(?:\$[0-9a-z]+\$[^:\s]+|[!*]+[^:\s]*):\d+:",
)]
STATUS_CAP = 400  # characters of the comment's first line
COMPLETED = "(on the report's snippet, completed: see below) "


def _redact(text: str) -> str:
    """No secret in a comment meant to be pasted publicly: this process's secret variables, and
    anything shaped like a key, a token or a password-file line."""
    for name, value in os.environ.items():
        if value and len(value) >= 8 and re.search(r"TOKEN|SECRET|PASSWORD|KEY", name):
            text = text.replace(value, f"[{name}]")
    for pattern in SECRETS:
        text = pattern.sub("[redacted]", text)
    return text


def comment(t: dict) -> str:
    return _redact(_public(_comment(_redacted(t)), t))


def _redacted(value):
    """``value`` (the triage's record) with every text redacted, before any of it is cut short."""
    if isinstance(value, str):
        return _redact(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(v) for v in value]
    return value


def _public(text: str, t: dict) -> str:
    """No path of this machine in a comment: the results folder as the workspace names it, the
    Lightning checkout as ``$LIGHTNING_REPO``."""
    if t.get("repo"):
        text = text.replace(str(t["repo"]), "$LIGHTNING_REPO")
    if t.get("out"):
        text = text.replace(str(t["out"]), f"results/triage/{t.get('folder') or t['id']}")
    return text.replace(f"{ROOT}{os.sep}", "").replace(f"{Path.home()}{os.sep}", f"~{os.sep}")


def _how(t: dict) -> list[str]:
    """The comment's "How it was run": what counted as bad and why, the sandbox, the versions."""
    how = ["- Signature: none"]
    if t.get("signature"):
        source = f" ({t['signature_from']})" if t.get("signature_from") else ""
        how = [f"- Signature: `{t['signature']}`{source}"]
    if t.get("bad_output"):
        how = [f"- Bad when a run exits 0 and prints `{t['bad_output']}` (`--bad-output`): "
               f"{t['signature_from']}"]
    d = t.get("differential") or {}
    if d:
        ran = (f"ran once in {d['broken']} (exit {d['broken_exit']}) and in {d['worked']} (exit "
               f"{d['worked_exit']}), torch {d['torch']}" if "worked_exit" in d else "not run")
        how.append(f"- The report says {d['said']!r}: {ran}" + (f"; {d['why']}" if d.get("why") else ""))
    if t.get("check_replicas"):
        how.append("- Replica check: on (`--check-replicas`): " + t["replicas_why"])
    if t.get("hang_why"):
        how.append("- A hang: a run that outlives its limit is bad (`--hang`): " + t["hang_why"])
    how.append(f"- Sandbox: {t['sandbox'] or 'not needed: nothing was run'}")
    if t.get("versions_said", {}).get("from"):
        how.append("- Versions stated: " + "; ".join(t["versions_said"]["from"]))
    if t.get("versions_fingerprinted"):
        found = t.get("fingerprint") or {}
        every = found.get("matched") == found.get("frames") or not found
        which = ("every quoted line of the traceback's frames" if every else
                 f"the quoted lines of {found['matched']} of the traceback's {found['frames']} frames, the "
                 "most of any release")
        how.append(f"- Versions not stated: the reporter's is {t['versions_fingerprinted']}, the newest "
                   f"release whose source has {which}")
    return how


def _comment(t: dict) -> str:
    status = t["status"] if len(t["status"]) <= STATUS_CAP else t["status"][:STATUS_CAP - 1] + "…"
    lines = [f"**Triage:** {status}", ""]
    if t.get("refused"):
        lines += ["The script was not run: it could reach outside its sandbox.", "",
                  *[f"- {r}" for r in t["refused"]], "",
                  "Run it anyway with `--trust` (review it first).", ""]
    lines += ["How it was run:", "", *_how(t), ""]
    if t.get("completion"):
        fence, said = _fence(t["completion"]["diff"]), "; ".join(t["completion"]["changes"])
        lines += [f"<details><summary>Completed (assumptions: {said})</summary>", "", f"{fence}diff",
                  t["completion"]["diff"].rstrip(), fence, "", "</details>", ""]
    if t.get("missing") and not t.get("cells"):
        lines += ["What the report does not give:", "", *[f"- {m}" for m in t["missing"]], ""]
    if t.get("port_diff"):
        fence = _fence(t["port_diff"])
        lines += ["<details><summary>CPU port (" + ", ".join(t["port_changes"]) + ")</summary>", "",
                  f"{fence}diff", t["port_diff"].rstrip(), fence, "", "</details>", ""]
    if t.get("cells"):
        lines += ["| cell | Lightning | torch | reproduced | how the runs ended |", "|---|---|---|---|---|"]
        for c in t["cells"]:
            ended = "; ".join(sorted({f"{v}: {r[:100]}".replace("|", "/") for v, r in zip(
                c["verdicts"], c["reasons"], strict=True)}))
            lines.append(f"| {c['label']} | {c['package']} {c['lightning']} | {c['torch']} | {c['rate']} | "
                         f"{ended} |")
        lines.append("")
    if t.get("known"):
        lines += ["Bugs the workspace knows that this matches:", ""]
        for k in t["known"]:
            link = f"#{k['issue']}" if k.get("issue") else k["repro"]
            if "rate" in k:  # its repro, run in the reporter's versions
                ended = "; ".join(sorted(set(k["reasons"])))[:200].replace("|", "/")
                lines.append(f"- {link}: the workspace's repro `{k['repro']}` ({k['script']}) on "
                             f"{k['package']} {k['lightning']} + torch {k['torch']}: bad {k['rate']} "
                             f"({ended})")
            elif k.get("cell"):  # the reporter's script with the series' fix
                why = k.get("after_detail") or ""
                tail = ("" if k["ok"] else ": inconclusive (not bad without them)" if k["before"] != "bad"
                        else f": inconclusive (the run with them could not be judged: {why})"
                        if k["after"] == "skip" else f": not fixed by them ({why})")
                lines.append(f"- {link}: the reporter's script in `{k['cell']}` is {k['before']} without and "
                             f"{k['after']} with the series' patches ({', '.join(k['patches'])}), "
                             f"{locate.runs_made(k)}{tail}")
            elif k.get("why"):
                lines.append(f"- {link}: the series' fix could not be tried: {k['why']}")
            else:
                lines.append(f"- {link}: matches its signature; no patch of the series targets these "
                             "versions")
        lines.append("")
    if t.get("bisect") and t["bisect"].get("markdown"):
        lines += [re.sub(r"^## Bisect result( \(the fix\))?", r"**Bisect\1:**", t["bisect"]["markdown"],
                         count=1).strip(), ""]
    elif t.get("bisect"):
        lines += [f"**Bisect:** no answer: {t['bisect'].get('why') or 'no report'}", ""]
    if t.get("frames"):
        lines += ["Frames of the traceback (Lightning and torch):", "",
                  *[f"- `{f}`" for f in t["frames"][:12]], ""]
    m = t.get("minimized")
    if m and m.get("lines"):
        fence = _fence(m["code"])
        lines += [f"<details><summary>Minimized repro ({m['lines']} of {m.get('of', '?')} lines, bad in "
                  "3/3 fresh runs)</summary>", "", f"{fence}python",
                  m["code"].rstrip(), fence, "", "</details>", ""]
    if t.get("questions"):
        lines += ["Questions:", "", *[f"- {q}" for q in t["questions"]], ""]
    lines += [f"Reproduce with: `nox -s triage -- {t.get('reproduce') or t['input']}`", "",
              "If this triage is wrong, please say so here.", ""]
    return "\n".join(lines)


def unstable_note(cells: list) -> str:
    if not cells:
        return ""
    return ("; unstable (" + ", ".join(f"{c.rate} on {c.lightning}" for c in cells) + "): the bisect "
            "ran with --trials auto")


def bisect_status(b: dict | None) -> str:
    if not b:
        return "the bisect gave no report"
    if b.get("markdown") is None:
        return f"the bisect gave no answer ({b.get('why') or 'no report'})"
    fix = b.get("find_fix")
    rel = (b.get("releases") or {}).get("outcome") or {}
    com = (b.get("commits") or {}).get("outcome") or {}
    what = "torch " if b.get("axis") == "torch" else ""
    if rel.get("status") == "found":
        first, last = rel.get("first_bad"), rel.get("last_good")
        text = (f"fixed in {what}{first} (the last with the bug: {last})" if fix
                else f"regressed in {what}{first} (last good {last})")
        if com.get("status") == "found":
            sha = str(com.get("first_bad"))
            from tools.stages.gitrange import Commit

            pr = next((Commit(**c).pr for c in b["commits"].get("commits", []) if c.get("sha") == sha),
                      None)
            text += f", by commit {sha[:12]}" + (f" (#{pr})" if pr else "")
        return text
    if rel.get("status") == "no-good":
        return ("the bug showed in no release the fix bisect tested" if fix else
                f"the same in every release tested since {what}{rel.get('first_bad')}: not a regression")
    return f"bisect: {rel.get('status') or 'no answer'}"
