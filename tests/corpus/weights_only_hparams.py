"""A model keeps a small settings object among its hyperparameters, saves a checkpoint and loads
it back with load_from_checkpoint.

Bad: loading fails with torch's "weights only" unpickling error.
"""

import pickle
import sys
import tempfile
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Settings:
    def __init__(self, width=4):
        self.width = width


class Regressor(pl.LightningModule):
    def __init__(self, settings=None):
        super().__init__()
        self.save_hyperparameters()
        self.lin = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    data = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = pl.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp)
        trainer.fit(Regressor(Settings()), data)
        path = Path(tmp) / "model.ckpt"
        trainer.save_checkpoint(path)
        try:
            again = Regressor.load_from_checkpoint(path)
        except pickle.UnpicklingError as exc:
            print(f"REGRESSION: the checkpoint no longer loads: {str(exc).splitlines()[0]}")
            sys.exit(1)
    print(f"loaded back, settings width {again.hparams.settings.width}")
