"""The verdict contract of every repro (``git bisect run``'s exit codes) and its verdict line."""

from __future__ import annotations

import json

GOOD, BAD, SKIP, FAIL = 0, 1, 125, 128
NAMES = {GOOD: "good", BAD: "bad", SKIP: "skip"}


def name(code: int) -> str:
    """good / bad / skip, or error for anything that must stop a bisect (>= 128 and the rest)."""
    return NAMES.get(code, "error")


def parse_verdict_line(stdout: str) -> dict | None:
    """The last non-empty stdout line as a verdict record, or None when it is not one."""
    for line in reversed(stdout.splitlines()):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            return None
        if isinstance(record, dict) and "verdict" in record and "exit_code" in record:
            return record
        return None
    return None
