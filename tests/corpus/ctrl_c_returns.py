"""A user presses Ctrl-C during fit() and expects training to stop and the script to go on.

Bad: fit() ends the whole program instead of returning.
"""

import os
import signal
import sys

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C in the terminal sends
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    data = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    try:
        trainer.fit(Regressor(), data)
    except SystemExit as exc:
        print(f"REGRESSION: Ctrl-C inside fit() ended the program (SystemExit {exc.code})")
        sys.exit(1)
    print(f"fit() returned after Ctrl-C ({trainer.state.status}); the script goes on")
