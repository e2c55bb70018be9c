"""The triage's progress lines: the stage and the seconds since it started."""

from __future__ import annotations

import time

_started = time.monotonic()


def elapsed() -> float:
    """Seconds since the triage started (since this process imported it)."""
    return time.monotonic() - _started


def progress(stage: str, text: str) -> None:
    print(f"[triage {elapsed():5.0f} s] {stage}: {text}", flush=True)
