"""Traceback fingerprinting: frames, line matching, git tags, and real release wheels."""

from pathlib import Path

import git
import pytest
from packaging.version import Version

from tools import fingerprint

RECORDED = Path(__file__).parent / "fixtures" / "tracebacks" / "pl2_5_0_post0_torch2_6_0_second_fit.txt"

SAMPLE = '''[rank13]: Traceback (most recent call last):
[rank13]:   File "/x/site-packages/pytorch_lightning/strategies/ddp.py", line 12, in backward
[rank13]:     return self.thing(x)
[rank13]:            ^^^^^^^^^^^^^
  File "/x/site-packages/lightning/pytorch/core/module.py", line 3, in f
    a = 1
  File "/x/site-packages/torch/nn/parallel/distributed.py", line 260, in backward
    reducer = ddp_weakref.reducer
  File "/x/site-packages/hydra/main.py", line 94, in decorated_main
    _run_hydra(
AttributeError: 'NoneType' object has no attribute 'reducer'
'''


def test_frames_of_lightning_and_torch_are_parsed_with_their_code():
    frames = fingerprint.parse(SAMPLE)
    assert [(f.package, f.rel, f.line, f.code) for f in frames] == [
        ("lightning", "strategies/ddp.py", 12, "return self.thing(x)"),
        ("lightning", "core/module.py", 3, "a = 1"),
        ("torch", "nn/parallel/distributed.py", 260, "reducer = ddp_weakref.reducer"),
    ]


def test_a_release_matches_only_when_every_line_does(tmp_path):
    repo = git.Repo.init(tmp_path)
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    src = tmp_path / "src" / "lightning" / "pytorch" / "core"
    src.mkdir(parents=True)
    for version, body in (("1.0.0", "x\ny\na = 1\n"), ("1.1.0", "x\na = 1\ny\n")):
        (src / "module.py").write_text(body)
        repo.index.add(["src/lightning/pytorch/core/module.py"])
        repo.index.commit(version)
        repo.create_tag(version)
    frames = [f for f in fingerprint.parse(SAMPLE) if f.rel == "core/module.py"]
    hits = fingerprint.fingerprint(frames, "lightning", [Version("1.0.0"), Version("1.1.0")],
                                   lambda v: fingerprint.GitSources(repo, str(v)), log=lambda m: None)
    assert hits == ["1.0.0"]


def test_unreadable_or_empty_input_is_exit_2(tmp_path, capsys):
    assert fingerprint.main([str(tmp_path / "missing.txt")]) == 2
    (tmp_path / "t.txt").write_text("no frames here")
    assert fingerprint.main([str(tmp_path / "t.txt")]) == 2
    assert "no Lightning or torch frame" in capsys.readouterr().err


@pytest.mark.timeout(600)
def test_recorded_traceback_names_its_releases_from_real_wheels(capsys):
    # recorded by the stress test in the pytorch-lightning 2.5.0.post0 x torch 2.6.0 cell
    code = fingerprint.main([str(RECORDED), "--since", "2.4.0", "--torch-since", "2.5.0"])
    out = capsys.readouterr().out
    assert code == 0
    assert "pytorch-lightning: 2.5.0, 2.5.0.post0\n" in out
    assert "torch: 2.6.0\n" in out
