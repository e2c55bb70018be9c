"""A two-rank CPU DDP fit to time the replica check on: ``--model 20340`` is the #20340 repro's
(Linear(32, 16) + Linear(16, 2)), ``--model mlp`` a small realistic one (three 1024-wide layers,
3.2 M parameters). Rank 0 prints ``fit_seconds=S`` (``trainer.fit`` alone, without start-up)."""

import argparse
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl


class Net(pl.LightningModule):
    def __init__(self, sizes):
        super().__init__()
        layers = []
        for a, b in zip(sizes, sizes[1:], strict=False):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*layers[:-1])

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=("20340", "mlp"), default="mlp")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--samples", type=int, default=512)
    a = p.parse_args()
    sizes = [32, 16, 2] if a.model == "20340" else [1024, 1024, 1024, 1024, 10]
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(a.samples, sizes[0])), batch_size=16)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=a.epochs,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    started = time.perf_counter()
    trainer.fit(Net(sizes), data)
    if trainer.global_rank == 0:
        print(f"fit_seconds={time.perf_counter() - started:.3f}", flush=True)


if __name__ == "__main__":
    main()
