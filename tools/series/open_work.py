"""Open upstream work a patch must know of: the gate "open upstream work" of ``nox -s patches``.

A Lightning checkout may hold its pull requests' heads (``refs/pull/N/head``, as a GitHub mirror
does); they are fetched into the workspace's clone of it. The ones that matter to a patch are
those not merged into master (Lightning squash-merges: a merged PR is a master commit whose
subject ends with ``(#N)``; a merge commit's PR is an ancestor of master), whose head is at most
``DAYS`` days older than master, and that change one of the patch's files or name its issue
(``#N`` or the issue's URL) in a commit message (a CHANGELOG, which nearly every PR changes,
does not count as a shared file). Whether such a PR is still open, or was closed
without a merge, git cannot tell: they are "not merged". Each is merged into master in a
throwaway tree (``git merge-tree``) and the patch applied on top (``git apply --cached`` on a
throwaway index): ``applies``, ``conflicts in <file>``, or ``the PR no longer merges into
master``, and then whether the patch applies on the PR's own tree instead (where the files and
hunks the two share still meet).

The gate fails when a PR names the patch's issue and the patch's description does not name that
PR: how the two differ is for the description, and the PR body, to say. Conflicts fail nothing;
they are listed, and the PR body's "Related" section names every PR found.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass

import git

DAYS = 180
MERGED = re.compile(r"\(#(\d+)\)$")
_FETCHED: set[str] = set()  # the clones whose refs/pull were fetched in this process


@dataclass
class PullRequest:
    number: int
    title: str  # the subject of its first commit
    touches: list[str]  # the patch's files the PR changes
    names_issue: bool
    applies: str


def _git(repo: git.Repo, *args: str, stdin: str | None = None, env: dict | None = None):
    return subprocess.run(["git", "--git-dir", repo.git_dir, *args], input=stdin, capture_output=True,
                          text=True, env={**os.environ, **(env or {})})


def fetch_pulls(repo: git.Repo) -> None:
    """The pull requests' heads of the clone's origin, once per process (none where it has none)."""
    if repo.git_dir not in _FETCHED:
        _git(repo, "fetch", "--quiet", "origin", "+refs/pull/*/head:refs/pull/*/head")
        _FETCHED.add(repo.git_dir)


def candidates(repo: git.Repo, master: str, days: int = DAYS) -> list[tuple[int, str]]:
    """(number, head) of each pull request not merged into ``master`` whose head is at most
    ``days`` days older than it."""
    newest = int(repo.git.log("-1", "--format=%ct", master))
    merged = {int(m.group(1)) for s in repo.git.log("--format=%s", master).splitlines()
              if (m := MERGED.search(s.strip()))}
    out = []
    refs = repo.git.for_each_ref("--format=%(refname) %(objectname) %(committerdate:unix)",
                                 "refs/pull/*/head")
    for line in refs.splitlines():
        ref, head, when = line.split()
        number = int(ref.split("/")[2])
        if number in merged or int(when) < newest - days * 86400:
            continue
        if _git(repo, "merge-base", "--is-ancestor", head, master).returncode == 0:
            continue  # merged with a merge commit
        out.append((number, head))
    return sorted(out)


def applies_on(repo: git.Repo, master: str, head: str, diff: str) -> str:
    """Whether ``diff`` applies on ``master`` with the pull request ``head`` merged into it; for a
    PR that no longer merges, whether it applies on the PR's own tree (the files and hunks the two
    share still meet there)."""
    merged = _git(repo, "merge-tree", "--write-tree", master, head)
    if merged.returncode == 1:
        return f"the PR no longer merges into master; on its own tree the patch {_check(repo, head, diff)}"
    if merged.returncode:
        return f"not checked: git merge-tree failed ({(merged.stderr.strip().splitlines() or ['?'])[-1]})"
    return _check(repo, merged.stdout.split()[0], diff)


def _check(repo: git.Repo, tree: str, diff: str) -> str:
    """``applies`` or ``conflicts in <files>``: ``diff`` on ``tree``, in a throwaway index."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        _git(repo, "read-tree", tree, env=env)
        proc = _git(repo, "apply", "--cached", "--check", "-p1", "-", stdin=diff, env=env)
    if proc.returncode == 0:
        return "applies"
    failed = re.findall(r"patch failed: ([^:\n]+)", proc.stderr)
    return f"conflicts in {', '.join(sorted(set(failed)))}" if failed else "conflicts"


