"""Wall of creating one era-correct cell environment whose torch is already in uv's cache.

    python bench/env_creation.py --package pytorch-lightning --lightning 2.4.0 --torch 2.13.0

Made as the workspace makes them: bytecode compiled at install (``environments.envs.uv_env``), a one-time
cost that every later import of torch and Lightning gets back. The first creation warms uv's cache;
the figure is the median of the next ``--runs``.
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools.environments import envs  # noqa: E402


def create(folder: Path, args: list[str]) -> float:
    t = time.monotonic()
    subprocess.run(["uv", "venv", "-q", "-p", "3.11", str(folder)], check=True)
    subprocess.run(["uv", "pip", "install", "-q", "--python", str(folder / "bin" / "python"), *args],
                   check=True, env=envs.uv_env())
    return time.monotonic() - t


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--package", default="pytorch-lightning")
    p.add_argument("--lightning", default="2.4.0")
    p.add_argument("--torch", default="2.13.0")
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    t = time.monotonic()
    args = envs.install_args(a.package, a.lightning, a.torch)
    print(f"resolving the era (index + torch closure): {time.monotonic() - t:.2f} s")
    with tempfile.TemporaryDirectory() as tmp:
        print(f"warm-up creation: {create(Path(tmp) / 'warm', args):.2f} s")
        walls = [create(Path(tmp) / f"env{i}", args) for i in range(a.runs)]
    print("cached creations: " + ", ".join(f"{w:.2f} s" for w in walls))
    print(f"median {statistics.median(walls):.2f} s")


if __name__ == "__main__":
    main()
