"""A command in a checkout of an earlier commit vs. in this one, alternating (before / after).

    python bench/versus_ref.py --ref dc0b9fe --runs 2 -- nox -s tests
    python bench/versus_ref.py --ref dc0b9fe --runs 3 -- nox -s repro -k "pl2_6_6 and torch2_13_0"
    python bench/versus_ref.py --ref dc0b9fe --runs 1 --warmup 0 --fresh-envs -- nox -s repro

The earlier commit is checked out with ``git worktree`` into ``.cache/bench/<ref>`` (made once).
Each tree keeps its own ``.nox`` environments: the warm-up runs make them, so the counted runs
compare the code, not the installs. ``--fresh-envs`` deletes both trees' ``.nox`` folders before
every run instead (environments made from uv's cache count: "every torch already cached").
"""

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ab import alternate, report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def worktree(ref: str) -> Path:
    sha = subprocess.run(["git", "rev-parse", "--short=10", ref], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    path = ROOT / ".cache" / "bench" / sha
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=ROOT, check=True)
    return path


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ref", required=True, help="the earlier commit (before)")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--fresh-envs", action="store_true", help="delete .nox before every run")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        p.error("give the command after --")
    trees = {f"before ({a.ref})": worktree(a.ref), "after (this checkout)": ROOT}
    if a.fresh_envs:
        script = "import shutil, subprocess, sys; shutil.rmtree('.nox', ignore_errors=True); " \
                 "sys.exit(subprocess.run(sys.argv[1:]).returncode)"
        cmd = [sys.executable, "-c", script, *cmd]
    walls = alternate({name: {"cmd": cmd, "cwd": tree} for name, tree in trees.items()},
                      runs=a.runs, warmup=a.warmup)
    medians = report(walls, "after (this checkout)")
    before, after = medians[f"before ({a.ref})"], medians["after (this checkout)"]
    print(f"before / after: {before / after:.2f}x")


if __name__ == "__main__":
    main()
