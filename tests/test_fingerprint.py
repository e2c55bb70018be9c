"""Traceback fingerprinting: lossy pastes, ranking, git tags, and real release wheels."""

import tomllib
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
    code = fingerprint.main([str(RECORDED), "--oldest", "2.4.0", "--torch-oldest", "2.5.0"])
    out = capsys.readouterr().out
    assert code == 0
    assert "pytorch-lightning: 2.5.0, 2.5.0.post0\n" in out
    assert "torch: 2.6.0\n" in out


# -- lossy pastes (no network) ------------------------------------------------------------

FIXTURES = Path(__file__).parent / "fixtures" / "tracebacks"
CORPUS = FIXTURES / "corpus"


def frames_of(text: str) -> list[tuple]:
    return [(f.package, f.rel, f.line, f.code) for f in fingerprint.parse(text)]


def test_a_file_line_without_its_code_is_unknown_and_never_eats_the_next_frame():
    text = '''Traceback (most recent call last):
  File "/x/site-packages/pytorch_lightning/trainer/trainer.py", line 10, in fit
  File "/x/site-packages/pytorch_lightning/trainer/call.py", line 20, in _call
    return trainer_fn(*args, **kwargs)
  File "/x/site-packages/torch/nn/modules/module.py", line 30, in _call_impl
RuntimeError: boom
'''
    assert frames_of(text) == [
        ("lightning", "trainer/trainer.py", 10, None),
        ("lightning", "trainer/call.py", 20, "return trainer_fn(*args, **kwargs)"),
        ("torch", "nn/modules/module.py", 30, None),  # the exception line is not its code
    ]


def test_code_lines_without_their_file_line_are_not_placed():
    text = '''  File "/x/site-packages/pytorch_lightning/core/module.py", line 3, in f
    a = 1
    orphan_code_of_a_dropped_frame()
  File "/x/site-packages/pytorch_lightning/core/module.py", line 9, in g
    b = 2
'''
    frames = fingerprint.parse(text)
    assert [(f.line, f.code) for f in frames] == [(3, "a = 1"), (9, "b = 2")]
    assert not any("orphan" in r for f in frames for r in f.readings)


def test_rank_prefixes_and_their_log_lines_are_dropped():
    text = '''[rank0]:[W1202 10:11:12.000000000 ProcessGroupNCCL.cpp:1250] Warning: WorkNCCL timed out
[rank0]: Traceback (most recent call last):
[rank0]:   File "/x/dist-packages/lightning/pytorch/strategies/ddp.py", line 5, in setup
[rank0]:     self.model = DistributedDataParallel(model)
[rank0]:                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
[rank0]: RuntimeError: boom
'''
    assert frames_of(text) == [("lightning", "strategies/ddp.py", 5,
                                "self.model = DistributedDataParallel(model)")]


def test_interleaved_ranks_are_read_apart_and_a_frame_of_both_counts_once():
    text = '''[rank0]:   File "/x/site-packages/pytorch_lightning/trainer/call.py", line 44, in _call
[rank1]:   File "/x/site-packages/pytorch_lightning/trainer/call.py", line 44, in _call
[rank1]:     return trainer_fn(*args, **kwargs)
[rank0]:     return trainer_fn(*args, **kwargs)
[rank1]:   File "/x/site-packages/pytorch_lightning/strategies/ddp.py", line 7, in barrier
[rank0]:   File "/x/site-packages/pytorch_lightning/loops/fit_loop.py", line 8, in run
[rank1]:     torch.distributed.barrier()
[rank0]:     self.advance()
'''
    assert frames_of(text) == [
        ("lightning", "trainer/call.py", 44, "return trainer_fn(*args, **kwargs)"),
        ("lightning", "strategies/ddp.py", 7, "torch.distributed.barrier()"),
        ("lightning", "loops/fit_loop.py", 8, "self.advance()"),
    ]


