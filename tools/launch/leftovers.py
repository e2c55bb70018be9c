"""What a run leaves in the temporary folder is named for its owner process (pid and start time),
so that the next run can sweep what a SIGKILLed owner left behind, and say what it removed."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from pathlib import Path


def proc_stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


# -- what a run leaves in the temporary folder, and its owner ---------------------------------------

OWNED = re.compile(r"^(ranks|sandbox)-(\d+)\.(\d+)-")


def _start_time(pid: int) -> int | None:
    fields = proc_stat(pid)
    return int(fields[19]) if fields else None


def owned(prefix: str) -> str:
    """The start of the name of a temporary file or folder this process owns: its pid and start
    time, so that once it is gone (even SIGKILLed) the next run can tell, and remove it."""
    return f"{prefix}-{os.getpid()}.{_start_time(os.getpid())}-"


def owned_tempdir(prefix: str) -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix=owned(prefix)))


def owner_alive(name: str) -> bool:
    """Is the process that made ``name`` (see ``owned``) still running? A name of another shape
    counts as alive (never removed)."""
    m = OWNED.match(name)
    return m is None or _start_time(int(m.group(2))) == int(m.group(3))


_SWEPT: list[bool] = []


def sweep(log=None) -> list[str]:
    """Remove, once per process, the pid files and sandbox folders in the temporary folder whose
    owner process is gone (a harness that was SIGKILLed), saying what was removed."""
    import tempfile

    if _SWEPT:
        return []
    _SWEPT.append(True)
    removed = []
    folder = Path(tempfile.gettempdir())
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not OWNED.match(entry.name) or owner_alive(entry.name):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
        if not entry.exists():
            removed.append(str(entry))
            m = OWNED.match(entry.name)
            (log or _say)(f"[sweep] removed {entry}: left by process {m.group(2)}, which is gone")
    return removed


def _say(message: str) -> None:
    print(message, file=sys.stderr)
