"""The exit-code contract shared by every script in this folder.

Exit codes follow ``git bisect run``: 0 good (the bug is absent), 1 bad (the bug's
signature was seen), 125 cannot test (import error, unsupported API, unrelated crash),
128 and above: the repro or its harness failed (a bisect must stop). The last line a
repro prints on stdout is one JSON object describing the verdict.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time

GOOD, BAD, SKIP, FAIL = 0, 1, 125, 128
VERDICTS = {GOOD: "good", BAD: "bad", SKIP: "skip", FAIL: "error"}
_START = time.monotonic()


class UsageError(SystemExit):
    """Bad options: one line on stderr, exit 128 (a bisect must stop, not count it)."""

    def __init__(self, message: str) -> None:
        print(f"error: {message}", file=sys.stderr)
        super().__init__(FAIL)


class Parser(argparse.ArgumentParser):
    """argparse whose errors are the contract's usage errors (exit 128, not argparse's 2)."""

    def error(self, message):
        raise UsageError(message)


def import_lightning(name: str = "auto"):
    """Return ``(module, import_name)`` for Lightning's trainer package.

    ``auto`` prefers ``lightning.pytorch`` and falls back to ``pytorch_lightning``.
    An empty namespace package (a source tree without the mirror) does not count.
    """
    names = ["lightning.pytorch", "pytorch_lightning"] if name == "auto" else [name]
    errors = []
    for candidate in names:
        try:
            module = importlib.import_module(candidate)
        except Exception as err:  # any import failure means "cannot test", not "bad"
            errors.append(f"{candidate}: {type(err).__name__}: {err}")
            continue
        if hasattr(module, "Trainer"):
            return module, candidate
        errors.append(f"{candidate}: has no Trainer (empty namespace package)")
    raise ImportError("; ".join(errors))


def versions(import_name: str | None = None) -> dict:
    found = {"python": platform.python_version(), "lightning_import": import_name}
    torch = sys.modules.get("torch")
    found["torch"] = getattr(torch, "__version__", None)
    module = sys.modules.get(import_name or "")
    found["lightning"] = getattr(module, "__version__", None)
    if import_name == "lightning.pytorch" and found["lightning"] is None:
        found["lightning"] = getattr(sys.modules.get("lightning"), "__version__", None)
    return found


def global_rank() -> int:
    """This process's global rank as far as the environment tells (0 when launched by hand)."""
    for var in ("RANK", "SLURM_PROCID", "PMI_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    # Lightning's own launcher sets only the local and node ranks in the processes it starts
    local, node = os.environ.get("LOCAL_RANK", "0"), os.environ.get("NODE_RANK", "0")
    return int(local.isdigit() and int(local) or node.isdigit() and int(node))


def finish(repro, code, signature, details, import_name=None, rank=None):
    """Print the verdict line (rank 0 only) and exit with ``code`` (every rank)."""
    record = {
        "repro": repro,
        "verdict": VERDICTS.get(code, "error"),
        "exit_code": code,
        "signature": signature,
        "details": details,
        "versions": versions(import_name),
        "seconds": round(time.monotonic() - _START, 2),
    }
    sys.stdout.flush()
    sys.stderr.flush()
    if (global_rank() if rank is None else rank) == 0:
        print(json.dumps(record, default=str), flush=True)
    launch = sys.modules.get("_launch")
    if launch is not None:  # ranks forked by this process: let them finish first (bounded)
        launch.join()
    os._exit(code)  # skip interpreter teardown: a half-dead process group must not hang exit
