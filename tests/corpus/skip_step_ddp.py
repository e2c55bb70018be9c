"""Two CPU ranks train with strategy="ddp"; training_step skips every other batch by returning
None, on every rank at the same batches (so no rank waits for another).

Bad: Lightning refuses the skipped step under distributed training.
"""

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        if batch_idx % 2 == 1:
            return None  # skip this batch
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1,
                         limit_train_batches=6, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Regressor(), data)
    if trainer.global_rank == 0:
        print(f"trained {trainer.global_step} steps, skipping the odd batches")
