"""Peak memory of one matrix cell run the fast way: the preloaded runner and all its forks together.

    python bench/cell_memory.py --python .nox/repro-pl2_6_6_torch2_13_0/bin/python   # goal < 2 GiB

Runs the repros of ``repro/matrix.toml`` in one preloaded runner (as ``nox -s repro`` does) and
samples, every 50 ms, the proportional set size (PSS, from /proc/<pid>/smaps_rollup: pages shared
by forks are counted once in total) of the runner and every process below it. Linux only.
"""

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools.environments import matrix  # noqa: E402
from tools.launch.preloaded import Runner  # noqa: E402


def tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--python", default=sys.executable, help="the cell's interpreter")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [{"argv": [str(ROOT / r.script), *(x.replace("{out}", tmp) for x in r.args)],
                 "timeout": 300, "log_stem": str(Path(tmp) / r.name)} for r in matrix.load().repros]
        runner = Runner(a.python, stderr=Path(tmp) / "runner.stderr")
        peak = {"pss": 0, "procs": 0}
        done = threading.Event()

        def work():
            try:
                for job in jobs:
                    r = runner.run(job)
                    print(f"  {Path(job['argv'][0]).name}: {r.verdict} [{r.seconds:.1f} s]", flush=True)
            finally:
                done.set()

        threading.Thread(target=work, daemon=True).start()
        while not done.is_set():
            if runner.proc is not None:
                pids = tree(runner.proc.pid)
                total = sum(pss_kib(pid) for pid in pids)
                if total > peak["pss"]:
                    peak.update(pss=total, procs=len(pids))
            time.sleep(0.05)
        runner.close()
    print(f"peak PSS of the runner and its forks: {peak['pss'] / 1024:.0f} MiB "
          f"({peak['procs']} processes at that moment; goal < 2048 MiB)")


if __name__ == "__main__":
    main()