def test_ranks_interleaved_without_prefixes_as_pasted_in_an_issue():
    # issue 4420: the second rank's traceback starts between a File line and its code line
    frames = frames_of((FIXTURES / "interleaved_ranks_4420.txt").read_text())
    assert frames == [
        ("lightning", "trainer/trainer.py", 440, None),
        ("lightning", "accelerators/ddp_accelerator.py", 138,
         "results = self.ddp_train(process_idx=self.task_idx, model=model)"),
        ("lightning", "accelerators/ddp_accelerator.py", 231, None),  # the paste is cut there
    ]


def test_a_paste_that_lost_its_indentation():
    text = '''File "/x/site-packages/pytorch_lightning/core/module.py", line 3, in f
a = 1
File "/x/site-packages/pytorch_lightning/core/module.py", line 9, in g
ValueError: boom
'''
    assert frames_of(text) == [("lightning", "core/module.py", 3, "a = 1"),
                               ("lightning", "core/module.py", 9, None)]


def test_wrapped_file_lines_are_joined():
    text = '''  File "/home/u/.local/share/virtualenvs/env-iDRRdFSW/lib/python3.8/site-
packages/pytorch_lightning/trainer/trainer.py", line 499, in fit
    self.dispatch()
  File "/x/site-packages/pytorch_lightning/trainer/trainer.py", line 5
46, in dispatch
    self.accelerator.start_training(self)
'''
    assert frames_of(text) == [
        ("lightning", "trainer/trainer.py", 499, "self.dispatch()"),
        ("lightning", "trainer/trainer.py", 546, "self.accelerator.start_training(self)"),
    ]


def test_a_wrapped_code_line_matches_when_joined():
    text = '''  File "/x/site-packages/pytorch_lightning/trainer/trainer.py", line 2, in fit
    self._call_and_handle_interrupt(self._fit_impl, model, train_dataloaders, val_dat
aloaders)
'''
    frame, = fingerprint.parse(text)
    source = "def fit():\n    self._call_and_handle_interrupt(self._fit_impl, model, train_dataloaders, " \
             "val_dataloaders)\n"
    assert frame.code.endswith("val_dat") and fingerprint.matches(source, frame)


def test_ansi_colours_and_markdown_quotes_are_dropped():
    text = ('> \x1b[35m  File \x1b[0m"\x1b[35m/x/site-packages/pytorch_lightning/core/module.py\x1b[0m", '
            'line \x1b[35m3\x1b[0m, in \x1b[35mf\x1b[0m\n>     \x1b[31ma = 1\x1b[0m\n')
    assert frames_of(text) == [("lightning", "core/module.py", 3, "a = 1")]


def test_windows_conda_and_dist_packages_paths():
    text = r'''  File "C:\\Users\\me\\x\\site-packages\\lightning\\pytorch\\trainer\\call.py", line 4, in f
    a = 1
  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/distributed_c10d.py", line 5, in g
    b = 2
  File "/opt/conda/envs/pl/lib/python3.9/site-packages/pytorch_lightning/loops/loop.py", line 6, in h
    c = 3
  File "/home/me/pytorch_lightning/src/pytorch_lightning/core/hooks.py", line 7, in i
    d = 4
'''
    assert [(f.package, f.rel) for f in fingerprint.parse(text)] == [
        ("lightning", "trainer/call.py"), ("torch", "distributed/distributed_c10d.py"),
        ("lightning", "loops/loop.py"), ("lightning", "core/hooks.py")]
    windows = fingerprint.parse((FIXTURES / "windows_19862.txt").read_text())  # issue 19862
    assert [f.rel for f in windows][:3] == ["trainer/trainer.py", "trainer/call.py", "trainer/trainer.py"]


