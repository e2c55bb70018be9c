"""One #20340 verdict / the import floor, in one environment (goal: fork launch <= 1.3).

    python bench/verdict_floor.py --python .nox/repro-pl2_6_6_torch2_13_0/bin/python --runs 5

The import floor is ``python -c "import torch, pytorch_lightning"``: what any verdict in a fresh
interpreter pays before the repro's own work. Compared in the same run, alternating: the verdict
with the ranks forked after the imports (the default) and with Lightning's launcher (a new
interpreter per extra rank, as in the report).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ab import alternate, report  # noqa: E402

REPRO = Path(__file__).resolve().parent.parent / "repro" / "backbone_finetuning_ddp.py"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--python", default=sys.executable, help="interpreter with torch + Lightning")
    p.add_argument("--import-name", default="pytorch_lightning")
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()
    walls = alternate({
        "import floor": {"cmd": [a.python, "-c", f"import torch, {a.import_name}"]},
        "verdict --launch fork": {"cmd": [a.python, str(REPRO), "--launch", "fork"]},
        "verdict --launch lightning": {"cmd": [a.python, str(REPRO), "--launch", "lightning"]},
    }, runs=a.runs)
    report(walls, "import floor")


if __name__ == "__main__":
    main()
