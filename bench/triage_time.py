"""How long a triage of a #20340-style report takes (a DDP script that reproduces in every
release; environments already made, but no verdict cached: the bisect's state is a new one;
a 5-minute minimize budget). Goal: <= 10 minutes.

    python bench/triage_time.py --python .nox/tests/bin/python
"""

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--python", required=True, help="the workspace's interpreter (the triage session's)")
    p.add_argument("--issue", default=str(ROOT / "tests" / "fixtures" / "issues" / "drift_after_unfreeze.md"))
    p.add_argument("--minimize-budget", default="5")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        rc = subprocess.run([a.python, "-m", "tools.triage", a.issue, "--minimize-budget", a.minimize_budget,
                             "--out", tmp, "--state", str(Path(tmp) / "state.json")], cwd=ROOT).returncode
        seconds = time.monotonic() - started
        data = json.loads((Path(tmp) / "triage.json").read_text())
        print((Path(tmp) / "comment.md").read_text())
    print(f"triage: {seconds / 60:.1f} min (exit {rc}; goal <= 10 min): {data['status']}")


if __name__ == "__main__":
    main()
