#!/usr/bin/env python
"""Setups that work on Lightning's master: a patch must keep them working (the "behaviour kept" gate).

Each case is a two-rank DDP fit on the CPU (gloo) of a small model with three blocks (``backbone``,
``neck``, ``head``) that works today, and checks what it is about. Run it under the workspace's
replica check (``--check-replicas``), which also says whether the ranks stayed in sync:

    python repro/kept_behaviour.py --case toggle-per-step
    python repro/kept_behaviour.py --list

Verdict (the last stdout line, ``_contract.py``): good (0) when the case's check holds, bad (1)
when it does not ("kept: ..."), skip (125) when the fit could not run (an import, a crash).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _contract import BAD, GOOD, SKIP, Parser, finish, import_lightning  # noqa: E402

REPRO = "kept_behaviour"
CASES = {
    "toggle-per-step": "two blocks take turns being trainable, every step, under "
                       "find_unused_parameters=True: both train",
    "toggle-per-epoch": "the same, every epoch: both train",
    "freeze-by-hand": "a block the LightningModule freezes at epoch 1, without a callback, stays as it was",
    "frozen-in-init-resume": "a neck the resumed run freezes in __init__, which no callback touches, stays "
                             "frozen and unchanged after resuming with a finetuning callback",
    "hooks": "a comm hook and a forward hook on the DDP wrapper, given by the user, run in every epoch while "
             "blocks are frozen and unfrozen by hand",
    "static-graph": "static_graph=True trains every block",
    "manual-optimization": "manual optimization trains every block",
    "resume-mid-epoch": "a fit resumed from a checkpoint saved mid-epoch ends at the step count of one fit",
    "resume-epoch-end": "a fit resumed from a checkpoint saved on an epoch's last batch ends at the "
                        "step count of one fit",
    "resume-epoch-end-save": "a fit resumed from ModelCheckpoint's save at an epoch's end ends at the step "
                             "count of one fit",
}
EPOCHS, STEPS_PER_EPOCH = 3, 4  # per rank: 32 samples, 2 ranks, batches of 4


def parse_args(argv):
    p = Parser(prog="kept_behaviour.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--case", choices=sorted(CASES), help="the setup to run")
    p.add_argument("--list", action="store_true", help="the cases, one per line: name, then what it checks")
    p.add_argument("--import-name", default="auto",
                   choices=("auto", "lightning.pytorch", "pytorch_lightning"))
    args = p.parse_args(argv)
    if not (args.list or args.case):
        p.error("give --case NAME (or --list)")
    return args


def build(pl, torch, case: str, freeze_neck: bool = False, hooks: dict | None = None):
    """The case's LightningModule class, made inside so that either import name works."""

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.backbone = torch.nn.Linear(8, 8)
            self.neck = torch.nn.Linear(8, 8)
            self.head = torch.nn.Linear(8, 1)
            if freeze_neck:
                self.neck.requires_grad_(False)
            self.automatic_optimization = case != "manual-optimization"
            self.frozen_at = None  # freeze-by-hand: the backbone's values when it was frozen
            self.moved_while_frozen: list[str] = []  # the toggles: a block that moved in a frozen turn
            self.turn = None  # (the frozen block, its values when the turn began)

        def forward(self, x):
            return self.head(torch.tanh(self.neck(torch.tanh(self.backbone(x)))))

        def on_train_start(self):
            self.start = snapshot(self)
            if hooks is not None:  # on the wrapper, as a user adds them once the strategy has wrapped
                from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

                def count(kind: str) -> None:
                    hooks[(kind, self.current_epoch)] = hooks.get((kind, self.current_epoch), 0) + 1

                def averaging(state, bucket):
                    count("comm")
                    return allreduce_hook(state, bucket)

                wrapper = self.trainer.strategy.model
                wrapper.register_forward_hook(lambda *_: count("forward"))
                wrapper.register_comm_hook(None, averaging)

        def on_train_batch_start(self, batch, batch_idx):
            if case == "toggle-per-step":
                self.take_turns(self.global_step)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if case == "toggle-per-step":
                self.end_turn(f"step {self.global_step}")

        def on_train_epoch_start(self):
            if case in ("toggle-per-epoch", "hooks"):
                self.take_turns(self.current_epoch)
            if case == "freeze-by-hand" and self.current_epoch == 1:
                self.backbone.requires_grad_(False)
                self.frozen_at = [p.detach().clone() for p in self.backbone.parameters()]

        def on_train_epoch_end(self):
            if case in ("toggle-per-epoch", "hooks"):
                self.end_turn(f"epoch {self.current_epoch}")

        def take_turns(self, n: int) -> None:
            self.backbone.requires_grad_(n % 2 == 0)
            self.neck.requires_grad_(n % 2 == 1)
            frozen = "neck" if n % 2 == 0 else "backbone"
            self.turn = (frozen, [p.detach().clone() for p in getattr(self, frozen).parameters()])

        def end_turn(self, when: str) -> None:
            frozen, values = self.turn
            if any(not a.equal(b) for a, b in zip(values, getattr(self, frozen).parameters(), strict=True)):
                self.moved_while_frozen.append(f"the {frozen}, frozen, moved in {when}")

        def training_step(self, batch, batch_idx):
            loss = self(batch[0]).pow(2).mean()
            if self.automatic_optimization:
                return loss
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
            return None

        def configure_optimizers(self):
            # every parameter, frozen ones too: SGD skips a parameter without a gradient, and the
            # optimizer's one group keeps its size across a resume that freezes more; with momentum
            # a zero gradient still moves a parameter, so "frozen" means no gradient at all
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    return Net


