"""Time whole commands side by side: alternating runs, medians, ratios (shared by bench/ scripts).

The machine is noisy: commands take turns (A B A B ...) so that drift hits all of them alike,
and figures are medians of the counted runs after the warm-up ones.
"""

from __future__ import annotations

import statistics
import subprocess
import time


def timed(cmd: list[str], cwd=None, env=None) -> tuple[float, int]:
    start = time.perf_counter()
    rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL).returncode
    return time.perf_counter() - start, rc


def alternate(commands: dict[str, dict], runs: int = 3, warmup: int = 1) -> dict[str, list[float]]:
    """``commands``: name -> {"cmd": [...], "cwd": ..., "env": ...}; seconds of each counted run."""
    walls: dict[str, list[float]] = {name: [] for name in commands}
    for i in range(warmup + runs):
        for name, spec in commands.items():
            seconds, rc = timed(spec["cmd"], spec.get("cwd"), spec.get("env"))
            counted = i >= warmup
            if counted:
                walls[name].append(seconds)
            print(f"  {'run' if counted else 'warm-up'} {i + 1 - warmup if counted else i + 1}: "
                  f"{name}: {seconds:.2f} s (exit {rc})", flush=True)
    return walls


def report(walls: dict[str, list[float]], reference: str) -> dict[str, float]:
    """Print each command's median and its ratio to ``reference``'s median; return the medians."""
    medians = {name: statistics.median(w) for name, w in walls.items()}
    for name, m in medians.items():
        ratio = m / medians[reference]
        print(f"{name}: median {m:.2f} s (min {min(walls[name]):.2f}, max {max(walls[name]):.2f}, "
              f"n={len(walls[name])}); / {reference}: {ratio:.2f}")
    return medians
