"""Validation with a hand-written batch sampler: any iterable of index lists is a valid
batch_sampler for a DataLoader, it does not have to wrap a sampler.

Bad: Lightning reaches for a `.sampler` attribute the batch sampler does not have.
"""

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Pairs:
    """Yields the indices two by two."""

    def __init__(self, size):
        self.size = size

    def __iter__(self):
        return iter([[i, i + 1] for i in range(0, self.size, 2)])

    def __len__(self):
        return self.size // 2


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.lin(x), y))


if __name__ == "__main__":
    data = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.validate(Regressor(), DataLoader(data, batch_sampler=Pairs(len(data))))
    print("validated with a batch sampler of my own")
