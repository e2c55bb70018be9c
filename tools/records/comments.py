"""Texts for the people who reported the bugs, written by ``nox -s pr`` into ``results/pr/comments/``.

- ``issue-<N>.md``: a comment ready to post on every upstream issue a patch of the series names in
  its ``Bug`` field: how it was reproduced, the recorded runs (the tables of FINDINGS.md: the
  matrix rows of its repros, the stress scenarios, the bisect answer), the cause and the proposed
  fix of each patch (the first and second paragraph of its description; a paragraph starting
  "Alternatives considered" is quoted as such), and the questions for the reporter
  (``patches/questions.toml``, by issue number).
- ``new-issue-<name>.md`` for every bug without an upstream issue: ``patches/issues/<name>.md``, a
  draft written by hand, as it is (without its front matter; the recorded tables appended when the
  front matter names a ``repro``), or, for a patch whose ``Bug`` names neither an issue nor such a
  draft (``Bug: none``), a draft under the headings of Lightning's bug report form
  (``.github/ISSUE_TEMPLATE/1_bug_report.yaml``).
- ``comment-<name>.md`` for every ``patches/comments/<name>.md``: a comment for an upstream pull
  request (a review), as it is.
"""

from __future__ import annotations

import ast
import re
import shlex
import tomllib
from pathlib import Path

from tools.core import contract
from tools.environments import matrix
from tools.records import findings
from tools.series import patches

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = "https://github.com/Lightning-AI/pytorch-lightning/issues/"
# the version choices of the bug report form
VERSION_OPTIONS = ("v1.x", "v2.1", "v2.2", "v2.3", "v2.4", "v2.5", "v2.6", "master")


class BadInput(contract.BadInput):
    """A draft, the questions or a patch's Bug field that cannot be used (one line, exit 2)."""


def issue_number(patch: patches.Patch) -> str | None:
    found = re.search(r"/issues/(\d+)", patch.headers["Bug"])
    return found.group(1) if found else None


def parts(patch: patches.Patch) -> dict:
    """The title, the cause (first paragraph), the change (the paragraphs after it) and the
    alternatives considered (a paragraph starting so) of a patch's description."""
    title, _, text = patch.headers["Description"].partition("\n")
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
    others = [p for p in paragraphs if p.startswith("Alternatives considered")]
    rest = [p for p in paragraphs if p not in others]
    return {"title": title, "cause": rest[0] if rest else "", "change": rest[1:], "alternatives": others}


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as err:
        raise BadInput(f"{what}: cannot read it ({err.strerror})") from None
    except UnicodeDecodeError:
        raise BadInput(f"{what}: not UTF-8") from None


def questions(folder: Path) -> dict[str, list[str]]:
    """``questions.toml``: for each issue number (or draft name), the questions to ask."""
    path = folder / "questions.toml"
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(_read(path, f"{folder.name}/questions.toml"))
    except tomllib.TOMLDecodeError as err:
        raise BadInput(f"{folder.name}/questions.toml: not TOML ({err})") from None
    for key, value in data.items():
        if not isinstance(value, list) or not all(isinstance(q, str) for q in value):
            raise BadInput(f"{folder.name}/questions.toml: {key} is not a list of questions")
    return data


def front_matter(text: str) -> tuple[dict[str, str], str]:
    """``key: value`` lines between two ``---`` lines at the top, and the text after them."""
    if not text.startswith("---\n") or "\n---\n" not in text[3:]:
        return {}, text
    head, _, body = text[4:].partition("\n---\n")
    fields = dict(line.split(":", 1) for line in head.splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in fields.items()}, body.lstrip("\n")


def scenario(script: str) -> str:
    """What a repro script does: the second paragraph of its docstring."""
    try:
        doc = ast.get_docstring(ast.parse((ROOT / script).read_text(encoding="utf-8"))) or ""
    except (OSError, SyntaxError, UnicodeDecodeError):
        return ""
    paragraphs = doc.split("\n\n")
    text = " ".join(paragraphs[1].split()) if len(paragraphs) > 1 else ""
    return re.sub(r"\s*Verdict:$", "", text).replace("``", "`")


def columns_for(scripts: list[str]) -> list[str]:
    """The matrix repros (``repro/matrix.toml``) that run one of ``scripts``."""
    names = {Path(s).name for s in scripts}
    return [r.name for r in matrix.load().repros if Path(r.script).name in names]


def evidence(scripts: list[str]) -> str:
    return findings.quote(scripts, columns_for(scripts)) or (
        "No run recorded yet (`nox -s repro`, then `nox -s findings -- --record repro`).")


def reproduction(chosen: list[patches.Patch]) -> list[str]:
    """One line per repro script: the commands the patches name, and what the script does."""
    commands: dict[str, list[str]] = {}
    for p in chosen:
        mine = commands.setdefault(p.repro[0], [])
        mine += [] if f"`python {shlex.join(p.repro)}`" in mine else [f"`python {shlex.join(p.repro)}`"]
    return [f"- {', '.join(mine)}: {scenario(script)}".rstrip(": ") for script, mine in commands.items()]


