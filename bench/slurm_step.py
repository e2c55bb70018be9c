"""How long until a finished SLURM job is seen finished: ``sbatch --wait`` versus a bisect step
(``tools.launch.slurm_jobs.run``, which watches the exit-code file its job writes as it ends).

    nox -s slurm_up && python bench/slurm_step.py --seconds 1 12

For each job length, the same ``python -c "time.sleep(N)"`` job both ways, alternating; medians.
``sbatch --wait`` looks at its job after 2, 10, 42, ... s, so a job of a few seconds is seen after
10 s and one of 12 s after 42 s.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ab import alternate, report  # noqa: E402

from tools.launch import slurm_cluster  # noqa: E402

STEP = """import sys
from tools.launch import slurm_jobs
r = slurm_jobs.run([sys.executable, "-c", "import time; time.sleep({n})"], timeout=300, log_stem={stem!r},
                   signature=None, env=None, opts=slurm_jobs.Options(time="10", ranks_per_node=1),
                   log=lambda m: None)
sys.exit(0 if r.verdict == "good" else 1)
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, nargs="+", default=[1.0, 12.0], help="job lengths")
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    env = {**os.environ, **({} if "SLURM_CONF" in os.environ else slurm_cluster.env())}
    tmp = Path(tempfile.mkdtemp(prefix="slurm-step-"))
    for n in a.seconds:
        print(f"a job of {n:g} s:")
        sleep = f"{sys.executable} -c 'import time; time.sleep({n})'"
        walls = alternate({
            "sbatch --wait": {"cmd": ["sbatch", "--wait", "--ntasks=1", "--time=10", f"--output={tmp}/%j.out",
                                      "--wrap", sleep], "env": env},
            "bisect step": {"cmd": [sys.executable, "-c", STEP.format(n=n, stem=str(tmp / "step"))],
                            "cwd": ROOT, "env": env},
        }, runs=a.runs)
        report(walls, "sbatch --wait")
    return 0


if __name__ == "__main__":
    sys.exit(main())
