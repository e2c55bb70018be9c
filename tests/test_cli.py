"""The command-line surface, as cargo-bisect-rustc's ``tests/cmd`` snapshots it: each program's
``--help`` and its one-line errors for bad input, compared with the expectations checked in under
``tests/cli/`` (one TOML file per case: ``module``, ``args``, ``status``, ``stdout``, ``stderr``).
An accidental change of an option, a message or an exit code fails here.

After an intended change: ``UPDATE_CLI=1 nox -s tests -- tests/test_cli.py`` rewrites the
expectations; review them with ``git diff tests/cli``.
"""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CASES = sorted((ROOT / "tests" / "cli").glob("*.toml"))


def run(case: dict) -> dict:
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}  # argparse wraps help to COLUMNS
    proc = subprocess.run([sys.executable, "-m", case["module"], *case["args"]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    return {"status": proc.returncode, "stdout": proc.stdout.replace(str(ROOT), "[ROOT]"),
            "stderr": proc.stderr.replace(str(ROOT), "[ROOT]")}


def toml_string(text: str) -> str:
    return '"""\n' + text.replace("\\", "\\\\").replace('"""', '\\"""') + '"""'


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_the_command_line_is_what_it_was(path):
    case = tomllib.loads(path.read_text())
    got = run(case)
    if os.environ.get("UPDATE_CLI"):
        path.write_text(f"module = {json.dumps(case['module'])}\nargs = {json.dumps(case['args'])}\n"
                        f"status = {got['status']}\nstdout = {toml_string(got['stdout'])}\n"
                        f"stderr = {toml_string(got['stderr'])}\n")
        return
    assert (got["status"], got["stdout"], got["stderr"]) == (case["status"], case["stdout"], case["stderr"])


def test_every_program_has_its_help_snapshotted():
    helped = {tomllib.loads(p.read_text())["module"] for p in CASES if p.stem.endswith("-help")}
    assert helped >= {"tools.bisect_cli", "tools.minimize", "tools.validate_patches", "tools.pr_bundle",
                      "tools.findings", "tools.fingerprint", "tools.run", "tools.nodes", "tools.triage"}


@pytest.mark.parametrize("session", ["bisect", "triage", "repro", "minimize", "patches", "fingerprint", "pr",
                                     "findings", "summary", "repro_slurm"])
def test_a_sessions_help_comes_before_anything_is_installed(tmp_path, session):
    """`nox -s X -- --help` prints the program's help, and the session's environment (made in a
    folder of the test's own) holds nothing but what a new environment has: no torch, no git."""
    env = {**os.environ, "COLUMNS": "100"}
    proc = subprocess.run([sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "--envdir",
                           str(tmp_path), "-s", session, "--", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"usage: nox -s {session} --" in proc.stdout, proc.stdout[-2000:]
    installed = {p.name.split("-")[0].lower() for p in tmp_path.glob("*/lib/python*/site-packages/*")}
    assert not installed & {"torch", "git", "gitpython", "pytorch_lightning", "packaging"}, installed


def test_a_session_without_options_refuses_one_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "--envdir",
                           str(tmp_path), "-s", "summary", "--", "--cell", "x"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "unrecognized arguments: --cell x" in proc.stderr


def test_nox_list_selects_the_cells_that_run_and_marks_the_others_skipped():
    """`nox -l`: `*` (what plain `nox` runs) on the cells inside their release's supported torch
    range, `-` on those that `nox -s repro` would skip."""
    from tools.environments import matrix

    proc = subprocess.run([sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-l"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    marks = {m.group(2): m.group(1) for m in re.finditer(r"(?m)^([*-]) repro\(([^)]+)\)", proc.stdout)}
    cells = matrix.load().cells
    assert marks == {c.id: "-" if c.skip_reason() else "*" for c in cells}
    assert set(marks.values()) == {"*", "-"}


def test_repro_cell_skips_the_other_cells_before_installing_them(tmp_path):
    """`nox -s repro -- --cell NAME` (the name every session gives a cell) runs that cell alone:
    another cell ends as skipped with nothing installed in its environment."""
    proc = subprocess.run([sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "--envdir",
                           str(tmp_path), "-s", "repro", "-k", "pl2_4_0_torch2_4_1", "--", "--cell",
                           "pl2_6_6_torch2_13_0"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "skipped: not --cell pl2_6_6_torch2_13_0" in proc.stderr, proc.stderr[-2000:]
    installed = {p.name.split("-")[0].lower() for p in tmp_path.glob("*/lib/python*/site-packages/*")}
    assert not installed & {"torch", "pytorch_lightning"}, installed


@pytest.mark.parametrize("module", ["stages.bisect_options", "minimize.options", "triage", "validate_patches",
                                    "fingerprint", "stages.cells"])
def test_every_option_has_a_help_text(module):
    import importlib

    parser = importlib.import_module(f"tools.{module}").parser()
    bare = [a.option_strings or a.dest for a in parser._actions if not a.help]
    assert not bare, f"options without a help text: {bare}"
