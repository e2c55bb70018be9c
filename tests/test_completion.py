"""A report's snippet completed into a program (tools/triage/complete.py), against the exports of the
release installed in the test environment (real pytorch_lightning and torch, read by running
its interpreter)."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tools.triage import complete as completion


@pytest.fixture(scope="module")
def api() -> dict[str, str]:
    found = completion.exports(sys.executable, "pytorch-lightning")
    assert found, "the release's exports could not be read"
    return found


def test_the_exports_come_from_the_release_itself(api):
    assert api["Trainer"] == "pytorch_lightning"
    assert api["BackboneFinetuning"] == "pytorch_lightning.callbacks"
    assert api["BoringModel"] == "pytorch_lightning.demos.boring_classes"
    assert api["DataLoader"] == "torch.utils.data"
    assert "NoSuchThing" not in api


def test_names_the_snippet_uses_are_imported_from_where_they_are_exported(api):
    code = ("trainer = Trainer(max_epochs=1, callbacks=[BackboneFinetuning(2), ModelCheckpoint()])\n"
            "x = nn.Linear(2, 2)\n")
    done = completion.complete(code, "pytorch-lightning", api)
    head = done.code.split("\n\n")[0].splitlines()
    assert head == ["from pytorch_lightning import Trainer", "from pytorch_lightning.callbacks import "
                    "BackboneFinetuning", "from pytorch_lightning.callbacks import ModelCheckpoint",
                    "from torch import nn"]
    assert done.code.endswith(code)  # the report's code itself unchanged, after the imports
    assert done.diff.startswith("--- reported.py\n+++ completed.py\n")
    assert done.missing == []


def test_a_model_it_never_makes_is_the_bug_report_model_and_the_completed_code_runs(api, tmp_path):
    code = ("# use any model\ntrainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1,\n"
            "                  logger=False, enable_checkpointing=False, enable_progress_bar=False)\n"
            "trainer.fit(model)\nprint('fitted', trainer.global_step)\n")
    done = completion.complete(code, "pytorch-lightning", api)
    assert "`model` is never made: the demos' BoringModel" in done.changes
    script = tmp_path / "completed.py"
    script.write_text(done.code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fitted 2" in proc.stdout


def test_a_module_it_defines_and_never_trains_gets_a_short_fit(api, tmp_path):
    code = ("class Net(LightningModule):\n    def __init__(self):\n        super().__init__()\n"
            "        self.layer = nn.Linear(32, 2)\n\n    def training_step(self, batch, batch_idx):\n"
            "        assert batch.shape[-1] == 32\n        return self.layer(batch).sum()\n\n"
            "    def configure_optimizers(self):\n"
            "        return torch.optim.SGD(self.parameters(), lr=0.1)\n")
    done = completion.complete(code, "pytorch-lightning", api)
    assert any(c.startswith("`Net` is defined and never trained") for c in done.changes), done.changes
    tree = ast.parse(done.code)
    assert any(isinstance(n, ast.If) for n in tree.body)  # the fit, under __main__
    script = tmp_path / "completed.py"
    script.write_text(done.code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_what_cannot_be_completed_is_said(api):
    code = ("class Net(LightningModule):\n    def __init__(self, width):\n        super().__init__()\n\n"
            "data = load_my_data('train.csv')\nframe = pandas_like.read_csv('labels.csv')\n")
    done = completion.complete(code, "pytorch-lightning", api)
    assert "`load_my_data` is used but defined nowhere in the report" in done.missing
    assert "`Net` needs arguments to be made; nothing trains it" in done.missing
    assert "it reads `labels.csv`, which the report does not include" in done.missing


@pytest.mark.parametrize("code, text, package", [
    ("import lightning as L\n", "", "lightning"),
    ("class M(L.LightningModule): pass\n", "", "lightning"),
    ("trainer = Trainer()\n", "I use `lightning.pytorch` 2.4", "lightning"),
    ("trainer = Trainer()\n", "pytorch_lightning 2.4", "pytorch-lightning"),
])
def test_the_package_a_snippet_uses(code, text, package):
    assert completion.guess_package(code, text) == package


def test_free_names_skip_what_the_code_binds_and_the_builtins():
    tree = ast.parse("import os\nfrom a import b as c\nx = 1\ndef f(y, *, z=2):\n    return x + y + z + w\n"
                     "for i in range(3):\n    print(i, c, os, undefined)\nclass K: pass\n"
                     "try:\n    pass\nexcept Exception as e:\n    print(e, K)\n")
    assert completion.free_names(tree) == ["w", "undefined"]


def test_torchs_everyday_lower_case_names_are_never_imported_for_the_snippets_own(api):
    code = "x = device\ny = seed\nprint(load(x), seed_everything)\n"
    done = completion.complete(code, "pytorch-lightning", api)
    assert "from pytorch_lightning import seed_everything" in done.code  # Lightning's own: imported
    assert not [w for w in ("import device", "import seed\n", "import load") if w in done.code]
    assert "`device` is used but defined nowhere in the report" in done.missing


def test_a_fit_of_a_module_with_no_data_gets_the_demos_data(api):
    code = ("class M(LightningModule):\n    def training_step(self, batch, batch_idx):\n"
            "        return batch.sum()\n\n\nmodel = M()\ntrainer = Trainer(max_epochs=1)\n"
            "trainer.fit(model)\n")
    done = completion.complete(code, "pytorch-lightning", api)
    fit = "trainer.fit(model, train_dataloaders=DataLoader(RandomDataset(32, 64), batch_size=2))"
    assert fit in done.code
    assert any(c.startswith("`fit` of `M`, which has no data of its own") for c in done.changes)
    with_data = code.replace("trainer.fit(model)", "trainer.fit(model, loader)")
    assert "RandomDataset" not in completion.complete(with_data, "pytorch-lightning", api).code
