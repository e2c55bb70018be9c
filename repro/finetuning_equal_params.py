#!/usr/bin/env python
"""A finetuning callback unfreezes a parameter but never adds it to the optimizer when a
parameter of equal *value* is already there.

``BaseFinetuning.filter_on_optimizer`` drops every parameter that equals (``torch.equal``) one
already in the optimizer's groups, where it means "is the same tensor". Two frozen
``LayerNorm``s of one width still hold their initial values (weight all ones, bias all zeros),
so when a callback unfreezes two parts in turn, each with ``unfreeze_and_add_param_group``, the
second part's norm is set ``requires_grad=True`` and left out of its new param group: it gets
gradients that no optimizer applies, and the warning says it "already exists within another
group".

The model: two encoders (``Linear(6, 8) + LayerNorm(8)`` each) and a head ``Linear(16, 2)`` on
their concatenated outputs; the optimizer is built on the trainable parameters only (as the
callback's docs ask); a ``BaseFinetuning`` subclass freezes both encoders before training and
unfreezes them at epoch 1, one call each. Verdict:

* bad (1): after the fit a parameter with ``requires_grad=True`` is in no optimizer param group
  (compared by identity); ``details.not_in_optimizer`` names them, ``details.untrained`` those of
  them still at their initial values;
* good (0): every trainable parameter is in a group, and every encoder parameter changed after
  the unfreeze;
* skip (125): could not test (no ``BaseFinetuning``, an import error, another error).

``--distinct`` (the control) starts the second encoder's norm at weight 0.5, bias 0.1 (not 1
and 0), so no value is shared. Single process on CPU (the callback does not depend on the strategy). Runs
standalone: ``python repro/finetuning_equal_params.py``; the last stdout line is the JSON
verdict.
"""

from __future__ import annotations

import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _contract import BAD, GOOD, SKIP, Parser, finish, import_lightning  # noqa: E402

REPRO = "finetuning_equal_params"
IMPORT_NAMES = ("auto", "lightning.pytorch", "pytorch_lightning")


def parse_args(argv):
    p = Parser(description=__doc__.split("\n\n")[0], prog="finetuning_equal_params.py")
    p.add_argument("--distinct", action="store_true",
                   help="the control: the second encoder's norm starts at 0.5, equal to nothing else")
    p.add_argument("--epochs", type=int, default=3, help="epochs (the encoders are unfrozen at epoch 1)")
    p.add_argument("--import-name", choices=IMPORT_NAMES, default="auto")
    args = p.parse_args(argv)
    if args.epochs < 2:
        p.error("--epochs must be >= 2 (the encoders are unfrozen at epoch 1)")
    return args


def build(pl, torch, distinct: bool):
    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.first = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8))
            self.second = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8))
            self.head = torch.nn.Linear(16, 2)
            if distinct:
                with torch.no_grad():
                    self.second[1].weight.fill_(0.5)
                    self.second[1].bias.fill_(0.1)

        def forward(self, x):
            return self.head(torch.relu(torch.cat([self.first(x), self.second(x)], dim=1)))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=0.1)

    class UnfreezeBoth(pl.callbacks.BaseFinetuning):
        """Both encoders frozen, then unfrozen at epoch 1, each as a param group of its own."""

        def freeze_before_training(self, pl_module):
            self.freeze([pl_module.first, pl_module.second])

        def finetune_function(self, pl_module, epoch, optimizer, *rest):  # older releases pass opt_idx
            if epoch == 1:
                self.unfreeze_and_add_param_group(pl_module.first, optimizer, lr=0.05)
                self.unfreeze_and_add_param_group(pl_module.second, optimizer, lr=0.05)

    return Model(), UnfreezeBoth()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        pl, import_name = import_lightning(args.import_name)
        import torch
        from torch.utils.data import DataLoader, TensorDataset
    except ImportError as err:
        finish(REPRO, SKIP, None, {"reason": f"import failed: {err}"})
    if getattr(pl.callbacks, "BaseFinetuning", None) is None:
        finish(REPRO, SKIP, None, {"reason": "this release has no BaseFinetuning"}, import_name)
    details = {"distinct": args.distinct, "epochs": args.epochs}
    try:
        torch.manual_seed(0)
        model, callback = build(pl, torch, args.distinct)
        initial = {n: p.detach().clone() for n, p in model.named_parameters()}
        data = TensorDataset(torch.randn(32, 6), torch.randint(0, 2, (32,)))
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=args.epochs, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False,
                             callbacks=[callback])
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            trainer.fit(model, DataLoader(data, batch_size=8))
        optimizer = trainer.optimizers[0]
    except Exception as err:
        last = str(err).strip().splitlines()[-1:] or [""]
        finish(REPRO, SKIP, None, {**details, "reason": f"run failed: {type(err).__name__}: {last[0]}"},
               import_name)
    code, signature, details = judge(model, optimizer, initial, [str(w.message) for w in seen], details)
    finish(REPRO, code, signature, details, import_name)


def judge(model, optimizer, initial: dict, messages: list[str], details: dict | None = None):
    """(exit code, signature, details) from the fitted model and its optimizer."""
    details = dict(details or {})
    grouped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in grouped]
    unchanged = [n for n, p in model.named_parameters() if n.startswith(("first.", "second."))
                 and bool((p.detach() == initial[n]).all())]
    details["param_groups"] = len(optimizer.param_groups)
    details["not_in_optimizer"] = missing
    details["untrained"] = [n for n in missing if n in unchanged]
    details["skipped_warning"] = any("already exist within another group" in m for m in messages)
    if missing:
        signature = f"trainable parameter(s) in no optimizer group: {', '.join(missing)}"
        details["summary"] = signature + (" (still at their initial values)" if details["untrained"] else "")
        return BAD, signature, details
    if unchanged:
        details["reason"] = f"encoder parameter(s) never changed though in the optimizer: {unchanged}"
        return SKIP, None, details
    details["summary"] = "every trainable parameter is in an optimizer group and both encoders trained"
    return GOOD, None, details


if __name__ == "__main__":
    main()
