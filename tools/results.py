"""Result files: atomic JSON writes, one folder per run, and the Markdown summary table."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
_STAMP = time.strftime("%Y%m%d-%H%M%S")  # one per process: all cells of one nox run share it


def _mode() -> int:
    """What a plain ``open()`` would give a new file now (``mkstemp`` always gives 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, _mode())
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_json(path: Path, data) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def run_dir(kind: str, base: Path | None = None) -> Path:
    """``results/<kind>/<timestamp>/``, with ``results/<kind>/latest`` pointing at it."""
    base = Path(base or os.environ.get("REPRO_RESULTS") or RESULTS) / kind
    path = base / _STAMP
    path.mkdir(parents=True, exist_ok=True)
    latest = base / "latest"
    tmp = base / f".latest.{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(path.name)
    os.replace(tmp, latest)
    return path


def this_run_dir(kind: str, base: Path | None = None) -> Path:
    """This process's ``results/<kind>/<timestamp>/`` (what ``run_dir`` makes), not made here."""
    return Path(base or os.environ.get("REPRO_RESULTS") or RESULTS) / kind / _STAMP


def latest_dir(kind: str, base: Path | None = None) -> Path:
    return Path(base or os.environ.get("REPRO_RESULTS") or RESULTS) / kind / "latest"


def load_cells(folder: Path) -> list[dict]:
    cells = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("cells/*.json"))]
    return sorted(cells, key=lambda c: c["cell"]["index"])


def cell_text(result: dict | None) -> str:
    """One table entry: the verdict and its key detail."""
    if result is None:
        return ""
    details = (result.get("record") or {}).get("details") or {}
    text = result["verdict"]
    if details.get("summary") and result["verdict"] in ("bad", "good"):
        text += f": {details['summary']}"
    elif result["verdict"] == "bad":
        params = ", ".join(details.get("diverging_params", []))
        if "first_diverging_epoch" in details:
            text += f": epoch {details['first_diverging_epoch']} {params}"
        elif result.get("reason"):
            text += f": {result['reason']}"
    elif result["verdict"] != "good" and result.get("reason"):
        text += f": {result['reason']}"
    return text.replace("|", "/").replace("\n", " ")[:120]


def summary_markdown(cells: list[dict], repros: list[str]) -> str:
    head = ["cell", "lightning", "torch (declared range)", *repros, "seconds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        cell = c["cell"]
        torch = f"{c.get('torch_installed') or cell['torch']} ({cell['declared'] or '?'})"
        if c.get("skipped"):
            row = [cell["id"], f"{cell['package']} {cell['lightning']}", torch,
                   f"not run: {c['skipped']}", *[""] * (len(repros) - 1), ""]
        else:
            row = [cell["id"], f"{cell['package']} {c.get('lightning_installed') or cell['lightning']}",
                   torch, *(cell_text(c["results"].get(r)) for r in repros),
                   f"{c.get('seconds', 0):.0f}" + (" (interrupted)" if c.get("incomplete") else "")]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