def test_fabric_frames_belong_to_the_lightning_release(tmp_path):
    text = '''  File "/x/site-packages/lightning_fabric/strategies/ddp.py", line 1, in a
    x = 1
  File "/x/site-packages/lightning/fabric/wrappers.py", line 2, in b
    y = 2
  File "/x/site-packages/lightning_lite/lite.py", line 1, in c
    z = 3
'''
    frames = fingerprint.parse(text)
    assert [(f.package, f.rel) for f in frames] == [
        ("fabric", "strategies/ddp.py"), ("fabric", "wrappers.py"), ("lite", "lite.py")]
    # a checkout tag holds them under src/lightning/fabric (new layout) or src/lightning_fabric
    repo = git.Repo.init(tmp_path)
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    for path, body in (("src/lightning_fabric/strategies/ddp.py", "x = 1\n"),
                       ("src/lightning/fabric/wrappers.py", "\ny = 2\n"),
                       ("src/lightning_lite/lite.py", "z = 3\n")):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(body)
        repo.index.add([path])
    repo.index.commit("1.9.0")
    repo.create_tag("1.9.0")
    assert fingerprint.fingerprint(frames, "pytorch-lightning", [Version("1.9.0")],
                                   lambda v: fingerprint.GitSources(repo, str(v)),
                                   log=lambda m: None) == ["1.9.0"]


def test_chained_exceptions_and_repeated_frames_count_once():
    text = '''Traceback (most recent call last):
  File "/x/site-packages/pytorch_lightning/trainer/call.py", line 44, in _call
    return trainer_fn(*args, **kwargs)
KeyboardInterrupt

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/x/site-packages/pytorch_lightning/trainer/call.py", line 44, in _call
    return trainer_fn(*args, **kwargs)
  File "/x/site-packages/pytorch_lightning/trainer/call.py", line 68, in _call
During handling of the above exception, another exception occurred:
'''
    assert frames_of(text) == [
        ("lightning", "trainer/call.py", 44, "return trainer_fn(*args, **kwargs)"),
        ("lightning", "trainer/call.py", 68, None),
    ]


def test_ipython_tracebacks_from_issues():
    # issue 10726 (old IPython: "path in f" then "---> N code"), 11067 (IPython 8: "File path:N, in f")
    old = frames_of((CORPUS / "pl1_4_10726_kaggle_ipython.txt").read_text())
    assert old == [("lightning", "__init__.py", 21,
                    "from pytorch_lightning.callbacks import Callback  # noqa: E402"),
                   ("lightning", "callbacks/__init__.py", 24,
                    "from pytorch_lightning.callbacks.pruning import ModelPruning")]
    new = frames_of((CORPUS / "pl1_5_9_11067_jupyter.txt").read_text())
    assert new[1] == ("lightning", "trainer/trainer.py", 1289, "return self._run_train()")  # "-> 1289"
    assert new[-1] == ("lightning", "loops/fit_loop.py", 234, None)  # header cut by the excerpt


# -- ranking (no network) -----------------------------------------------------------------

class Sources:
    """A fake release: the text of each of its files."""

    def __init__(self, files: dict[str, str]):
        self.files = files

    def read(self, package, rel):
        return self.files.get(rel)


def test_releases_are_ranked_by_frames_matched_when_none_matches_all():
    text = '''  File "/x/site-packages/pytorch_lightning/a.py", line 1, in f
    a = 1
  File "/x/site-packages/pytorch_lightning/b.py", line 1, in g
    b = 1
  File "/x/site-packages/pytorch_lightning/c.py", line 1, in h
    c = 1
  File "/x/site-packages/pytorch_lightning/d.py", line 1, in lost
'''
    frames = fingerprint.parse(text)
    releases = {"1.0.0": {"a.py": "a = 1", "b.py": "b = 1", "c.py": "c = 2"},
                "1.1.0": {"a.py": "a = 1", "b.py": "b = 2", "c.py": "c = 1"},
                "1.2.0": {"a.py": "a = 1"},
                "1.3.0": {}}
    total, ranking = fingerprint.rank(frames, [Version(v) for v in releases],
                                      lambda v: Sources(releases[str(v)]), log=lambda m: None)
    assert total == 3  # d.py:1 lost its code: it cannot tell releases apart
    assert ranking == [(2, ["1.0.0", "1.1.0"]), (1, ["1.2.0"]), (0, ["1.3.0"])]
    assert fingerprint.best(total, ranking) == ["1.0.0", "1.1.0"]
    assert fingerprint.answer("pytorch-lightning", total, ranking) == (
        "pytorch-lightning: no release matches every quoted line; most frames matched: "
        "2/3 frames: 1.0.0, 1.1.0; 1/3 frames: 1.2.0")
    # when some release matches every frame, that is the answer
    releases["1.3.0"] = {"a.py": "a = 1", "b.py": "b = 1", "c.py": "c = 1"}
    total, ranking = fingerprint.rank(frames, [Version(v) for v in releases],
                                      lambda v: Sources(releases[str(v)]), log=lambda m: None)
    assert fingerprint.answer("pytorch-lightning", total, ranking) == "pytorch-lightning: 1.3.0"


