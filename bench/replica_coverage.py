"""On which Lightning and torch releases each way in of the replica check works: the two fixtures
(tests/fixtures/replicas: a Lightning fit in the #20340 situation, a plain torch DDP script whose
rank 1 has its own learning rate) under ``python -m tools.run --check-replicas`` in era-correct
environments (tools/environments/envs.py), each expected bad; a Markdown table.

    python bench/replica_coverage.py pytorch-lightning==1.9.5,torch==2.0.0 lightning==2.6.6,torch==2.13.0
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools.environments import envs  # noqa: E402

FIXTURES = {"Lightning callback": ["finetune.py"], "torch step hook": ["torch_ddp.py", "--diverge", "lr"]}


def main(combos: list[str]) -> None:
    print("| Lightning | torch | way in | verdict | what it said |\n|---|---|---|---|---|")
    for combo in combos:
        pins = dict(pin.split("==") for pin in combo.split(","))
        package = "lightning" if "lightning" in pins else "pytorch-lightning"
        version, torch = pins[package], pins["torch"]
        try:
            python = envs.ensure(f"{package}-{version}-torch{torch}",
                                 envs.install_plan(package, version, torch).args, log=print)
        except envs.EnvError as err:
            print(f"| {package} {version} | {torch} | - | cannot test | {str(err)[-90:]} |", flush=True)
            continue
        for way, (script, *args) in FIXTURES.items():
            cmd = [sys.executable, "-m", "tools.run", "--check-replicas=3", "--timeout", "300", "--",
                   str(python), str(ROOT / "tests" / "fixtures" / "replicas" / script), *args]
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            said = (r["reason"] or "")[:90].replace("|", "/")
            print(f"| {package} {version} | {torch} | {way} | {r['verdict']} | {said} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
