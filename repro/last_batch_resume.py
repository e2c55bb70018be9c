#!/usr/bin/env python
"""Resuming from a step checkpoint saved on the last batch of an epoch skips the next epoch's start.

Fit 1 trains a Linear(32, 16) backbone + Linear(16, 2) head for N + 1 epochs of B batches with
``ModelCheckpoint(every_n_train_steps=...)``; the checkpoint saved on the last batch of epoch N
(in ``on_train_batch_end``, before ``on_train_epoch_end``) is kept. Fit 2 resumes from it with a
fresh model and callbacks and trains ``--more-epochs`` more epochs. A watching callback records,
per epoch, whether ``on_train_epoch_start`` ran and how many batches were trained. By default
both fits also use ``BackboneFinetuning(unfreeze_backbone_at_epoch=N + 1)``, which relies on
that hook. Verdict:

* bad (1): an epoch after N trained its batches without ``on_train_epoch_start`` (the hook was
  skipped), an epoch after N never trained while a later one did or the fit finished (skipped),
  or ``BackboneFinetuning`` failed with its ``TypeError`` (``previous_backbone_lr`` is None: the
  unfreeze epoch's hook never ran). ``details.signatures`` says which were seen;
* good (0): every epoch after N started with the hook and trained all its B batches;
* skip (125): could not test (import error, no such checkpoint written, another error, an epoch
  trained a wrong number of batches, ...).

``--checkpoint mid-epoch`` (a step in the middle of epoch N) and ``--checkpoint epoch-end``
(``every_n_epochs=1``, saved in ``on_train_epoch_end``) are the controls.

``--check epoch-end`` judges the rest of epoch N instead: in an uninterrupted run its
``on_train_epoch_end`` and (with ``--val``) its validation come after that checkpoint, so a run
resumed from it should still run them; bad (1) when fit 2 runs neither for epoch N or one of them
(an ``EarlyStopping`` or a monitored ``ModelCheckpoint`` then loses that epoch's evaluation),
good (0) when both ran. Fit 1 is the control: both ran there after the checkpoint.

Single process on CPU
(the loop logic does not depend on the strategy). Runs standalone:
``python repro/last_batch_resume.py``; the last stdout line is the JSON verdict.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _contract import BAD, GOOD, SKIP, Parser, finish, import_lightning  # noqa: E402

REPRO = "last_batch_resume"
IMPORT_NAMES = ("auto", "lightning.pytorch", "pytorch_lightning")
CHECKPOINTS = ("last-batch", "mid-epoch", "epoch-end")


def parse_args(argv):
    p = Parser(description=__doc__.split("\n\n")[0], prog="last_batch_resume.py")
    p.add_argument("--checkpoint", choices=CHECKPOINTS, default="last-batch",
                   help="where in epoch N the resumed checkpoint was saved (default: last-batch)")
    p.add_argument("--ckpt-epoch", type=int, default=0, metavar="N", help="the checkpoint's epoch")
    p.add_argument("--more-epochs", type=int, default=2, metavar="M", help="epochs of fit 2 after N")
    p.add_argument("--batches", type=int, default=4, metavar="B", help="batches per epoch")
    p.add_argument("--no-finetuning", action="store_true", help="without BackboneFinetuning")
    p.add_argument("--val", action="store_true", help="with a validation loader (checked every epoch)")
    p.add_argument("--check", choices=("epoch-start", "epoch-end"), default="epoch-start",
                   help="what to judge: the next epochs' start (default) or the rest of epoch N")
    p.add_argument("--import-name", choices=IMPORT_NAMES, default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--accelerator", default="cpu", help="cpu, or gpu (one process: no collective)")
    args = p.parse_args(argv)
    if args.ckpt_epoch < 0 or args.more_epochs < 1 or args.batches < 2:
        p.error("--ckpt-epoch must be >= 0, --more-epochs >= 1 and --batches >= 2")
    return args


def target_step(args) -> tuple[int, dict]:
    """The global step of the checkpoint to resume from and the ModelCheckpoint options."""
    n, b = args.ckpt_epoch, args.batches
    if args.checkpoint == "last-batch":
        return (n + 1) * b, {"every_n_train_steps": b}
    if args.checkpoint == "mid-epoch":
        return n * b + b // 2, {"every_n_train_steps": b // 2}
    return (n + 1) * b, {"every_n_epochs": 1}


def fit(pl, torch, args, epochs: int, ckpt_dir: str, ckpt_in: str | None) -> dict:
    """One fit; returns what the watching callback saw (and the error that ended it, if any)."""

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

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=0.1)

    seen: dict = {"starts": [], "batches": {}, "ends": [], "validated": [], "error": None}

    class Watch(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            seen["starts"].append(trainer.current_epoch)

        def on_train_epoch_end(self, trainer, pl_module):
            seen["ends"].append(trainer.current_epoch)

        def on_validation_epoch_end(self, trainer, pl_module):
            if not trainer.sanity_checking:
                seen["validated"].append(trainer.current_epoch)

        def on_train_batch_end(self, trainer, pl_module, *rest):
            epoch = trainer.current_epoch
            seen["batches"][epoch] = seen["batches"].get(epoch, 0) + 1

    gen = torch.Generator().manual_seed(args.seed)
    n = 4 * args.batches
    data = torch.utils.data.TensorDataset(torch.randn(n, 32, generator=gen), torch.randn(n, 2, generator=gen))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    _, every = target_step(args)
    callbacks = [] if args.no_finetuning else [
        pl.callbacks.BackboneFinetuning(unfreeze_backbone_at_epoch=args.ckpt_epoch + 1)]
    saver = pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, filename="{epoch}-{step}", save_top_k=-1, **every)
    callbacks += [saver, Watch()]
    trainer = pl.Trainer(
        accelerator=args.accelerator, devices=1, max_epochs=epochs, logger=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=callbacks, limit_val_batches=1 if args.val else 0,
        num_sanity_val_steps=0,
    )
    try:
        trainer.fit(BackboneModel(), loader, loader if args.val else None, ckpt_path=ckpt_in)
    except Exception as err:
        seen["error"] = err
        seen["error_epoch"] = trainer.current_epoch
        seen["finetuning_frame"] = any(f.name == "finetune_function"
                                       for f in traceback.extract_tb(err.__traceback__))
    return seen


def find_checkpoint(ckpt_dir: str, step: int) -> str | None:
    for name in os.listdir(ckpt_dir):
        m = re.search(r"step=(\d+)", name)
        if m and int(m.group(1)) == step and name.endswith(".ckpt"):
            return os.path.join(ckpt_dir, name)
    return None


def main(argv=None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import torch

        pl, import_name = import_lightning(args.import_name)
    except Exception as err:
        finish(REPRO, SKIP, None, {"reason": f"import failed: {type(err).__name__}: {err}"})
    step, _ = target_step(args)
    details: dict = {"checkpoint": args.checkpoint, "ckpt_epoch": args.ckpt_epoch, "ckpt_step": step,
                     "batches_per_epoch": args.batches, "finetuning": not args.no_finetuning, "val": args.val}
    try:
        with tempfile.TemporaryDirectory(prefix="repro-last-batch-") as tmp:
            pl.seed_everything(args.seed)
            first = fit(pl, torch, args, args.ckpt_epoch + 1, tmp, None)
            if first["error"] is not None:
                raise first["error"]
            ckpt = find_checkpoint(tmp, step)
            if ckpt is None:
                details["reason"] = f"fit 1 wrote no checkpoint at step {step}: {sorted(os.listdir(tmp))}"
            else:
                resumed = os.path.join(tmp, "resumed")
                os.mkdir(resumed)
                second = fit(pl, torch, args, args.ckpt_epoch + 1 + args.more_epochs, resumed, ckpt)
    except Exception as err:
        last = str(err).strip().splitlines()[-1:] or [""]
        finish(REPRO, SKIP, None, {**details, "reason": f"run failed: {type(err).__name__}: {last[0]}"},
               import_name)
    if ckpt is None:
        finish(REPRO, SKIP, None, details, import_name)
    if args.check == "epoch-end":
        code, signature, details = judge_epoch_end(args, first, second, details)
    else:
        code, signature, details = judge(args, second, details)
    finish(REPRO, code, signature, details, import_name)


def judge_epoch_end(args, first: dict, second: dict, details: dict | None = None):
    """Did fit 2 run the rest of epoch N (its on_train_epoch_end, and its validation with --val)
    that came after the checkpoint in fit 1?"""
    details = dict(details or {})
    n = args.ckpt_epoch
    details.update(fit1_epoch_ends=first["ends"], fit1_validated=first["validated"],
                   fit2_epoch_ends=second["ends"], fit2_validated=second["validated"])
    if second.get("error") is not None:  # said also when the verdict does not depend on it
        err = second["error"]
        details["fit2_error"] = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[-1]}"
    wanted = {"on_train_epoch_end": ("ends", True), "validation": ("validated", args.val)}
    if any(n not in first[key] for key, on in wanted.values() if on):
        details["reason"] = f"fit 1 did not run epoch {n}'s end itself: nothing to compare with"
        return SKIP, None, details
    if second.get("error") is not None and not any(e > n for e in second["batches"]):
        err = second["error"]  # it ended before fit 2 was past epoch N: nothing to judge
        last = (str(err).strip().splitlines() or [""])[-1]
        details["reason"] = f"fit 2 failed: {type(err).__name__}: {last}"
        return SKIP, None, details
    missing = [name for name, (key, on) in wanted.items() if on and n not in second[key]]
    if missing:
        signature = f"epoch {n}'s {' and '.join(missing)} never ran after the resume"
        details["summary"] = f"{signature} ({args.checkpoint} checkpoint of epoch {n})"
        return BAD, signature, details
    ran = " and ".join(name for name, (_, on) in wanted.items() if on)
    details["summary"] = f"epoch {n}'s {ran} ran after the resume"
    return GOOD, None, details


def judge(args, second: dict, details: dict | None = None):
    """Map what fit 2 saw to (exit code, signature, details)."""
    details = dict(details or {})
    n, b = args.ckpt_epoch, args.batches
    expected = range(n + 1, n + 1 + args.more_epochs)
    starts, batches, err = second["starts"], second["batches"], second.get("error")
    details["fit2_epoch_starts"] = starts
    details["fit2_batches_per_epoch"] = {str(e): c for e, c in sorted(batches.items())}
    # batches of epoch N or earlier trained again after the resume (older releases replayed one)
    details["fit2_batches_up_to_ckpt_epoch"] = sum(c for e, c in batches.items() if e <= n)
    finished = err is None
    later = max([*batches, *starts], default=-1)
    hook_skipped = [e for e in expected if batches.get(e, 0) and e not in starts]
    epoch_skipped = [e for e in expected if not batches.get(e, 0) and (finished or later > e)]
    finetuning_error = (err is not None and isinstance(err, TypeError) and second.get("finetuning_frame")
                        and "NoneType" in str(err))
    signatures = []
    if hook_skipped:
        signatures.append(f"epoch {', '.join(map(str, hook_skipped))} trained without on_train_epoch_start")
    if epoch_skipped:
        signatures.append(f"epoch {', '.join(map(str, epoch_skipped))} never trained")
    if finetuning_error:
        signatures.append(f"BackboneFinetuning TypeError at epoch {second.get('error_epoch')}")
    details["signatures"] = signatures
    if err is not None:
        details["fit2_error"] = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[-1]}"
    if signatures:
        details["summary"] = "; ".join(signatures) + f" ({args.checkpoint} checkpoint of epoch {n})"
        return BAD, "; ".join(signatures), details
    if err is not None:
        details["reason"] = f"fit 2 failed: {details['fit2_error']}"
        return SKIP, None, details
    wrong = {e: batches.get(e, 0) for e in expected if batches.get(e, 0) != b}
    if wrong:
        details["reason"] = f"epochs trained a wrong number of batches (expected {b}): {wrong}"
        return SKIP, None, details
    details["summary"] = (f"epochs {expected.start}..{expected.stop - 1} started and trained {b} batches "
                          f"each ({args.checkpoint} checkpoint of epoch {n})")
    left = b - b // 2 if args.checkpoint == "mid-epoch" else 0
    replayed = details["fit2_batches_up_to_ckpt_epoch"] - left
    if replayed > 0:  # another, older problem: not judged here
        details["note"] = f"{replayed} batch(es) of epoch {n} trained again after the resume"
    return GOOD, None, details


if __name__ == "__main__":
    main()
