"""The whole #20706 stress catalogue: forked runs / a new interpreter per rank (goal >= 5x).

    python bench/stress_catalogue.py --python .nox/repro-pl2_6_6_torch2_13_0/bin/python \
        [--baseline-python <an environment without compiled bytecode>] [--runs 1]

Alternating in the same run: the catalogue in its default mode (one import in the orchestrator,
every run a fork) and with ``--fresh-process`` (two new interpreters per run), the latter in
``--baseline-python`` if given (e.g. an environment made as before bytecode was compiled). Also
prints the average run of the fast catalogue against the import floor (goal <= 0.5).
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ab import alternate, report  # noqa: E402

STRESS = Path(__file__).resolve().parent.parent / "repro" / "ddp_weakref_stress.py"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--python", default=sys.executable, help="interpreter with torch + Lightning")
    p.add_argument("--baseline-python", help="interpreter of the --fresh-process runs")
    p.add_argument("--import-name", default="pytorch_lightning")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--out", help="keep both catalogues' results here (runs.jsonl, summary.md)")
    p.add_argument("stress_args", nargs="*", help="e.g. --quick")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = a.out or tmp
        fast_out = Path(tmp) / "fast"
        walls = alternate({
            "catalogue, forked runs": {"cmd": [a.python, str(STRESS), *a.stress_args,
                                               "--out", str(fast_out)]},
            "catalogue, --fresh-process": {"cmd": [a.baseline_python or a.python, str(STRESS),
                                                   *a.stress_args, "--fresh-process",
                                                   "--out", str(Path(tmp) / "fresh")]},
        }, runs=a.runs, warmup=0)
        floor = alternate({"import floor": {"cmd": [a.python, "-c", f"import torch, {a.import_name}"]}},
                          runs=3)
        runs = [json.loads(line) for line in (fast_out / "runs.jsonl").read_text().splitlines()]
    medians = report({**walls, **floor}, "catalogue, forked runs")
    per_run = medians["catalogue, forked runs"] / len(runs)
    print(f"{len(runs)} runs in the catalogue: {per_run:.2f} s per forked run (whole command / runs), "
          f"{per_run / medians['import floor']:.2f} x the import floor; fresh / forked: "
          f"{medians['catalogue, --fresh-process'] / medians['catalogue, forked runs']:.1f}x")
    print(f"median of the runs' own walls (forked): "
          f"{statistics.median(r['seconds'] for r in runs):.2f} s")


if __name__ == "__main__":
    main()
