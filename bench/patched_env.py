"""A patch validation's throwaway environment: compiled at install versus the cell environment's
bytecode linked in (``tools.validate_patches.throwaway`` with ``like``), and the first import in it.

    python bench/patched_env.py --cell pl2_6_6_torch2_13_0 --runs 3

Both make a new uv environment of the cell's requirements from uv's cache (the cell environment
itself is made first, once), then import torch and Lightning in it once; alternating, medians.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ab import alternate, report  # noqa: E402

from tools.environments import envs, matrix  # noqa: E402

MAKE = """import subprocess, sys, tempfile
from pathlib import Path
from tools import validate_patches
from tools.series import patched
with patched.scratch("bench-") as tmp:
    python = patched.throwaway({args!r}, tmp / "env", {like})
    subprocess.run([str(python), "-c", "import torch, {module}"], check=True)
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cell", default="pl2_6_6_torch2_13_0")
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    (cell,) = [c for c in matrix.load().cells if c.id == a.cell]
    args = envs.install_args(cell.package, cell.lightning, cell.torch)
    cell_py = envs.ensure(f"{cell.package}-{cell.lightning}-torch{cell.torch}", args)
    module = "pytorch_lightning" if cell.package == "pytorch-lightning" else "lightning.pytorch"
    walls = alternate({
        name: {"cmd": [sys.executable, "-c", MAKE.format(args=args, like=like, module=module)], "cwd": ROOT}
        for name, like in (("compiled", None), ("linked", f"Path({str(cell_py)!r})"))
    }, runs=a.runs)
    report(walls, "compiled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
