#!/usr/bin/env python
"""BackboneFinetuning after resuming past the unfreeze epoch: the backbone stays frozen.

Fit 1 trains a Linear(32, 16) backbone + Linear(16, 2) head with
``BackboneFinetuning(unfreeze_backbone_at_epoch=U)`` for U + 1 epochs (so the backbone is
unfrozen and trains in epoch U) and saves a checkpoint. Fit 2 resumes from it with a fresh
model and callback and trains for more epochs. The callback's ``setup`` freezes the backbone
again; its optimizer param group is restored from the checkpoint, but nothing makes the
parameters trainable again. Verdict:

* bad (1): after the resume the backbone has ``requires_grad=False`` and its weights do not move;
* good (0): after the resume the backbone is trainable and its weights change;
* skip (125): could not test (import error, a crash, fit 1 never unfroze the backbone, the
  backbone trainable but not moving, ...).

Single process on CPU (the bug does not depend on the strategy). Runs standalone:
``python repro/finetuning_resume.py``; the last stdout line is the JSON verdict.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _contract import BAD, GOOD, SKIP, Parser, finish, import_lightning  # noqa: E402

REPRO = "finetuning_resume"
IMPORT_NAMES = ("auto", "lightning.pytorch", "pytorch_lightning")


def parse_args(argv):
    p = Parser(description=__doc__.split("\n\n")[0], prog="finetuning_resume.py")
    p.add_argument("--unfreeze-epoch", type=int, default=1, metavar="U")
    p.add_argument("--more-epochs", type=int, default=2, metavar="N", help="epochs of fit 2")
    p.add_argument("--import-name", choices=IMPORT_NAMES, default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--accelerator", default="cpu", help="cpu, or gpu (one process: no collective)")
    args = p.parse_args(argv)
    if args.unfreeze_epoch < 0 or args.more_epochs < 1:
        p.error("--unfreeze-epoch must be >= 0 and --more-epochs >= 1")
    return args


def snapshot(module) -> list:
    return [p.detach().clone() for p in module.parameters()]


def moved(before: list, after: list) -> bool:
    return any(not a.equal(b) for a, b in zip(before, after, strict=True))


def fit(pl, torch, args, epochs: int, ckpt_in: str | None, ckpt_out: str | None) -> dict:
    """One fit; returns what the backbone looked like at the start and the end of training."""

    class BackboneModel(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.backbone = torch.nn.Linear(32, 16)
            self.layer = torch.nn.Linear(16, 2)

        def forward(self, x):
            return self.layer(torch.relu(self.backbone(x)))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=0.1)

    seen: dict = {}

    class Watch(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            # after the finetuning callback (it comes first): the backbone as this epoch trains it
            seen.setdefault("first_epoch", trainer.current_epoch)
            seen.setdefault("start", snapshot(pl_module.backbone))
            seen["trainable"] = all(p.requires_grad for p in pl_module.backbone.parameters())

        def on_train_end(self, trainer, pl_module):
            seen["end"] = snapshot(pl_module.backbone)
            seen["last_epoch"] = trainer.current_epoch - 1

    gen = torch.Generator().manual_seed(args.seed)
    data = torch.utils.data.TensorDataset(torch.randn(32, 32, generator=gen),
                                          torch.randn(32, 2, generator=gen))
    trainer = pl.Trainer(
        accelerator=args.accelerator, devices=1, max_epochs=epochs, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[pl.callbacks.BackboneFinetuning(unfreeze_backbone_at_epoch=args.unfreeze_epoch), Watch()],
    )
    trainer.fit(BackboneModel(), torch.utils.data.DataLoader(data, batch_size=4), ckpt_path=ckpt_in)
    if ckpt_out:
        trainer.save_checkpoint(ckpt_out)
    return seen


def main(argv=None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import torch

        pl, import_name = import_lightning(args.import_name)
    except Exception as err:
        finish(REPRO, SKIP, None, {"reason": f"import failed: {type(err).__name__}: {err}"})
    details: dict = {"unfreeze_epoch": args.unfreeze_epoch}
    try:
        with tempfile.TemporaryDirectory(prefix="repro-resume-") as tmp:
            ckpt = os.path.join(tmp, "after-unfreeze.ckpt")
            pl.seed_everything(args.seed)
            first = fit(pl, torch, args, args.unfreeze_epoch + 1, None, ckpt)
            second = fit(pl, torch, args, args.unfreeze_epoch + 1 + args.more_epochs, ckpt, None)
    except Exception as err:
        last = str(err).strip().splitlines()[-1:] or [""]
        finish(REPRO, SKIP, None, {**details, "reason": f"run failed: {type(err).__name__}: {last[0]}"},
               import_name)
    code, signature, details = judge(args, first, second)
    finish(REPRO, code, signature, details, import_name)


def judge(args, first: dict, second: dict):
    """Map what the two fits saw to (exit code, signature, details)."""
    details = {"unfreeze_epoch": args.unfreeze_epoch,
               "fit1_backbone_trained": moved(first["start"], first["end"]),
               "resumed_at_epoch": second.get("first_epoch"),
               "backbone_trainable_after_resume": second.get("trainable"),
               "backbone_trained_after_resume": "start" in second and moved(second["start"], second["end"])}
    if not details["fit1_backbone_trained"] or "start" not in second:
        details["reason"] = "fit 1 did not train the backbone, or fit 2 did not train at all"
        return SKIP, None, details
    trainable, trained = details["backbone_trainable_after_resume"], details["backbone_trained_after_resume"]
    epoch = second["first_epoch"]
    if trainable and trained:
        details["summary"] = f"backbone training after resuming at epoch {epoch}"
        return GOOD, None, details
    if trainable is False and not trained:  # the signature: frozen again, and it shows
        details["summary"] = f"backbone frozen after resuming at epoch {epoch}"
        return BAD, (f"backbone requires_grad=False, weights unchanged after resuming past the "
                     f"unfreeze epoch {args.unfreeze_epoch}"), details
    # trainable but not moving (or the reverse): something else is wrong, not this bug
    details["reason"] = f"after the resume: requires_grad={trainable}, weights changed={trained}"
    return SKIP, None, details


if __name__ == "__main__":
    main()