def snapshot(module) -> dict:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def moved(before: dict, after: dict, block: str) -> bool:
    return any(not before[n].equal(after[n]) for n in before if n.startswith(block + "."))


def trainer(pl, torch, case: str, epochs: int, folder: str, callbacks=()):
    import importlib

    from torch.utils.data import DataLoader, TensorDataset

    changes = ("toggle-per-step", "toggle-per-epoch", "freeze-by-hand", "hooks", "frozen-in-init-resume")
    kwargs = {"find_unused_parameters": case in changes, "static_graph": case == "static-graph"}
    strategies = importlib.import_module(f"{pl.__name__}.strategies")
    saving = importlib.import_module(f"{pl.__name__}.callbacks").ModelCheckpoint
    t = pl.Trainer(accelerator="cpu", devices=2, strategy=strategies.DDPStrategy(**kwargs), max_epochs=epochs,
                   callbacks=list(callbacks), logger=False, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=folder,
                   enable_checkpointing=any(isinstance(c, saving) for c in callbacks))
    torch.manual_seed(1)
    data = DataLoader(TensorDataset(torch.randn(2 * STEPS_PER_EPOCH * 4, 8)), batch_size=4)
    return t, data


def callbacks_of(pl):
    import importlib

    return importlib.import_module(f"{pl.__name__}.callbacks")


def run_case(pl, torch, case: str, folder: str) -> tuple[int, str | None, dict]:
    """Fit as the case says; (verdict, signature, details)."""
    if case == "frozen-in-init-resume":
        return resume_frozen_neck(pl, torch, folder)
    if case.startswith("resume-"):
        return resume(pl, torch, case, folder)
    hooks = {} if case == "hooks" else None
    t, data = trainer(pl, torch, case, EPOCHS, folder)
    model = build(pl, torch, case, hooks=hooks)()
    t.fit(model, data)
    end = snapshot(model)
    if case == "freeze-by-hand":
        now = [p.detach() for p in model.backbone.parameters()]
        if model.frozen_at is None or any(not a.equal(b) for a, b in zip(model.frozen_at, now, strict=True)):
            return BAD, "kept: the backbone frozen by hand at epoch 1 changed", {}
        return GOOD, None, {"summary": "the backbone frozen by hand stayed as it was"}
    if case == "hooks":
        missing = [f"{kind} hook in epoch {e}" for e in range(EPOCHS) for kind in ("comm", "forward")
                   if not hooks.get((kind, e))]
        if missing:
            calls = {str(k): v for k, v in hooks.items()}
            return BAD, f"kept: the user's {missing[0]} did not run", {"calls": calls}
        return GOOD, None, {"summary": "both hooks ran in every epoch"}
    if model.moved_while_frozen:
        return BAD, f"kept: {model.moved_while_frozen[0]}", {}
    still = [b for b in ("backbone", "neck", "head") if not moved(model.start, end, b)]
    if still:
        return BAD, f"kept: the {still[0]} did not train", {}
    return GOOD, None, {"summary": "every block trained"}


