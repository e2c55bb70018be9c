"""The triage on the corpus of report shapes (tests/fixtures/issues/expected.toml): each report
triaged once (one run per cell, the release bisect, no minimization, no commit tier), its
comment's first line against the one expected; a table (expected, got, seconds) and the accuracy.

    python bench/triage_corpus.py --python .nox/tests/bin/python [--only NAME ...] [--out DIR]

``--out DIR``: ``summary.json`` (the rows) and ``summary.md`` (the table and the accuracy), written
after every report, each atomically; ``nox -s findings -- --record triage=DIR`` records them.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ISSUES = ROOT / "tests" / "fixtures" / "issues"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--python", required=True, help="the workspace's interpreter (the triage session's)")
    p.add_argument("--only", nargs="*", help="these reports only")
    p.add_argument("--out", help="also write summary.json and summary.md into this folder")
    a = p.parse_args()
    expected = tomllib.loads((ISSUES / "expected.toml").read_text())
    rows = []
    for name, case in expected.items():
        if a.only and name not in a.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o755)  # the sandbox runs the script as nobody, who must read its output folder
            started = time.monotonic()
            proc = subprocess.run([a.python, "-m", "tools.triage", str(ISSUES / f"{name}.md"),
                                   "--trials", "1", "--budget", "0", "--repo", "", "--out", tmp,
                                   "--state", str(Path(tmp) / "state.json")],
                                  cwd=ROOT, capture_output=True, text=True)
            seconds = round(time.monotonic() - started)
            comment = Path(tmp) / "comment.md"
            got = (comment.read_text().splitlines()[0].removeprefix("**Triage:** ") if comment.exists()
                   else f"(exit {proc.returncode}: {(proc.stderr.strip().splitlines() or ['?'])[-1]})")
        ok = re.match(case["first"], got) is not None
        rows.append({"report": name, "shape": case["shape"], "expected": case["first"], "got": got,
                     "seconds": seconds, "ok": ok})
        print(f"{'ok ' if ok else 'NO '} {name} ({seconds} s): {got[:160]}", file=sys.stderr, flush=True)
        if a.out:  # after every report, so that an interrupted bench keeps what it measured
            write(Path(a.out), "summary.json", json.dumps(rows, indent=1))
            write(Path(a.out), "summary.md", table(rows))
    print(table(rows))


def table(rows: list[dict]) -> str:
    lines = ["| report | shape | expected | got | s | |", "|---|---|---|---|---|---|"]
    for r in rows:
        got, ok = r["got"][:200].replace("|", "/"), "ok" if r["ok"] else "**no**"
        lines.append(f"| {r['report']} | {r['shape']} | `{r['expected']}` | {got} | {r['seconds']} | {ok} |")
    right = sum(r["ok"] for r in rows)
    return "\n".join(lines) + (f"\n\n{right} of {len(rows)} reports give their expected first line "
                               f"({right / max(len(rows), 1):.0%})\n")


def write(folder: Path, name: str, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / f".{name}.part"
    part.write_text(text)
    part.replace(folder / name)


if __name__ == "__main__":
    main()
