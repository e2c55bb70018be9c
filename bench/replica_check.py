"""What the replica check (``--check-replicas``) adds to a fit, at the default interval (every
epoch end and the last step): ``trainer.fit`` seconds with and without it, alternating runs,
medians and their ratio (goal <= 1.05), and the check's own seconds per check (from its report).

    python bench/replica_check.py --python .nox/tests/bin/python --runs 5
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INJECT = ROOT / "tools" / "inject"


def fit(python: str, model: str, checked: bool) -> tuple[float, dict | None]:
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "replicas"
        if checked:
            env.update(PYTHONPATH=str(INJECT), WORKSPACE_CHECK_REPLICAS="epoch",
                       WORKSPACE_CHECK_REPLICAS_REPORT=str(report))
        out = subprocess.run([python, str(ROOT / "bench" / "replica_fit.py"), "--model", model],
                             env=env, capture_output=True, text=True, check=True).stdout
        said = None
        if checked:  # one report per process that checked: rank 0's
            reports = [json.loads(f.read_text()) for f in report.glob("*.json")]
            said = next(r for r in reports if r.get("rank") == 0)
    return float(re.search(r"fit_seconds=([\d.]+)", out).group(1)), said


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--python", default=sys.executable, help="interpreter with torch + Lightning")
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()
    for model in ("20340", "mlp"):
        plain, checked, per_check = [], [], []
        fit(a.python, model, True)  # warm-up
        for i in range(a.runs):  # alternate, so drift in machine load hits both alike
            plain.append(fit(a.python, model, False)[0])
            seconds, said = fit(a.python, model, True)
            checked.append(seconds)
            per_check.append(said["seconds"] / said["checks"])
            print(f"  {model} run {i + 1}: plain {plain[-1]:.2f} s, checked {seconds:.2f} s "
                  f"({said['checks']} checks, {said['seconds'] * 1000:.1f} ms in them)", flush=True)
        p_med, c_med = statistics.median(plain), statistics.median(checked)
        print(f"{model}: fit median {p_med:.2f} s plain, {c_med:.2f} s checked, ratio "
              f"{c_med / p_med:.3f} (goal <= 1.05); per check {statistics.median(per_check) * 1000:.1f} ms "
              f"(rank 0)")


if __name__ == "__main__":
    main()
