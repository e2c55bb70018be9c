"""``nox -s pr -- <patch>``: a PR bundle for a validated patch.

Writes ``results/pr/<patch>/``: ``0001-*.patch`` (the change committed on current master, as
``git format-patch`` makes it, when ``LIGHTNING_REPO`` names a checkout), ``branch.txt``
(``bugfix/<issue>_<name>``) and ``body.md`` (Lightning's PR template: ``Fixes #N``, what was
wrong, what changed, the before/after evidence, test evidence, the CHANGELOG entry). Refuses with
exit 2 when the patch has not validated (``nox -s patches``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from tools import patches, results

ROOT = Path(__file__).resolve().parent.parent


def evidence(patch: patches.Patch) -> list[dict]:
    """The newest validation row of each cell the patch targets (none when one is missing)."""
    rows: dict[str, dict] = {}
    for summary in sorted((results.RESULTS / "patches").glob("*/summary.json"), reverse=True):
        for row in json.loads(summary.read_text()):
            if row["patch"] == patch.name and row["cell"] in patch.cells:
                rows.setdefault(row["cell"], row)
    return [rows[c] for c in patch.cells] if set(rows) == set(patch.cells) else []


def body(patch: patches.Patch, rows: list[dict], bisect: str | None) -> str:
    issue = re.search(r"/issues/(\d+)", patch.headers["Bug"]).group(1)
    title, _, text = patch.headers["Description"].partition("\n")
    cause, *change = [" ".join(p.split()) for p in text.split("\n\n")]
    changelog = re.findall(r"(?m)^\+(- .*)$", patch.sections().get("src/lightning/pytorch/CHANGELOG.md", ""))
    table = ["| cell | on top of | applies | before | after | earlier fixes still hold |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        on_top = ", ".join(r.get("on_top_of") or []) or "-"
        still = ", ".join(f"{n}: {v}" for n, v in (r.get("series_still_fixed") or {}).items()) or "-"
        table.append(f"| {r['cell']} | {on_top} | {r['applies']} | {r['before']} | "
                     f"{r['after']}: {r['after_detail']} | {still} |")
    tests = sorted({r["upstream_tests"] for r in rows})
    return "\n".join([
        "## What does this PR do?", "", f"Fixes #{issue}", "", f"**{title}**", "",
        "### What was wrong", "", cause, "",
        "### What changed", "", *[p + "\n" for p in change], *[f"- `{f}`" for f in patch.files], "",
        "### Evidence", "",
        "The reproduction (`" + " ".join(patch.repro) + "`) on released packages, without and with "
        "this change (applied to a throwaway copy of the install, on top of the earlier patches of "
        "the series that target the same release):",
        "", *table, "",
        ("Lightning's own tests on a patched checkout of master: " if patch.target == "lightning" else
         "The test this change adds, on released torch without and with the change: ") + "; ".join(tests), "",
        *(["### Where it came in", "", bisect, ""] if bisect else []),
        *(["### CHANGELOG", "", *changelog, ""] if changelog else []),
        "<details><summary>Before submitting</summary>", "",
        "- [x] Was this discussed/agreed via a GitHub issue? (#" + issue + ")",
        "- [x] Did you write any new necessary tests?",
        "- [x] Did you update the CHANGELOG?", "", "</details>", ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nox -s pr --")
    p.add_argument("patch", help="a patch of patches/series")
    p.add_argument("--bisect", help="a bisect report.md to quote (e.g. the 'never worked' answer)")
    a = p.parse_args(argv)
    try:
        (patch,) = patches.named(a.patch)
        rows = evidence(patch)
        if not rows or not all(r["ok"] for r in rows):
            raise patches.PatchError(f"{patch.name} has not validated: run `nox -s patches` first")
    except patches.PatchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = results.RESULTS / "pr" / patch.path.stem
    issue = re.search(r"/issues/(\d+)", patch.headers["Bug"]).group(1)
    name = re.sub(r"^(lightning|torch)-", "", patch.path.stem).replace("-", "_")
    results.write_atomic(out / "branch.txt", f"bugfix/{issue}_{name}\n")
    bisect = Path(a.bisect).read_text().split("Reproduce the bisect")[0].strip() if a.bisect else None
    results.write_atomic(out / "body.md", body(patch, rows, bisect))
    if patch.target == "lightning" and os.environ.get("LIGHTNING_REPO"):
        results.write_atomic(out / f"0001-{patch.path.stem}.patch", format_patch(patch))
    else:
        results.write_atomic(out / patch.name, patch.path.read_text())
    print(f"PR bundle: {out}")
    return 0


def format_patch(patch: patches.Patch) -> str:
    """The change committed on current master in a scratch worktree, as `git format-patch`."""
    from tools import gitrange

    repo = gitrange.open_repo(os.environ["LIGHTNING_REPO"], ROOT / ".cache" / "repos")
    wt = gitrange.Worktree(repo, ROOT / ".cache" / "worktrees" / "pr",
                           sparse=("src", "requirements", "tests"))
    wt.checkout(gitrange.resolve(repo, "master"))
    patches.apply(patch, wt.path, 1)
    wt.git.add("-A")
    title, _, why = patch.headers["Description"].partition("\n")
    issue = re.search(r"/issues/(\d+)", patch.headers["Bug"]).group(1)
    # --missing-ok: a snapshot may lack a large file the change does not touch
    tree = wt.git.write_tree("--missing-ok")
    who = {f"GIT_{role}_{what}": value for role in ("AUTHOR", "COMMITTER")
           for what, value in (("NAME", "workspace"), ("EMAIL", "workspace@localhost"))}
    with wt.git.custom_environment(**who):
        commit = wt.git.commit_tree(tree, "-p", "HEAD", "-m", f"{title}\n\n{why}\n\nFixes #{issue}")
    text = wt.git.format_patch("-1", "--stdout", commit)
    wt.checkout(gitrange.resolve(repo, "master"))
    return text + "\n"


if __name__ == "__main__":
    sys.exit(main())
