import pytest

from tools.environments import matrix
from tools.environments.matrix import ROOT
from tools.stages import cells


def write(tmp_path, text):
    path = tmp_path / "m.toml"
    path.write_text(text)
    return path


MINI = """
torch = ["2.4.1", "2.6.0"]
[lightning]
pytorch-lightning = ["2.4.0"]
[supported_torch]
"2.4.0" = ">=2.1.0,<2.5.0"
[[include]]
package = "lightning"
lightning = "2.6.6"
torch = "2.13.0"
reason = "why not"
[[repro]]
name = "a"
script = "repro/a.py"
args = ["--x"]
"""


def test_cells_are_the_product_plus_includes_with_k_friendly_ids(tmp_path):
    m = matrix.load(write(tmp_path, MINI))
    assert [c.id for c in m.cells] == ["pl2_4_0_torch2_4_1", "pl2_4_0_torch2_6_0",
                                       "lightning2_6_6_torch2_13_0"]
    assert all("." not in c.id for c in m.cells)
    assert m.repros[0].args == ("--x",)


def test_cells_outside_the_declared_range_skip_with_the_reason(tmp_path):
    inside, outside, included = matrix.load(write(tmp_path, MINI)).cells
    assert inside.skip_reason() is None
    assert "outside pytorch-lightning 2.4.0's declared range >=2.1.0,<2.5.0" in outside.skip_reason()
    assert outside.skip_reason(include_unsupported=True) is None
    assert included.declared is None and included.skip_reason() is None


def test_unknown_package_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown package 'torchvision'"):
        matrix.load(write(tmp_path, 'torch = ["2.0.0"]\n[lightning]\ntorchvision = ["1"]\n'))


def test_default_matrix_covers_the_reported_versions():
    ids = {c.id for c in matrix.load().cells if not c.skip_reason()}
    assert {"pl2_4_0_torch2_4_1", "pl2_5_0_post0_torch2_6_0", "pl2_6_6_torch2_13_0"} <= ids


def test_posargs_split_own_flags_from_repro_options():
    opts, rest = cells.parse_posargs(["--include-unsupported", "--strategy", "ddp_spawn",
                                      "--timeout", "50"])
    assert opts.include_unsupported and opts.timeout == 50
    assert rest == ["--strategy", "ddp_spawn"]


def test_every_cell_id_given_to_k_selects_that_cell_and_no_other(root):
    # `nox -s repro -k <id as nox -l prints it>`: the first thing a user tries
    import subprocess
    import sys

    ids = [c.id for c in matrix.load().cells]
    for cell_id in ids:
        out = subprocess.run([sys.executable, "-m", "nox", "-f", str(root / "noxfile.py"), "-l",
                              "-s", "repro", "-k", cell_id], capture_output=True, text=True,
                             check=True).stdout
        selected = [line.split("(", 1)[1].split(")", 1)[0] for line in out.splitlines()
                    if line.startswith("* repro(")]
        assert selected == [cell_id]


@pytest.mark.parametrize("args, message", [
    (["--timeout", "-5"], "must be a number of seconds > 0, not -5"),
    (["--timeout", "0"], "must be a number of seconds > 0, not 0"),
    (["--timeout", "soon"], "'soon' is not a number of seconds"),
    (["--cell", "pl9_9_9_torch9_9_9"], "--cell pl9_9_9_torch9_9_9: no such cell"),
    (["--script", "README.md", "--signature", "x"], "cannot tell how to run it (not a .py file, no #! line)"),
    (["--script", "tests/fixtures/not_executable.sh", "--signature", "x"], "is not executable (chmod +x)"),
])
def test_nonsense_repro_options_are_refused_before_any_cell_runs(args, message, capsys, monkeypatch):
    # `nox -s repro -- --timeout -5` once ran every repro into an instant "timeout"
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exc:
        cells.parse_posargs(args)
    assert exc.value.code == 2 and message in capsys.readouterr().err
