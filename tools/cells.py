"""One cell of the repro matrix: run every repro through the harness and record the results."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path

from tools import envs, harness, index, results
from tools.matrix import ROOT, Cell, Matrix, Repro

_DONE: list[float] = []  # seconds of each cell run by this process, for the ETA
_START = time.monotonic()


def parse_posargs(posargs: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split ``nox -s repro -- ...`` into the workspace's own flags and the repros' options."""
    p = argparse.ArgumentParser(prog="nox -s repro --", add_help=False)
    p.add_argument("--include-unsupported", action="store_true",
                   help="also run cells outside a release's declared torch range")
    p.add_argument("--timeout", type=float, default=300.0, help="wall-clock limit per repro run")
    p.add_argument("--script", help="also run this user script (any repro following the exit codes)")
    p.add_argument("--signature", help="regex the --script output must show to count as bad")
    return p.parse_known_args(posargs)


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def runnable(matrix: Matrix, include_unsupported: bool) -> list[Cell]:
    return [c for c in matrix.cells if not c.skip_reason(include_unsupported)]


def is_last(cell: Cell, matrix: Matrix, include_unsupported: bool) -> bool:
    """Is this the matrix's last cell to run (the one that prints the summary table)?"""
    return runnable(matrix, include_unsupported)[-1:] == [cell]


def progress(cell: Cell, matrix: Matrix, include_unsupported: bool) -> str:
    runnable_cells = runnable(matrix, include_unsupported)
    position = next((i for i, c in enumerate(runnable_cells, 1) if c.id == cell.id), 0)
    line = f"cell {position}/{len(runnable_cells)} {cell.id}, elapsed {_clock(time.monotonic() - _START)}"
    if _DONE:
        line += f", ETA ~{_clock(sum(_DONE) / len(_DONE) * (len(runnable_cells) - position + 1))}"
    return line


def _cell_json(cell: Cell) -> dict:
    return {**asdict(cell), "id": cell.id}


def install(session, cell: Cell, out: Path) -> None:
    """Install the cell's era-correct environment, or record why it could not be made and stop."""
    try:
        args = envs.install_args(cell.package, cell.lightning, cell.torch)
    except (index.UnknownRelease, envs.EnvError) as err:
        record_skip(cell, f"environment: {err}", out)
        session.error(str(err))
    try:
        session.install(*args, env=envs.COMPILED)
    except Exception:
        record_skip(cell, "environment: uv could not install it (see the session log)", out)
        raise


def record_skip(cell: Cell, reason: str, out: Path) -> None:
    results.write_json(out / "cells" / f"{cell.id}.json", {"cell": _cell_json(cell), "skipped": reason})


def repros_of(matrix: Matrix, script: str | None) -> list[Repro]:
    extra = [Repro(f"script:{Path(script).name}", str(Path(script).resolve()), passthrough=True)
             ] if script else []
    return [*matrix.repros, *extra]


def run_cell(cell: Cell, matrix: Matrix, python: str, out: Path, repro_args: list[str],
             timeout: float, log=print, script: str | None = None, signature: str | None = None) -> dict:
    started = time.monotonic()
    outcome: dict = {"cell": _cell_json(cell), "results": {}, "repro_args": repro_args}
    logs = out / "logs" / cell.id
    for repro in repros_of(matrix, script):
        own = not repro.name.startswith("script:")
        args = [a.replace("{out}", str(logs)) for a in repro.args]
        cmd = [python, str(ROOT / repro.script), *args, *(repro_args if repro.passthrough else [])]
        res = harness.run(cmd, timeout=timeout, log_stem=logs / repro.name,
                          require_record=own, signature=None if own else signature)
        outcome["results"][repro.name] = res.to_dict()
        versions = (res.record or {}).get("versions") or {}
        outcome.setdefault("torch_installed", versions.get("torch"))
        outcome.setdefault("lightning_installed", versions.get("lightning"))
        flag = "" if repro.expect in (None, res.verdict) else f"  (expected {repro.expect})"
        log(f"  {repro.name}: {results.cell_text(res.to_dict())} [{res.seconds:.1f} s]{flag}")
    outcome["seconds"] = round(time.monotonic() - started, 1)
    _DONE.append(outcome["seconds"])
    results.write_json(out / "cells" / f"{cell.id}.json", outcome)
    write_summary(out, matrix, script)
    return outcome


def write_summary(out: Path, matrix: Matrix, script: str | None = None) -> str:
    cells = results.load_cells(out)
    table = results.summary_markdown(cells, [r.name for r in repros_of(matrix, script)])
    results.write_atomic(out / "summary.md", table)
    results.write_json(out / "summary.json", cells)
    return table
