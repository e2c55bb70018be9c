"""Lightning's git history for commit bisects (gitpython).

The user's repository is never touched: it is cloned once (``--shared``, cheap) into the cache,
and every step checks out one commit in that clone's own sparse worktree (code folders only).
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import git

from tools.core import contract

UPSTREAM = "https://github.com/Lightning-AI/pytorch-lightning"
SPARSE = ("src", "requirements")
REQUIREMENTS = ("requirements/pytorch/base.txt", "requirements/fabric/base.txt")
PR = re.compile(r"\(#(\d+)\)\s*$")


class BadInput(contract.BadInput):
    """A missing repository or an unknown ref (exit 2)."""


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str
    date: str  # committer date, ISO

    @property
    def pr(self) -> int | None:
        match = PR.search(self.subject)
        return int(match.group(1)) if match else None

    @property
    def label(self) -> str:
        return f"{self.sha[:10]} {self.subject[:60]}"


def repo_at(path: str | Path) -> git.Repo:
    """Open a checkout or a bare repository (also one without a config file, as snapshots are)."""
    path = Path(path)
    try:
        repo = git.Repo(path)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise BadInput(f"{path} is not a git repository") from None
    if not (path / ".git").exists() and (path / "HEAD").exists() and (path / "objects").exists():
        repo.git.update_environment(GIT_DIR=str(path))  # bare: git must not look at the parent
    return repo


def is_url(source: str) -> bool:
    """A repository to clone (``https://...``, ``ssh://...``, ``git@host:path``), not a path here."""
    return "://" in source or (source.startswith("git@") and ":" in source)


def _identity(source: str) -> str:
    """What tells a local repository from another one made later at the same path: the inode of
    its object store (a clone made with ``--shared`` reads that store, and breaks when it goes)."""
    root = Path(source)
    objects = root / ".git" / "objects" if (root / ".git").is_dir() else root / "objects"
    st = objects.stat()
    return f"{st.st_dev}:{st.st_ino}"


def open_repo(source: str, cache: Path, log=print) -> git.Repo:
    """A private clone of ``source`` (a path or URL) under ``cache``, made once, then reused. A
    local source that was deleted and made again is cloned again (the old clone borrowed the
    objects of the one that is gone), and the log says so."""
    name = hashlib.sha256(source.encode()).hexdigest()[:12]
    target = cache / name
    marker = target.with_name(f"{name}.source")
    if (target / ".git").exists() or (target / "HEAD").exists():
        local = Path(source).exists()
        same = not local or not marker.exists() or marker.read_text() == _identity(source)
        try:
            if same:
                repo = git.Repo(target)
                if local:  # pick up new commits of a local source
                    # --force: a tag moved in the source (re-tagged) is moved here, not a failed fetch
                    repo.git.fetch("--quiet", "--tags", "--force", "origin",
                                   "+refs/heads/*:refs/remotes/origin/*")
                    marker.write_text(_identity(source))
                return repo
        except git.GitCommandError:
            if not local:
                raise
        log(f"[repo] {source} is not the repository the cached clone was made from (deleted and "
            "made again?): cloning it again")
        shutil.rmtree(target)
    if Path(source).exists():
        repo_at(source)
    elif "://" not in source and not source.startswith("git@"):
        raise BadInput(f"no repository at {source}")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        shared = ["--shared"] if Path(source).exists() else []
        repo = git.Repo.clone_from(source, target, no_checkout=True, multi_options=shared)
    except git.GitCommandError as err:
        raise BadInput(f"cannot clone {source}: {err.stderr.strip().splitlines()[-1:]}") from None
    if shared:
        marker.write_text(_identity(source))
    return repo


def resolve(repo: git.Repo, ref: str) -> str:
    for candidate in (ref, f"origin/{ref}", f"refs/tags/{ref}"):
        try:
            return repo.commit(candidate).hexsha
        except (git.BadName, ValueError):
            continue
    raise BadInput(f"unknown git ref {ref!r}")


def mainline(repo: git.Repo, good: str, bad: str) -> tuple[str, str, list[str]]:
    """Map the ends onto one first-parent line (patch releases live on release branches).

    Returns (good, bad, notes): when ``good`` is not an ancestor of ``bad``, it becomes their
    merge-base; the notes say so for the report.
    """
    notes = []
    if not repo.is_ancestor(good, bad):
        base = repo.merge_base(good, bad)
        if not base:
            raise BadInput("the two refs share no history")
        notes.append(f"good end {good[:10]} is not an ancestor of the bad end; using their "
                     f"merge-base {base[0].hexsha[:10]}")
        good = base[0].hexsha
    return good, bad, notes


def first_parent(repo: git.Repo, good: str, bad: str) -> list[Commit]:
    """Commits after ``good`` up to ``bad`` along the first parent, oldest first (one per PR)."""
    out = repo.git.log("--first-parent", "--reverse", "--format=%H%x00%s%x00%cI", f"{good}..{bad}")
    commits = []
    for line in out.splitlines():
        sha, subject, date = line.split("\x00")
        commits.append(Commit(sha, subject, date))
    return commits


def commit_info(repo: git.Repo, sha: str) -> Commit:
    c = repo.commit(sha)
    return Commit(c.hexsha, c.summary, c.committed_datetime.isoformat())


class Worktree:
    """A detached, sparse worktree of the cache clone, moved from commit to commit."""

    @classmethod
    def claim(cls, repo: git.Repo, base: Path) -> Worktree:
        """A worktree no other running bisect uses: ``base-0``, ``base-1``, ... each taken with a
        lock held until this process ends (a killed run frees its worktree for the next one)."""
        base.parent.mkdir(parents=True, exist_ok=True)
        for n in itertools.count():
            path = base.with_name(f"{base.name}-{n}")
            lock = open(f"{path}.lock", "a")  # noqa: SIM115  (held for the life of the process)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            worktree = cls(repo, path)
            worktree.lock = lock
            return worktree

    def __init__(self, repo: git.Repo, path: Path, sparse: tuple[str, ...] = SPARSE, log=print):
        self.repo, self.path = repo, Path(path)
        if (self.path / ".git").exists() and not self._belongs():
            log(f"[repo] {self.path} is not a worktree of {repo.working_dir} (its clone was made again): "
                "making it again")
            shutil.rmtree(self.path)
        if not (self.path / ".git").exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            repo.git.worktree("prune")
            repo.git.worktree("add", "--detach", "--no-checkout", str(self.path), "HEAD")
            self.git = git.Repo(self.path).git
            self.git.sparse_checkout("set", "--no-cone", *(f"/{d}/" for d in sparse))
        self.git = git.Repo(self.path).git

    def _belongs(self) -> bool:
        """Is the folder a live worktree of ``repo`` (its ``.git`` file names a folder of
        ``repo``'s that still exists)?"""
        try:
            said = (self.path / ".git").read_text().strip()
        except (OSError, IsADirectoryError):
            return False
        gitdir = Path(said.removeprefix("gitdir:").strip())
        own = Path(self.repo.git_dir).resolve()
        return gitdir.is_dir() and gitdir.resolve().is_relative_to(own)

    def checkout(self, sha: str) -> Path:
        """Check ``sha`` out, dropping any change and untracked file left in the worktree."""
        self.git.checkout("--quiet", "--force", "--detach", sha)
        self.git.clean("-fdq")
        return self.path

    def requirements(self) -> list[str]:
        """Runtime requirements at the checked-out commit, torch left out (the bisect pins it)."""
        reqs = []
        for rel in REQUIREMENTS:
            path = self.path / rel
            if not path.exists():
                continue
            for line in path.read_text().splitlines():
                line = line.split("#")[0].strip()
                if line and not line.startswith("-") and not re.match(r"torch\b", line):
                    reqs.append(line)
        return sorted(set(reqs))