def fixes(chosen: list[patches.Patch]) -> list[str]:
    lines = []
    for p in chosen:
        part = parts(p)
        lines += [f"#### {part['title']}", "", f"`{p.name}` ({p.target})", "",
                  f"**Cause.** {part['cause']}", "", *[f"**Fix.** {c}\n" for c in part["change"][:1]],
                  *[f"{c}\n" for c in part["change"][1:]], *[f"{a}\n" for a in part["alternatives"]]]
    return lines


def comment(number: str, chosen: list[patches.Patch], asked: list[str]) -> str:
    scripts = [p.repro[0] for p in chosen]
    lines = [f"<!-- a comment for {UPSTREAM}{number}, written by `nox -s pr` -->", "",
             "Reproduced on released packages; the cause and a proposed fix are below.", "",
             "### How it was reproduced", "", *reproduction(chosen), "",
             "### Recorded runs", "", evidence(scripts), "",
             "### Cause and proposed fix", "", *fixes(chosen)]
    if asked:
        lines += ["### Questions", "", *[f"{i}. {q}" for i, q in enumerate(asked, 1)], ""]
    return "\n".join(lines).rstrip() + "\n"


def version_option(lightning: str) -> str | None:
    major, minor = (lightning.split(".") + ["0"])[:2]
    option = "v1.x" if major == "1" else f"v{major}.{minor}"
    return option if option in VERSION_OPTIONS else None


def draft(patch: patches.Patch, asked: list[str]) -> str:
    """A new issue under the headings of Lightning's bug report form."""
    part, script = parts(patch), patch.repro[0]
    found = findings.bad_versions(columns_for([script]))
    options = sorted({version_option(v["lightning"]) for v in found} - {None}, key=VERSION_OPTIONS.index)

    def listed(key: str) -> str:
        return ", ".join(sorted({v[key] for v in found})) or "?"

    lines = [f"<!-- a new issue (Lightning's bug report form), written by `nox -s pr`; title: "
             f"{part['title']} -->", "",
             "### Bug description", "", part["cause"], "",
             "### What version are you seeing the problem on?", "", ", ".join(options) or "_No response_", "",
             "### Reproduced in studio", "", "_No response_", "",
             "### How to reproduce the bug", "", scenario(script), "", "```",
             f"python {shlex.join(patch.repro)}", "```", "",
             "### Error messages and logs", "", evidence([script]), "",
             "### Environment", "", "<details>", "  <summary>Current environment</summary>", "", "```",
             f"#- PyTorch Lightning Version: {listed('lightning')}", f"#- PyTorch Version: {listed('torch')}",
             f"#- Python version: {listed('python')}", "```", "", "</details>", "",
             "### More info", "", *fixes([patch])]
    if asked:
        lines += ["Open questions:", "", *[f"{i}. {q}" for i, q in enumerate(asked, 1)], ""]
    return "\n".join(lines).rstrip() + "\n"


def handwritten(path: Path) -> str:
    """A draft of ``patches/issues/`` as it is, with the recorded tables of the repro its front
    matter names (a matrix repro's name or a script path)."""
    meta, body = front_matter(_read(path, f"issues/{path.name}"))
    text = body.rstrip() + "\n"
    if meta.get("repro"):
        by_name = {r.name: r.script for r in matrix.load().repros}
        script = by_name.get(meta["repro"], meta["repro"].split()[0])
        text += "\n### Recorded runs\n\n" + evidence([script]) + "\n"
    return text


def texts(folder: Path | None = None) -> dict[str, str]:
    """Every comment and draft by file name, made in full (every input checked) before any is
    written."""
    folder = Path(folder or patches.PATCHES)
    series = patches.series(folder)
    asked = questions(folder)
    drafts = {p.stem: p for p in sorted((folder / "issues").glob("*.md"))}
    by_issue: dict[str, list[patches.Patch]] = {}
    out: dict[str, str] = {}
    for p in series:
        number, bug = issue_number(p), p.headers["Bug"].strip()
        if number:
            by_issue.setdefault(number, []).append(p)
        elif bug.endswith(".md"):
            if Path(bug).stem not in drafts:
                raise BadInput(f"{p.name}: Bug names {bug}, which is not a draft in {folder.name}/issues/")
        else:
            out[f"new-issue-{p.path.stem}.md"] = draft(p, asked.get(p.path.stem, []))
    for number, chosen in by_issue.items():
        out[f"issue-{number}.md"] = comment(number, chosen, asked.get(number, []))
    for stem, path in drafts.items():
        out[f"new-issue-{stem}.md"] = handwritten(path)
    for path in sorted((folder / "comments").glob("*.md")):  # reviews of upstream PRs, as written
        out[f"comment-{path.stem}.md"] = handwritten(path)
    return out
