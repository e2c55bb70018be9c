"""``nox -s pr -- <patch>``: a PR bundle for a validated patch, written for you to post (nothing is pushed).

Writes ``results/pr/<patch>/``: ``0001-*.patch`` (the change committed on current master, as
``git format-patch`` makes it, when ``LIGHTNING_REPO`` names a checkout), ``branch.txt``
(``bugfix/<issue>_<name>``) and ``body.md`` (Lightning's PR template: ``Fixes #N``, what was
wrong, what changed, the unmerged PRs that change the same files (with a checkout: where this
change stands beside each, ``tools/series/open_work.py``), the before/after evidence, test evidence, its
claims and their evidence (``patches/claims.toml``, also printed), the CHANGELOG entry). Refuses with
exit 2 when the patch has not validated (``nox -s patches``), an input cannot be read, or git has
no identity for you (``user.name``, ``user.email``: the PR's author, whom the CLA check reads; the
series' own ``From:`` is a placeholder): every input is read and checked first, then each output
is written atomically.

Every run (also ``nox -s pr`` without a patch) writes ``results/pr/comments/``: a comment per
upstream issue of the series and a new-issue draft for every bug without one (``tools/records/comments.py``),
quoting the recorded runs of FINDINGS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from pathlib import Path

from tools.core import contract, results
from tools.records import comments, findings
from tools.series import claims, gates, patches

ROOT = Path(__file__).resolve().parent.parent
class BadInput(contract.BadInput):
    """An input of the bundle that cannot be used (one line, exit 2)."""


def evidence(patch: patches.Patch) -> list[dict]:
    """The newest validation row of each cell the patch targets (none when one is missing).
    Runs are read newest first, and only until every cell has its row."""
    rows: dict[str, dict] = {}
    for summary in sorted((results.RESULTS / "patches").glob("*/summary.json"), reverse=True):
        if set(rows) >= set(patch.cells):
            break
        if summary.parent.is_symlink():  # ``latest``: the newest run, read under its own name
            continue
        for row in read_summary(summary):
            if row["patch"] == patch.name and row["cell"] in patch.cells:
                rows.setdefault(row["cell"], row)
    return [rows[c] for c in patch.cells] if set(rows) == set(patch.cells) else []


read_summary = results.read_patch_summary  # (BadInput is the contract's)


def issue_of(patch: patches.Patch) -> str:
    """The number of the issue the patch fixes, from its ``Bug`` URL (for ``Fixes #N``)."""
    found = re.search(r"/issues/(\d+)", patch.headers["Bug"])
    if not found and patch.headers["Bug"].startswith("patches/issues/"):
        raise BadInput(f"{patch.name}: Bug names the draft {patch.headers['Bug']}: file that issue upstream, "
                       "then put its URL in Bug")
    if not found:
        raise BadInput(f"{patch.name}: Bug is not an issue URL (.../issues/N), which `Fixes #N` needs")
    return found.group(1)


def closes(patch: patches.Patch, issue: str) -> str:
    """``Fixes #N``, or ``Related to #N`` for a patch whose ``X-Relation`` says it does not close
    its issue (a clearer error for a crash that stays)."""
    return f"{'Related to' if patch.headers.get('X-Relation') == 'related' else 'Fixes'} #{issue}"


NEEDS = re.compile(r"(?m)^\+@RunIf\(([^)]*)\)\n(?:\+\s*@.*\n)*\+\s*def (test\w+)")


def never_run_here(patch: patches.Patch) -> list[str]:
    """The tests the patch adds that need CUDA GPUs: they never ran here, and the PR says so."""
    out = []
    for path, section in patch.test_changes().items():
        for args, name in NEEDS.findall(section):
            if gpus := re.search(r"min_cuda_gpus\s*=\s*(\d+)", args):
                out.append(f"`{path}::{name}`: needs {gpus.group(1)} CUDA GPUs")
    return out


def bisect_answer(path: str) -> str:
    """The answer part of a bisect report.md: what comes before its recipe to reproduce it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise BadInput(f"--bisect {path}: cannot read it ({err.strerror})") from None
    except UnicodeDecodeError:
        raise BadInput(f"--bisect {path}: not UTF-8") from None
    return text.split("Reproduce the bisect")[0].strip()


def related_section(prs: list[dict] | None, master: str = "") -> list[str]:
    """The unmerged PRs that change the same files or name the issue: reviewers know them, and
    the body says where this change stands beside each (``tools/series/open_work.py``)."""
    if not prs:
        return []
    from tools.series import open_work

    named = [p for p in prs if p["names_issue"]]
    lines = ["### Related open work", "",
             f"Unmerged PRs that change the same files{' or name the issue' if named else ''} (checked "
             f"against master `{master[:10]}`): {open_work.summary(prs)}.", ""]
    lines += [f"- #{p['number']} ({p['title']}) names the issue: {p['applies']}" for p in named]
    return [*lines, ""] if named else lines


def body(patch: patches.Patch, rows: list[dict], bisect: str | None, related: list[dict] | None = None,
         master: str = "") -> str:
    issue = issue_of(patch)
    part = comments.parts(patch)  # "Alternatives considered" is not part of what changed
    title, cause, change = part["title"], part["cause"], part["change"]
    recorded = findings.quote([patch.repro[0]], comments.columns_for([patch.repro[0]]))
    changelog = [line for path in gates.CHANGELOGS.values()
                 for line in re.findall(r"(?m)^\+(- .*)$", patch.sections().get(path, ""))]
    table = ["| cell | on top of | applies | before | after | earlier fixes still hold |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        on_top = ", ".join(r.get("on_top_of") or []) or "-"
        still = ", ".join(f"{n}: {v}" for n, v in (r.get("series_still_fixed") or {}).items()) or "-"
        table.append(f"| {r['cell']} | {on_top} | {r['applies']} | {r['before']} | "
                     f"{r['after']}: {r['after_detail']} | {still} |")
    tests = sorted({r["upstream_tests"] for r in rows})
    listed = claims.load().get(patch.name, [])
    never = never_run_here(patch)

    def folded(summary: str, lines: list[str]) -> list[str]:  # the template's short; the rest opens
        return [f"<details><summary>{summary}</summary>", "", *lines, "</details>", ""]

    # Lightning's PR template: what it does and the issue, then the evidence folded away
    return "\n".join([
        "## What does this PR do?", "", closes(patch, issue), "", f"**{title}**", "",
        "### What was wrong", "", cause, "",
        "### What changed", "", *[p + "\n" for p in change], *[f"- `{f}`" for f in patch.files], "",
        *(["### Not run here", "", *[f"- {t}" for t in never], ""] if never else []),
        *related_section(related, master),
        *(["### CHANGELOG", "", *changelog, ""] if changelog else []),
        *folded("Evidence: the reproduction without and with this change, and the tests", [
            "### Evidence", "",
            "The reproduction (`" + " ".join(patch.repro) + "`) on released packages, without and with "
            "this change (applied to a throwaway copy of the install, on top of the earlier patches of "
            "the series that target the same release):",
            "", *table, "",
            ("Lightning's own tests on a patched checkout of master: " if patch.target == "lightning" else
             "The test this change adds, on released torch without and with the change: ")
            + "; ".join(tests) + (" (the tests listed under \"Not run here\" were skipped)" if never else ""),
            ""]),
        *(folded("Claims and their evidence", ["### Claims and their evidence", "",
                                               "Each claim of the description above, and what backs it "
                                               "(checked by `nox -s patches`):", "",
                                               *claims.listing(listed), ""]) if listed else []),
        *(folded("Alternatives considered", ["### Alternatives considered", "",
                                             *[a + "\n" for a in part["alternatives"]]])
          if part["alternatives"] else []),
        *(folded("Recorded runs on unpatched releases",
                 ["### Recorded runs on unpatched releases", "", recorded, ""]) if recorded else []),
        *(folded("Where it came in", ["### Where it came in", "", bisect, ""]) if bisect else []),
        "<details><summary>Before submitting</summary>", "",
        "- [x] Was this discussed/agreed via a GitHub issue? (#" + issue + ")",
        "- [x] Did you write any new necessary tests?",
        "- [x] Did you update the CHANGELOG?", "", "</details>", ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nox -s pr --", description=__doc__.split("\n\n")[0],
                                formatter_class=contract.DefaultsShown)
    p.add_argument("patch", nargs="?", help="a patch of patches/series (none: only the comments)")
    p.add_argument("--bisect", help="a bisect report.md to quote (e.g. the 'never worked' answer)")
    p.add_argument("--number", type=int, metavar="N",
                   help="the opened PR's number: replaces a CHANGELOG entry's pending link (#PR)")
    contract.add_repo(p, "git format-patch on master", "the diff as it is in patches/")
    a = p.parse_args(argv)
    if a.repo != os.environ.get("LIGHTNING_REPO"):  # --repo given: read where the repository is used
        os.environ["LIGHTNING_REPO"] = a.repo
    if (a.bisect or a.number is not None) and not a.patch:
        print("error: --bisect and --number go with a patch", file=sys.stderr)
        return 2
    if a.number is not None and a.number < 1:
        print(f"error: --number {a.number}: a PR number is a positive integer", file=sys.stderr)
        return 2
    try:
        bundle = {}
        if a.patch:
            (patch,) = patches.named(a.patch)
            issue = issue_of(patch)
            bisect = bisect_answer(a.bisect) if a.bisect else None
            rows = evidence(patch)
            if not rows or not all(r["ok"] for r in rows):
                raise BadInput(f"{patch.name} has not validated: run `nox -s patches` first")
            if a.number is not None:
                if gates.PENDING not in patch.diff:
                    raise BadInput(f"--number: {patch.name} has no pending CHANGELOG link (#PR) to fill in")
                patch = dataclasses.replace(patch, diff=fill(patch.diff, a.number))
            bundle = files(patch, issue, rows, bisect, identity(), a.number)
        texts = comments.texts()
    except contract.BadInput as err:  # the patch, the series, the recorded runs, drafts, questions
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = results.RESULTS / "pr"
    for name, text in bundle.items():  # only now: a bad input above leaves the last bundle as it was
        results.write_atomic(out / patch.path.stem / name, text)
    for name, text in texts.items():
        results.write_atomic(out / "comments" / name, text)
    if bundle:
        print(f"PR bundle: {out / patch.path.stem}")
        if gates.PENDING in patch.diff:  # for you, not for the PR's body
            print(f"its CHANGELOG entry links #PR: once the PR is open, `nox -s pr -- {patch.name} --number "
                  "<its number>` puts the number in")
        listed = claims.load().get(patch.name, [])
        print(f"claims of {patch.name} and their evidence ({len(listed)}, checked by `nox -s patches`):")
        print("\n".join(claims.listing(listed)) or "- none listed in patches/claims.toml")
    print(f"comments: {out / 'comments'} ({', '.join(sorted(texts))})")
    return 0


def fill(text: str, number: int | None) -> str:
    """``text`` with a pending CHANGELOG link (``#PR``) pointing at PR ``number`` (if given)."""
    if number is None:
        return text
    return text.replace(gates.PENDING, gates.PENDING.replace("PR", str(number)))


def identity(cwd: Path | None = None) -> tuple[str, str]:
    """(name, email) of the user's git configuration: who opens the PR. Never made up."""
    import subprocess

    found = []
    for key in ("user.name", "user.email"):
        proc = subprocess.run(["git", "config", "--get", key], cwd=cwd or ROOT, capture_output=True,
                              text=True)
        found.append(proc.stdout.strip())
    if not all(found):
        raise BadInput("git has no identity for you: set `git config --global user.name` and "
                       "`user.email` (the PR's author, as the CLA check reads it)")
    return found[0], found[1]


def files(patch: patches.Patch, issue: str, rows: list[dict], bisect: str | None,
          who: tuple[str, str], number: int | None = None) -> dict[str, str]:
    """The bundle's files by name, made in full before any is written."""
    name = re.sub(r"^(lightning|torch)-", "", patch.path.stem).replace("-", "_")
    out = {"branch.txt": f"bugfix/{issue}_{name}\n"}
    if patch.target == "lightning" and os.environ.get("LIGHTNING_REPO"):
        from tools.series import open_work
        from tools.stages import gitrange

        try:
            repo = gitrange.open_repo(os.environ["LIGHTNING_REPO"], ROOT / ".cache" / "repos")
            master = gitrange.resolve(repo, "master")
            out[f"0001-{patch.path.stem}.patch"] = format_patch(patch, who)
        except gitrange.BadInput as err:  # LIGHTNING_REPO is no repository, or has no master
            raise BadInput(f"LIGHTNING_REPO: {err}") from None
        prs = open_work.related(repo, master, patch.files, issue, patch.diff)
        out["body.md"] = body(patch, rows, bisect, [dataclasses.asdict(p) for p in prs], master)
    else:  # the series' file as the PR's commit: the user as its author, "Fixes #N" for the series' fields
        out["body.md"] = body(patch, rows, bisect)
        text = fill(patches.read(patch.path, patch.name), number)
        text = re.sub(r"^From: .*$", lambda _: f"From: {who[0]} <{who[1]}>", text, count=1, flags=re.M)
        message, sep, rest = text.partition("\n---\n")
        message = message.rsplit("\n\n", 1)[0]  # its last paragraph holds the series' fields (DEP-3)
        out[patch.name] = f"{message}\n\n{closes(patch, issue)}{sep}{rest}"
    return out


def format_patch(patch: patches.Patch, who: tuple[str, str]) -> str:
    """The change committed on current master in a scratch worktree, as `git format-patch`."""
    from tools.stages import gitrange

    repo = gitrange.open_repo(os.environ["LIGHTNING_REPO"], ROOT / ".cache" / "repos")
    wt = gitrange.Worktree(repo, ROOT / ".cache" / "worktrees" / "pr",
                           sparse=("src", "requirements", "tests"))
    wt.checkout(gitrange.resolve(repo, "master"))
    patches.apply(patch, wt.path, 1)
    wt.git.add("-A")
    title, _, why = patch.headers["Description"].partition("\n")
    issue = issue_of(patch)
    # --missing-ok: a snapshot may lack a large file the change does not touch
    tree = wt.git.write_tree("--missing-ok")
    env = {f"GIT_{role}_{what}": value for role in ("AUTHOR", "COMMITTER")
           for what, value in (("NAME", who[0]), ("EMAIL", who[1]))}
    with wt.git.custom_environment(**env):
        commit = wt.git.commit_tree(tree, "-p", "HEAD", "-m", f"{title}\n\n{why}\n\n{closes(patch, issue)}")
    text = wt.git.format_patch("-1", "--stdout", commit)
    wt.checkout(gitrange.resolve(repo, "master"))
    return text + "\n"


if __name__ == "__main__":
    sys.exit(main())
