"""What patch 1 (``lightning-ddp-rewrap-on-trainable-change.patch``) costs a DDP fit: the check at
each epoch start when nothing became trainable, and a new wrap when something did.

Run it with a Lightning that has the patch first on the path (a source tree's ``src``), e.g.:

    PYTHONPATH=<lightning tree with the patch>/src python bench/rewrap_cost.py --epochs 20

A two-rank CPU (gloo) fit of a three-layer MLP (``--width``) whose first layer is frozen until
``--unfreeze-at``; every call of ``DDPStrategy._rewrap_if_trainable_changed`` is timed on each
rank. Rank 0 prints one JSON line: the median check that found nothing, the new wrap, the median
epoch, and the check's share of an epoch.
"""

import argparse
import json
import statistics
import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset


class Net(pl.LightningModule):
    def __init__(self, width: int, unfreeze_at: int):
        super().__init__()
        self.first = torch.nn.Linear(width, width)
        self.rest = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
                                        torch.nn.Linear(width, 1))
        self.unfreeze_at = unfreeze_at
        self.epoch_seconds: list[float] = []

    def setup(self, stage):
        self.first.requires_grad_(False)  # before the strategy wraps the model

    def forward(self, x):
        return self.rest(self.first(x))

    def on_train_epoch_start(self):
        self.started = time.perf_counter()
        if self.current_epoch == self.unfreeze_at:
            self.first.requires_grad_(True)

    def on_train_epoch_end(self):
        self.epoch_seconds.append(time.perf_counter() - self.started)

    def training_step(self, batch, batch_idx):
        return self(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Timed(DDPStrategy):
    """DDPStrategy whose check is timed, call by call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls: list[tuple[float, bool]] = []  # (seconds, wrapped again)

    def _rewrap_if_trainable_changed(self):
        before, t = self.model, time.perf_counter()
        super()._rewrap_if_trainable_changed()
        self.calls.append((time.perf_counter() - t, self.model is not before))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batches", type=int, default=8, help="batches per epoch and rank")
    p.add_argument("--unfreeze-at", type=int, default=10)
    a = p.parse_args()
    if not hasattr(DDPStrategy, "_rewrap_if_trainable_changed"):
        raise SystemExit("error: this Lightning has no patch 1 (put a patched src first on PYTHONPATH)")
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(2 * a.batches * 16, a.width)), batch_size=16)
    strategy = Timed()
    model = Net(a.width, a.unfreeze_at)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=a.epochs, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, data)
    if trainer.global_rank == 0:
        checks = [s for s, wrapped in strategy.calls if not wrapped]
        wraps = [s for s, wrapped in strategy.calls if wrapped]
        epoch = statistics.median(model.epoch_seconds)
        print(json.dumps({
            "torch": torch.__version__, "lightning": pl.__version__, "width": a.width,
            "parameters": sum(q.numel() for q in model.parameters()), "epochs": a.epochs,
            "checks": len(checks), "check_ms_median": round(1e3 * statistics.median(checks), 3),
            "wraps": len(wraps), "wrap_ms": [round(1e3 * s, 1) for s in wraps],
            "epoch_ms_median": round(1e3 * epoch, 1),
            "check_share_of_epoch": round(statistics.median(checks) / epoch, 5),
        }))


if __name__ == "__main__":
    main()