# -- inputs are checked before any network work (no network) -----------------------------

@pytest.fixture
def offline(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the package index was asked before the inputs were checked")

    monkeypatch.setattr(fingerprint.index, "releases", refuse)
    monkeypatch.setattr(fingerprint.index, "_project_json", refuse)


def one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ") and captured.err.count("\n") == 1
    return captured.err


def test_a_binary_file_is_a_one_line_error(tmp_path, capsys, offline):
    path = tmp_path / "t.bin"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    assert fingerprint.main([str(path)]) == 2
    assert "NUL bytes" in one_line_error(capsys)
    path.write_bytes(bytes(range(128, 256)) * 4)  # no NUL, but not text either
    assert fingerprint.main([str(path)]) == 2
    assert "not UTF-8 text" in one_line_error(capsys)


def test_a_file_that_is_mostly_text_is_read_with_replacements(tmp_path, capsys, offline):
    path = tmp_path / "t.txt"
    path.write_bytes("no frames here, caf\xe9\n".encode("latin-1"))
    assert fingerprint.main([str(path)]) == 2
    assert "no Lightning or torch frame" in one_line_error(capsys)
    assert fingerprint.decode("  File \"x\", line 1\n".encode("utf-16")) == '  File "x", line 1\n'


def test_bad_options_are_one_line_errors_before_any_network(tmp_path, capsys, offline):
    path = tmp_path / "t.txt"
    path.write_text(SAMPLE)
    assert fingerprint.main([str(path), "--oldest", "notaversion"]) == 2
    assert "--oldest 'notaversion' is not a version" in one_line_error(capsys)
    assert fingerprint.main([str(path), "--torch-oldest", "x.y"]) == 2
    one_line_error(capsys)
    assert fingerprint.main([str(path), "--package", "nosuch"]) == 2
    assert "--package 'nosuch' is not one of" in one_line_error(capsys)
    assert fingerprint.main([str(path), "--repo", str(tmp_path / "nothere")]) == 2
    assert "is not a git repository" in one_line_error(capsys)


# -- real pastes from issues against real wheels (network: the package index) -------------

def corpus() -> list[dict]:
    return tomllib.loads((CORPUS / "index.toml").read_text())["traceback"]


def stated_among(stated: list[str], releases: list[str]) -> bool:
    """Is a release the reporter names (one release, or a "1.4" series) among ``releases``?"""
    found = {Version(r) for r in releases}
    for s in stated:
        if s.count(".") == 1:
            if any(v.release[:2] == Version(s).release for v in found):
                return True
        elif Version(s) in found:
            return True
    return False


@pytest.mark.timeout(600)
@pytest.mark.parametrize("entry", corpus(), ids=lambda e: e["file"].removesuffix(".txt"))
def test_issue_traceback_names_the_reporters_release(entry):
    text = (CORPUS / entry["file"]).read_text()
    package = entry.get("package") or fingerprint.guess_package(text)
    frames = [f for f in fingerprint.parse(text) if f.package in fingerprint.PACKAGES[package]]
    versions = [v for v in fingerprint.index.releases(package)
                if v >= Version("1.0.0") and not v.is_prerelease]
    total, ranking = fingerprint.rank(frames, versions, lambda v: fingerprint.WheelSources(package, v),
                                      log=lambda m: None)
    assert total > 0
    best = fingerprint.best(total, ranking)
    assert stated_among(entry["stated"], best), fingerprint.answer(package, total, ranking)