def resume(pl, torch, case: str, folder: str) -> tuple[int, str | None, dict]:
    at = STEPS_PER_EPOCH + (STEPS_PER_EPOCH // 2 if case == "resume-mid-epoch" else 0)
    if case == "resume-epoch-end-save":  # ModelCheckpoint's own save when epoch 1 ends
        saver = callbacks_of(pl).ModelCheckpoint(dirpath=folder, every_n_epochs=1, save_top_k=-1,
                                                 filename="{step}", save_on_train_epoch_end=True)
        at = 2 * STEPS_PER_EPOCH
    else:
        saver = callbacks_of(pl).ModelCheckpoint(dirpath=folder, every_n_train_steps=at, save_top_k=-1,
                                                 filename="{step}")
    t, data = trainer(pl, torch, case, EPOCHS, folder, [saver])
    t.fit(build(pl, torch, case)(), data)
    ckpt = os.path.join(folder, f"step={at}.ckpt")
    t, data = trainer(pl, torch, case, EPOCHS, folder)
    model = build(pl, torch, case)()
    t.fit(model, data, ckpt_path=ckpt)
    details = {"saved_at_step": at, "global_step": t.global_step}
    if t.global_step != EPOCHS * STEPS_PER_EPOCH:
        return BAD, f"kept: resumed from step {at}, the fit ended at step {t.global_step}, not " \
                    f"{EPOCHS * STEPS_PER_EPOCH}", details
    if not moved(model.start, snapshot(model), "head"):
        return BAD, "kept: the resumed fit did not train", details
    return GOOD, None, {**details, "summary": f"resumed from step {at}, ended at step {t.global_step}"}


def resume_frozen_neck(pl, torch, folder: str) -> tuple[int, str | None, dict]:
    case = "frozen-in-init-resume"

    class FrozenBackbone(callbacks_of(pl).BaseFinetuning):
        """A finetuning callback that keeps the backbone frozen (a fixed feature extractor)."""

        def freeze_before_training(self, pl_module):
            self.freeze(pl_module.backbone)

        def finetune_function(self, pl_module, epoch, optimizer):
            pass

    t, data = trainer(pl, torch, case, 2, folder, [FrozenBackbone()])
    t.fit(build(pl, torch, case)(), data)
    ckpt = os.path.join(folder, "first.ckpt")
    t.save_checkpoint(ckpt)
    t, data = trainer(pl, torch, case, 4, folder, [FrozenBackbone()])
    model = build(pl, torch, case, freeze_neck=True)()
    t.fit(model, data, ckpt_path=ckpt)
    trainable = [n for n, p in model.neck.named_parameters() if p.requires_grad]
    if trainable:
        return BAD, f"kept: the neck frozen in __init__ is trainable after the resume ({trainable[0]})", {}
    if moved(model.start, snapshot(model), "neck"):
        return BAD, "kept: the neck frozen in __init__ changed after the resume", {}
    if t.global_step != 4 * STEPS_PER_EPOCH or not moved(model.start, snapshot(model), "head"):
        return BAD, f"kept: the resumed fit did not train (it ended at step {t.global_step})", {}
    return GOOD, None, {"summary": "the neck frozen in __init__ stayed frozen and unchanged; the head "
                                   "trained"}


def main(argv=None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        for name, what in CASES.items():
            print(f"{name}: {what}")
        return
    try:
        import torch

        pl, import_name = import_lightning(args.import_name)
    except Exception as err:
        finish(REPRO, SKIP, None, {"reason": f"import failed: {type(err).__name__}: {err}"})
    import _launch

    rank = _launch.fork_ranks(2)
    # one folder for both ranks (a checkpoint rank 0 writes, every rank reads)
    folder = os.path.join(tempfile.gettempdir(), f"kept-{os.environ['TORCHELASTIC_RUN_ID']}")
    os.makedirs(folder, exist_ok=True)
    try:
        code, signature, details = run_case(pl, torch, args.case, folder)
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # every rank done with the checkpoints before they go
    except Exception as err:
        # no collective here: a rank that failed exits, and the harness ends a peer left waiting
        last = (str(err).strip().splitlines() or [""])[-1]
        code, signature, details = SKIP, None, {"reason": f"run failed: {type(err).__name__}: {last}"}
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
    details = {"case": args.case, **details}
    if signature:
        print(signature, flush=True)
    finish(REPRO, code, signature, details, import_name)


if __name__ == "__main__":
    main()
