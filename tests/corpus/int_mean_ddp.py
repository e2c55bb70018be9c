"""Two CPU ranks (gloo) average an integer tensor through the strategy: rank 0 holds 1, rank 1
holds 2, so their mean is 1.5.

Bad: the mean comes back truncated to a whole number.
"""

import sys

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Probe(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.mean = None

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)

    def on_validation_end(self):
        mine = torch.tensor(self.global_rank + 1)  # an integer tensor
        self.mean = float(self.trainer.strategy.reduce(mine, reduce_op="mean"))


if __name__ == "__main__":
    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False,
                         enable_progress_bar=False, enable_model_summary=False)
    probe = Probe()
    trainer.validate(probe, data)
    if trainer.global_rank == 0:
        if probe.mean != 1.5:
            print(f"REGRESSION: the mean of 1 and 2 across the ranks came back as {probe.mean}")
            sys.exit(1)
        print("the mean of 1 and 2 across the ranks is 1.5")
