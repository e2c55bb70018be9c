"""A commit runs from its source under every Lightning import name (``tools/inject``).

A commit bisect runs each commit's ``src`` on the dependency set of a release environment,
which has that release's ``pytorch_lightning`` wheel installed: ``import pytorch_lightning`` must
still be the commit's code, and a commit whose ``lightning/__init__`` imports ``lightning.app``
(before 2.1) must import without the app's dependencies.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.stages import bisect_options, bisect_tiers, gitrange

REPO = os.environ.get("LIGHTNING_REPO")

PROBE = """
import lightning, lightning.pytorch as lp, lightning_fabric, pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback
from lightning.pytorch.callbacks import Callback as Same
import pytorch_lightning.trainer.trainer as module
print(pl is lp, Callback is Same, pl.__file__, getattr(pl, "MARK", None), lightning.__version__,
      lightning_fabric is lightning.fabric, hasattr(module, "__path__"), module.__spec__.name)
"""


def fake_src(root: Path, init: str = '__version__ = "9.8.7"\n') -> Path:
    src = root / "src"
    for pkg in ("lightning", "lightning/pytorch", "lightning/pytorch/callbacks",
                "lightning/pytorch/trainer", "lightning/fabric"):
        (src / pkg).mkdir(parents=True, exist_ok=True)
        (src / pkg / "__init__.py").write_text("")
    (src / "lightning" / "__init__.py").write_text(init)
    (src / "lightning" / "pytorch" / "__init__.py").write_text('MARK = "from the checkout"\n')
    (src / "lightning" / "pytorch" / "callbacks" / "__init__.py").write_text("class Callback: pass\n")
    (src / "lightning" / "pytorch" / "trainer" / "trainer.py").write_text("")
    (src / "version.info").write_text("9.8.7\n")
    (src / "pytorch_lightning").mkdir()  # the mirror's folder, as in the repository: no __init__
    return src


def probe(src: Path) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env={**os.environ, **bisect_tiers.source_env(src.parent)})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_every_import_name_is_the_checkouts_code_not_the_installed_wheel(tmp_path):
    import pytorch_lightning  # this environment has a wheel installed, as a release's has

    assert "site-packages" in pytorch_lightning.__file__
    src = fake_src(tmp_path)
    same, callback, file, *mark, version, fabric, path, name = probe(src)
    assert (same, callback, fabric) == ("True", "True", "True")
    assert file.startswith(str(src)) and " ".join(mark) == "from the checkout"
    assert path == "False" and name == "lightning.pytorch.trainer.trainer"  # a module stays one


def test_an_init_that_needs_lightning_app_is_not_run(tmp_path):
    src = fake_src(tmp_path, init="import lightning.app  # the app's dependencies\n")
    out = probe(src)
    assert out[0] == "True" and out[-4] == "9.8.7"  # the version its checkout declares


def test_without_a_checkout_nothing_changes(tmp_path):
    code = "import pytorch_lightning; print(pytorch_lightning.__file__)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(bisect_options.INJECT)})
    assert proc.returncode == 0 and "site-packages" in proc.stdout


@pytest.mark.skipif(not REPO, reason="set LIGHTNING_REPO to a Lightning git checkout")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("tag", ["2.0.9", "2.4.0"])
def test_a_real_release_tag_runs_from_source_under_both_names(tmp_path, tag):
    # 2.0.9's lightning/__init__ imports lightning.app; 2.4.0's does not. Each runs on its own
    # release's environment (as the bisect's commit tier does), whose installed wheel must not win
    python = bisect_tiers.release_env("pytorch-lightning", tag, "2.13.0")
    repo = gitrange.open_repo(REPO, tmp_path / "repos")  # as a commit bisect does
    wt = gitrange.Worktree.claim(repo, tmp_path / "worktrees" / "wt")
    wt.checkout(tag)
    code = ("import pytorch_lightning as pl, lightning.pytorch as lp, torch\n"
            "from pytorch_lightning.demos.boring_classes import BoringModel\n"
            "t = pl.Trainer(max_steps=2, logger=False, enable_checkpointing=False,\n"
            "               enable_progress_bar=False, enable_model_summary=False)\n"
            "t.fit(BoringModel())\n"
            "print(pl is lp, pl.__version__, pl.__file__, t.global_step)\n")
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          env={**os.environ, **bisect_tiers.source_env(wt.path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    same, version, file, steps = proc.stdout.split()[-4:]
    assert (same, version, steps) == ("True", tag, "2") and file.startswith(str(wt.path))