def is_changelog(path: str) -> bool:
    return path.rsplit("/", 1)[-1].upper().startswith("CHANGELOG")


def issue_number(bug: str) -> str | None:
    match = re.search(r"/issues/(\d+)", bug or "")
    return match.group(1) if match else None


def related(repo: git.Repo, master: str, files: list[str], issue: str | None, diff: str,
            days: int = DAYS) -> list[PullRequest]:
    """The unmerged pull requests that change one of ``files`` or name ``issue``."""
    fetch_pulls(repo)
    files = [f for f in files if not is_changelog(f)]  # every PR adds a CHANGELOG line
    found = []
    names = re.compile(rf"(#|/issues/){issue}\b") if issue else None
    for number, head in candidates(repo, master, days):
        base = repo.git.merge_base(master, head)
        changed = set(repo.git.diff("--name-only", base, head).splitlines())
        touches = sorted(changed & set(files))
        named = bool(names and names.search(repo.git.log("--format=%B", f"{base}..{head}")))
        if touches or named:
            title = repo.git.log("--reverse", "--format=%s", f"{base}..{head}").partition("\n")[0]
            found.append(PullRequest(number, title, touches, named, applies_on(repo, master, head, diff)))
    return found


def summary(prs: list[PullRequest | dict]) -> str:
    """One sentence on each kind of answer: the PRs the patch applies on top of, those it
    conflicts with, those that no longer merge; the ones naming the issue first."""
    prs = [p if isinstance(p, PullRequest) else PullRequest(**p) for p in prs]
    named = [f"#{p.number}" for p in prs if p.names_issue]
    kinds = {"applies": [], "conflicts": [], "stale": []}
    for p in prs:
        if p.applies == "applies":
            kinds["applies"].append(f"#{p.number}")
        elif p.applies.startswith("conflicts"):
            kinds["conflicts"].append(f"#{p.number} ({p.applies})")
        elif p.applies.startswith("not checked"):
            kinds["stale"].append(f"#{p.number} ({p.applies})")
        else:  # no longer merges: where the patch stands on the PR's own tree, if that was checked
            own = p.applies.partition("; on its own tree the patch ")[2]
            kinds["stale"].append(f"#{p.number}" + (f" (on its own tree the patch {own})" if own else ""))
    parts = [*([f"{', '.join(named)} name its issue"] if named else []),
             *([f"it applies on top of {', '.join(kinds['applies'])}"] if kinds["applies"] else []),
             *([f"it conflicts with {'; '.join(kinds['conflicts'])}"] if kinds["conflicts"] else []),
             *([f"no longer merging into master: {'; '.join(kinds['stale'])}"] if kinds["stale"] else [])]
    return "; ".join(parts)


def gate(description: str, issue: str | None, prs: list[PullRequest], days: int = DAYS) -> dict:
    """The gate's ``{"ok", "text", "details": {"prs"}}`` for a patch with this description."""
    if not prs:
        return {"ok": True, "text": f"no unmerged PR of the last {days} days changes its files or names its "
                                    "issue", "details": {"prs": []}}
    unanswered = [p.number for p in prs
                  if p.names_issue and not re.search(rf"#{p.number}\b", description)]
    text = (f"{len(prs)} unmerged PRs of the last {days} days change its files or name its issue: "
            f"{summary(prs)}")
    if unanswered:
        text = (f"{', '.join(f'#{n}' for n in unanswered)} name its issue and the description does not say "
                f"how it differs; {text}")
    return {"ok": not unanswered, "text": text, "details": {"prs": [asdict(p) for p in prs]}}
