"""Result files: atomic JSON writes, one folder per run, and the Markdown summary table."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
            fh.flush()
            os.fsync(fh.fileno())  # on disk before the rename: a crash leaves the old file or the new
        os.replace(tmp, path)
    except BaseException:
        # gone already when the interrupt came just after the rename: the new file is in place
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: Path, data) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


_MADE: dict[Path, Path] = {}  # results/<kind> -> the run folder this process made there


def kind_dir(kind: str, base: Path | None = None) -> Path:
    """``results/<kind>`` (``REPRO_RESULTS`` moves ``results``)."""
    return Path(base or os.environ.get("REPRO_RESULTS") or RESULTS) / kind


def run_dir(kind: str, base: Path | None = None, latest: bool = True) -> Path:
    """This process's run folder ``results/<kind>/<timestamp>/``: made once (every cell of one
    nox run shares it), atomically, so a second process that starts in the same second gets
    ``<timestamp>-2`` instead of writing into the first one's. ``latest`` points
    ``results/<kind>/latest`` at it now (else ``point_latest`` does, once there is a result)."""
    parent = kind_dir(kind, base)
    if parent in _MADE:
        return _MADE[parent]
    parent.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        path = parent / (_STAMP if n == 1 else f"{_STAMP}-{n}")
        try:
            path.mkdir()
            break
        except FileExistsError:
            continue
    _MADE[parent] = path
    if latest:
        point_latest(path)
    return path


def point_latest(path: Path) -> None:
    """``<path>/../latest`` -> ``path``, replaced atomically."""
    path = Path(path)
    latest = path.parent / "latest"
    tmp = path.parent / f".latest.{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(path.name)
    os.replace(tmp, latest)


def forget(path: Path) -> None:
    """Remove a run folder this process made and left empty (a run refused before it wrote)."""
    path = Path(path)
    try:
        path.rmdir()
    except OSError:
        return
    for parent, made in list(_MADE.items()):
        if made == path:
            del _MADE[parent]


def this_run_dir(kind: str, base: Path | None = None) -> Path:
    """This process's ``results/<kind>/<timestamp>/`` (what ``run_dir`` makes), not made here."""
    parent = kind_dir(kind, base)
    return _MADE.get(parent, parent / _STAMP)


def latest_dir(kind: str, base: Path | None = None) -> Path:
    return kind_dir(kind, base) / "latest"


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


# what is read of a row of ``nox -s patches`` (validate_patches.validate), and its types: by
# FINDINGS.md and by the PR bundle, which quote these tables
PATCH_ROW = {"patch": str, "cell": str, "ok": bool, "applies": str, "before": str, "after": str,
             "after_detail": (str, type(None)), "upstream_tests": str}
PATCH_ROW_OPTIONAL = {"on_top_of": list, "series_still_fixed": dict}


def read_patch_summary(path: Path) -> list[dict]:
    """The rows of a ``summary.json`` of ``nox -s patches``; a BadInput when it is not one."""
    from tools.core.contract import BadInput

    def bad(why: str) -> BadInput:
        return BadInput(f"{path}: not a summary of `nox -s patches` ({why})")

    try:
        rows = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise bad(f"cannot read it: {err.strerror}") from None
    except UnicodeDecodeError:
        raise bad("not UTF-8") from None
    except json.JSONDecodeError as err:
        raise bad(f"not JSON: {err.msg} at line {err.lineno}") from None
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise bad("not a list of rows")
    for i, row in enumerate(rows, 1):
        wrong = [key for key, kind in PATCH_ROW.items() if key not in row or not isinstance(row[key], kind)]
        wrong += [key for key, kind in PATCH_ROW_OPTIONAL.items()
                  if key in row and not isinstance(row[key], kind)]
        if wrong:
            raise bad(f"row {i}: no valid {', '.join(sorted(wrong))}")
    return rows
