"""Two CPU ranks train with strategy="ddp". Lightning should not add a collective of its own to
every training step (each one is a blocking round trip between the ranks).

Bad: torch.distributed.broadcast is called on every training step.
"""

import sys

import pytorch_lightning as pl
import torch
import torch.distributed
from torch.utils.data import DataLoader, TensorDataset

calls = []
_broadcast = torch.distributed.broadcast


def counted_broadcast(*args, **kwargs):
    calls.append(1)
    return _broadcast(*args, **kwargs)


torch.distributed.broadcast = counted_broadcast  # in every rank: each runs this file

STEPS = 6


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
    data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=STEPS, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Regressor(), data)
    if trainer.global_rank == 0:
        if len(calls) >= STEPS:
            print(f"REGRESSION: torch.distributed.broadcast was called {len(calls)} times in "
                  f"{STEPS} training steps")
            sys.exit(1)
        print(f"{len(calls)} broadcasts in {STEPS} training steps")
