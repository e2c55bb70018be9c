"""save_last=True should leave a real last.ckpt file next to the top-k checkpoints.

Bad: last.ckpt is a symbolic link to another checkpoint (which breaks copies and uploads).
"""

import os
import sys
import tempfile
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)
    with tempfile.TemporaryDirectory() as tmp:
        keep = ModelCheckpoint(dirpath=Path(tmp) / "ckpts", save_top_k=1, save_last=True)
        trainer = pl.Trainer(accelerator="cpu", max_epochs=2, logger=False, callbacks=[keep],
                             enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp)
        trainer.fit(Regressor(), data)
        last = Path(tmp) / "ckpts" / "last.ckpt"
        if last.is_symlink():
            print(f"REGRESSION: last.ckpt is a symbolic link to {os.readlink(last)}")
            sys.exit(1)
        if not last.is_file():
            print("no last.ckpt was written at all")
            sys.exit(125)
    print("last.ckpt is a file of its own")
