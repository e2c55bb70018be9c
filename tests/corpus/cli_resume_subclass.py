"""LightningCLI in subclass mode: train a subclass of the base model, then predict with
--ckpt_path pointing at the checkpoint that training wrote.

Bad: the CLI cannot read the checkpoint's hyperparameters back and exits with a parser error.
"""

import sys
import tempfile
from pathlib import Path

import torch
from pytorch_lightning.cli import LightningCLI
from pytorch_lightning.demos.boring_classes import BoringModel


class Base(BoringModel):
    def __init__(self, width: int = 32):
        super().__init__()
        self.save_hyperparameters()


class Wider(Base):
    def __init__(self, scale: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = scale


def cli(*args):
    return LightningCLI(Base, subclass_mode_model=True, save_config_callback=None,
                        args=[*args, "--model=__main__.Wider", "--trainer.accelerator=cpu",
                              "--trainer.logger=false", "--trainer.enable_progress_bar=false",
                              "--trainer.enable_model_summary=false"])


if __name__ == "__main__":
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        cli("fit", f"--trainer.default_root_dir={tmp}", "--trainer.max_steps=2",
            "--trainer.limit_val_batches=0")
        ckpt = next(Path(tmp).rglob("*.ckpt"))
        try:
            cli("predict", f"--ckpt_path={ckpt}", "--trainer.limit_predict_batches=1")
        except SystemExit as exc:
            print(f"REGRESSION: predict with --ckpt_path exited with {exc.code}: the checkpoint's "
                  "hyperparameters were not accepted")
            sys.exit(1)
    print("predicted from the checkpoint with the subclass")
