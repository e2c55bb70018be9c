"""Harness wall / bare ``python repro/...`` wall for the #20340 repro (goal <= 1.05).

    python bench/harness_overhead.py --python .nox/repro-pl2_6_6_torch2_13_0/bin/python --runs 3
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools.launch import harness  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--python", default=sys.executable, help="interpreter with torch + Lightning")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("repro_args", nargs="*")
    a = p.parse_args()
    cmd = [a.python, str(ROOT / "repro" / "backbone_finetuning_ddp.py"), *a.repro_args]
    bare, wrapped = [], []
    for i in range(a.runs):  # alternate, so drift in machine load hits both alike
        t = time.monotonic()
        rc = subprocess.run(cmd, capture_output=True).returncode
        bare.append(time.monotonic() - t)
        t = time.monotonic()
        r = harness.run(cmd, timeout=600)
        wrapped.append(time.monotonic() - t)
        print(f"run {i + 1}: bare {bare[-1]:.2f} s (exit {rc}), harness {wrapped[-1]:.2f} s "
              f"({r.verdict})", flush=True)
    b, w = statistics.median(bare), statistics.median(wrapped)
    print(f"median bare {b:.2f} s, harness {w:.2f} s, ratio {w / b:.3f} (goal <= 1.05)")


if __name__ == "__main__":
    main()
