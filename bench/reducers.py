"""Which test-case reducer for `nox -s minimize`: the candidates compared on the same task.

    python bench/reducers.py [--seconds-per-launch 8] [--out results/bench/reducers.md]

The task is the one `nox -s minimize` has: shrink a bloated Python program that hides a
use-after-free of a DDP-like wrapper (the #20706 shape: an output kept across a re-wrap) while
the *same* error, raised at the same place, still shows. Every test costs a launch; on a real
program a launch is a two-rank DDP run (about 8 s here), so the number of tests decides the cost.
The program is pure Python (no torch), so each reducer runs to completion in seconds and the
count of tests is exact.

Each reducer runs from its own command line or API with the same interestingness test
(`python CANDIDATE` shows "AttributeError: 'NoneType' object has no attribute 'reducer'" raised
in `backward`): pysource-minimize (AST), lithium (lines, its default strategy), shrinkray
(generic passes, one test at a time as on a 2-core machine). picire is listed with why it
was not run. The reducers come from the package index into a throwaway environment (uv).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PACKAGES = ["pysource-minimize", "lithium-reducer", "shrinkray", "packaging", "gitpython", "ruff"]
SIGNATURE = "AttributeError: 'NoneType' object has no attribute 'reducer'"

PROGRAM = '''
"""Two training stages; the second one consumes an output kept from the first."""
import json
import logging
import os
import sys
import weakref

CONFIG = {"stages": ["warmup", "finetune"], "log_every": 5, "lr": 0.1, "data": {"size": 6}}
log = logging.getLogger("train")


class Wrapper:
    def __init__(self, module):
        self.module = module
        self.reducer = object()


class Output:
    def __init__(self, wrapper):
        self.ref = weakref.ref(wrapper)
        self.used = False

    def backward(self):
        reducer = self.ref().reducer
        if self.used:
            raise RuntimeError("Trying to backward through the graph a second time")
        self.used = True
        return reducer


class Metrics:
    def __init__(self):
        self.values = {}

    def update(self, name, value):
        self.values.setdefault(name, []).append(value)

    def summary(self):
        return {k: sum(v) / len(v) for k, v in self.values.items()}


def setup_logging(level):
    logging.basicConfig(level=level)
    log.info("ready")


def make_data(cfg):
    return list(range(cfg["data"]["size"]))


def unrelated(x):
    return [i * 2 for i in range(x)]


def stage(model, data, kept, metrics):
    wrapper = Wrapper(model)
    out = Output(wrapper)
    for x in data:
        metrics.update("x", sum(unrelated(x)))
    if kept is not None:
        kept.backward()
    out.backward()
    return out


def main():
    setup_logging(logging.WARNING)
    metrics = Metrics()
    data = make_data(CONFIG)
    kept = None
    for name in CONFIG["stages"]:
        kept = stage(object(), data, kept, metrics)
        print(json.dumps({"stage": name, **metrics.summary()}))
    if os.environ.get("NEVER_SET"):
        sys.exit(3)


if __name__ == "__main__":
    main()
'''

# The interestingness test, as a program: exit 0 when the candidate (a path, or stdin) is
# interesting; every call is counted in $COUNT_FILE.
TEST = '''
import os, subprocess, sys, tempfile
with open(os.environ["COUNT_FILE"], "a") as fh:
    fh.write("x")
if len(sys.argv) > 1:
    source = open(sys.argv[1]).read()
else:
    source = sys.stdin.read()
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "candidate.py")
    with open(path, "w") as fh:
        fh.write(source)
    try:
        proc = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        sys.exit(1)
lines = proc.stderr.splitlines()
frames = [line for line in lines if line.startswith("  File ")]
ok = bool(lines) and lines[-1] == SIGNATURE and bool(frames) and frames[-1].endswith("in backward")
sys.exit(0 if ok else 1)
'''.replace("SIGNATURE", repr(SIGNATURE))

# lithium's form of the same test: a module with interesting(args, temp_prefix)
LITHIUM_TEST = '''
import subprocess, sys
def interesting(cli_args, temp_prefix):
    return subprocess.run([sys.executable, TEST, cli_args[0]]).returncode == 0
'''


def size(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def env_python(folder: Path) -> Path:
    subprocess.run(["uv", "venv", "--quiet", "--clear", "--python", "3.11", str(folder)], check=True)
    python = folder / "bin" / "python"
    subprocess.run(["uv", "pip", "install", "--quiet", "--python", str(python), *PACKAGES], check=True)
    return python


def run_reducer(name: str, python: Path, work: Path, limit: float) -> dict:
    """One reducer on the program, stopped after ``limit`` seconds (its result so far counts)."""
    work.mkdir(parents=True)
    target = work / "train.py"
    target.write_text(textwrap.dedent(PROGRAM))
    test = work / "test.py"
    test.write_text(TEST)
    count = work / "count"
    count.write_text("")
    env = {**os.environ, "COUNT_FILE": str(count)}
    start = time.monotonic()
    if name == "pysource-minimize":
        code = ("import subprocess, sys, pysource_minimize, pathlib\n"
                f"src = pathlib.Path({str(target)!r}).read_text()\n"
                f"def check(s):\n"
                f"    p = pathlib.Path({str(work / 'cand.py')!r}); p.write_text(s)\n"
                f"    return subprocess.run([sys.executable, {str(test)!r}, str(p)]).returncode == 0\n"
                f"pathlib.Path({str(target)!r}).write_text(pysource_minimize.minimize(src, check))\n")
        cmd = [str(python), "-c", code]
    elif name == "lithium":
        (work / "lithium_test.py").write_text(LITHIUM_TEST.replace("TEST", repr(str(test))))
        (work / "tmp").mkdir()
        cmd = [str(python), "-m", "lithium", "--tempdir", str(work / "tmp"), str(work / "lithium_test.py"),
               str(target)]
    elif name == "nox -s minimize":  # pysource-minimize behind the workspace's checks and cache
        root = Path(__file__).resolve().parent.parent
        cmd = [str(python), "-m", "tools.minimize", str(target), "--python", str(python),
               "--signature", SIGNATURE.split(": ", 1)[1], "--fresh-process", "--confirm", "1",
               "--out", str(work / "out")]
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=limit)
        if proc.returncode:
            raise SystemExit(f"nox -s minimize's tool failed: {proc.stderr.strip()[-300:]}")
        report = (work / "out" / "report.md").read_text()
        result = (work / "out" / "minimized.py").read_text()
        launches = int(report.split("- Reduction: ")[1].split(" launches")[0])
        return {"reducer": name, "exit": proc.returncode, "tests": launches - 2,  # - original, confirmation
                "seconds": time.monotonic() - start, "lines": size(result),
                "still_bad": proc.returncode == 0, "tail": ""}
    else:  # shrinkray: the test reads the candidate on stdin; one test at a time
        cmd = [str(python.parent / "shrinkray"), "--parallelism", "1", "--timeout", "20",
               f"{python} {test}", str(target)]
    try:
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=limit)
        stopped = False
    except subprocess.TimeoutExpired:
        proc, stopped = subprocess.CompletedProcess(cmd, -9, "", ""), True
    seconds = time.monotonic() - start
    result = target.read_text() if name != "shrinkray" or not (work / "train.py.reduced").exists() \
        else (work / "train.py.reduced").read_text()
    final = work / "final.py"
    final.write_text(result)
    check = subprocess.run([str(python), str(test), str(final)], env=env)
    return {"reducer": name, "exit": proc.returncode, "tests": len(count.read_text()) - 1,
            "seconds": seconds, "lines": size(result), "still_bad": check.returncode == 0,
            "stopped": stopped, "tail": (proc.stderr.strip().splitlines() or [""])[-1][:100]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds-per-launch", type=float, default=8.0,
                   help="what one test costs on a real two-rank DDP program")
    p.add_argument("--out", default="results/bench/reducers.md")
    p.add_argument("--limit", type=float, default=10.0, help="minutes each reducer may run")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        python = env_python(Path(tmp) / "env")
        rows = [run_reducer(name, python, Path(tmp) / name.replace(" ", "_"), a.limit * 60)
                for name in ("pysource-minimize", "lithium", "shrinkray", "nox -s minimize")]
    original = size(textwrap.dedent(PROGRAM))
    lines = [f"Original: {original} lines. One test on a real DDP program: ~{a.seconds_per_launch:g} s.", "",
             "| reducer | tests | result (lines) | still the bug | here | projected on DDP |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        tests = f"{r['tests']}{' (stopped)' if r.get('stopped') else ''}"
        lines.append(f"| {r['reducer']} | {tests} | {r['lines']} ({100 * r['lines'] / original:.0f} %) | "
                     f"{'yes' if r['still_bad'] else 'no'} | {r['seconds']:.0f} s | "
                     f"{r['tests'] * a.seconds_per_launch / 60:.0f} min |")
    lines += ["", "picire 21.8 (2021, the newest release) was not run: it imports pkg_resources, "
              "which current setuptools no longer ships."]
    text = "\n".join(lines) + "\n"
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
