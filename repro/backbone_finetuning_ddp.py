#!/usr/bin/env python
"""Lightning #20340: with DDP, ``BackboneFinetuning`` makes replicas diverge after unfreezing.

A two-rank CPU (gloo) fit of a Linear(32, 16) backbone + Linear(16, 2) head, SGD over the
trainable parameters, ``BackboneFinetuning(unfreeze_backbone_at_epoch=3)``. At every epoch end
every parameter tensor is all-gathered and compared across ranks (bitwise: DDP keeps replicas
identical). Verdict:

* bad (1): in sync before the unfreeze epoch, out of sync from it on (the #20340 signature);
* good (0): in sync at every epoch end and the backbone really was unfrozen;
* skip (125): could not test (import error, a crash, out of sync *before* unfreezing, ...).

``--no-callback`` is the control: same run, backbone trainable throughout, must stay in sync.
Runs standalone (``python repro/backbone_finetuning_ddp.py``), under ``torchrun`` or SLURM
(Lightning's cluster environments), with ``--accelerator gpu`` for NCCL. Only rank 0 prints the
verdict line; every rank exits with the same code.

``--launch fork`` (default): the ranks are forked from this process after the imports, with
torchrun's environment, so Lightning sees an external launcher (the strategy is still the
reporter's ``ddp``; only who starts the processes changes). ``--launch lightning``: Lightning's
own launcher starts a new interpreter per extra rank, exactly as in the report. Under an outer
launcher (torchrun, SLURM) and for ``ddp_spawn`` / ``ddp_fork`` nothing is forked here.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _launch  # noqa: E402
from _contract import BAD, GOOD, SKIP, Parser, finish, import_lightning  # noqa: E402

REPRO = "backbone_finetuning_ddp"
STRATEGIES = ("ddp", "ddp_spawn", "ddp_fork", "ddp_find_unused_parameters_true")
IMPORT_NAMES = ("auto", "lightning.pytorch", "pytorch_lightning")


def parse_args(argv):
    p = Parser(description=__doc__.split("\n\n")[0], prog="backbone_finetuning_ddp.py")
    p.add_argument("--strategy", choices=STRATEGIES, default="ddp")
    p.add_argument("--launch", choices=("fork", "lightning"), default="fork",
                   help="who starts the ranks: forks of this process after the imports (fast), "
                        "or Lightning's launcher (a new interpreter per rank, as in the report)")
    p.add_argument("--static-graph", action="store_true", help="DDP(static_graph=True)")
    p.add_argument("--accumulate", type=int, default=1, metavar="N", help="accumulate_grad_batches")
    p.add_argument("--unfreeze-epoch", type=int, default=3)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--no-callback", action="store_true", help="control run: no finetuning callback")
    p.add_argument("--import-name", choices=IMPORT_NAMES, default="auto")
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--devices", type=int, default=2, help="processes per node")
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--collective-timeout", type=float, default=120.0, metavar="S",
                   help="process-group timeout, so a dead peer cannot block a rank forever")
    args = p.parse_args(argv)
    if args.epochs <= args.unfreeze_epoch:
        p.error("--epochs must be greater than --unfreeze-epoch (nothing to compare after it)")
    if args.accumulate < 1 or args.devices < 1 or args.num_nodes < 1:
        p.error("--accumulate, --devices and --num-nodes must be >= 1")
    return args


def _import_name_from_argv(argv) -> str:
    # Classes must live at module level to be picklable for ddp_spawn, so the import happens
    # here, before argparse runs; spawned and re-launched ranks see the same argv.
    for i, arg in enumerate(argv):
        if arg == "--import-name" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--import-name="):
            return arg.split("=", 1)[1]
    return "auto"


try:
    import torch

    pl, IMPORT_NAME = import_lightning(_import_name_from_argv(sys.argv))
    IMPORT_ERROR = None
except Exception as err:  # reported as "cannot test" by main()
    pl, IMPORT_NAME, IMPORT_ERROR = None, None, f"{type(err).__name__}: {err}"

if pl is not None:

    class BackboneModel(pl.LightningModule):
        def __init__(self, lr: float = 0.1):
            super().__init__()
            self.lr = lr
            self.backbone = torch.nn.Linear(32, 16)
            self.layer = torch.nn.Linear(16, 2)

        def forward(self, x):
            return self.layer(torch.relu(self.backbone(x)))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=self.lr)

    class ReplicaCheck(pl.Callback):
        """All-gathers every parameter at each epoch end and records cross-rank differences."""

        def __init__(self, result_path: str):
            self.result_path = result_path
            self.epochs: list[dict] = []

        def on_train_epoch_end(self, trainer, pl_module):
            dist = torch.distributed
            world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
            diffs, trainable = {}, []
            for name, param in pl_module.named_parameters():
                if param.requires_grad:
                    trainable.append(name)
                local = param.detach().clone().contiguous()
                copies = [torch.empty_like(local) for _ in range(world)]
                if world > 1:
                    dist.all_gather(copies, local)
                else:
                    copies = [local]
                worst = max(((c - copies[0]).abs().max().item() for c in copies[1:]), default=0.0)
                if worst > 0:
                    diffs[name] = worst
            backbone = [p.detach().flatten() for p in pl_module.backbone.parameters()]
            self.epochs.append({
                "epoch": trainer.current_epoch,
                "trainable": trainable,
                "diffs": diffs,
                "backbone_norm": float(torch.cat(backbone).double().norm()),
            })

        def on_train_end(self, trainer, pl_module):
            if trainer.global_rank == 0:  # the ddp_spawn parent reads this file
                tmp = self.result_path + ".tmp"
                with open(tmp, "w") as fh:
                    json.dump(self.epochs, fh)
                os.replace(tmp, self.result_path)


def make_strategy(args):
    from importlib import import_module

    strategies = import_module(f"{IMPORT_NAME}.strategies")
    kwargs = {"timeout": timedelta(seconds=args.collective_timeout)}
    if args.strategy == "ddp_find_unused_parameters_true":
        kwargs["find_unused_parameters"] = True
    if args.static_graph:
        kwargs["static_graph"] = True
    start = {"ddp_spawn": "spawn", "ddp_fork": "fork"}.get(args.strategy)
    if start is None:
        return strategies.DDPStrategy(**kwargs)
    try:
        return strategies.DDPStrategy(start_method=start, **kwargs)
    except TypeError:  # Lightning 1.x: separate spawn strategy class
        if start == "spawn" and hasattr(strategies, "DDPSpawnStrategy"):
            return strategies.DDPSpawnStrategy(**kwargs)
        raise


def judge(args, epochs: list[dict]):
    """Map the per-epoch records to (exit code, signature, details)."""
    details = {"unfreeze_epoch": None if args.no_callback else args.unfreeze_epoch,
               "epochs_checked": len(epochs)}
    if len(epochs) < args.epochs:
        details["reason"] = f"training stopped after {len(epochs)} of {args.epochs} epochs"
        return SKIP, None, details
    out_of_sync = [e for e in epochs if e["diffs"]]
    details["sync_by_epoch"] = ["in sync" if not e["diffs"] else "DIVERGED" for e in epochs]
    if out_of_sync:
        first = out_of_sync[0]
        details.update(first_diverging_epoch=first["epoch"], diverging_params=sorted(first["diffs"]),
                       max_abs_diff=max(max(e["diffs"].values()) for e in out_of_sync))
    if args.no_callback:
        if out_of_sync:
            details["reason"] = "replicas diverged without the finetuning callback: a different bug"
            return SKIP, None, details
        details["summary"] = "in sync at every epoch end"
        return GOOD, None, details
    trainable_last = epochs[-1]["trainable"]
    frozen_before = not any(n.startswith("backbone.") for n in epochs[0]["trainable"])
    details["backbone_trainable_at_end"] = any(n.startswith("backbone.") for n in trainable_last)
    details["backbone_changed_after_unfreeze"] = (
        epochs[-1]["backbone_norm"] != epochs[args.unfreeze_epoch - 1]["backbone_norm"])
    if not (frozen_before and details["backbone_trainable_at_end"]):
        details["reason"] = "the callback did not freeze then unfreeze the backbone"
        return SKIP, None, details
    if not out_of_sync:
        details["summary"] = "in sync at every epoch end; backbone trained after unfreezing" if \
            details["backbone_changed_after_unfreeze"] else "in sync at every epoch end"
        return GOOD, None, details
    first = out_of_sync[0]
    if first["epoch"] < args.unfreeze_epoch:
        details["reason"] = "replicas diverged before the unfreeze epoch: a different bug"
        return SKIP, None, details
    details["summary"] = f"epoch {first['epoch']} {', '.join(sorted(first['diffs']))}"
    signature = (f"replicas out of sync from epoch {first['epoch']} (unfreeze epoch "
                 f"{args.unfreeze_epoch}): {', '.join(sorted(first['diffs']))}; "
                 f"max |diff| {details['max_abs_diff']:.3g}")
    return BAD, signature, details


def launch(args) -> str:
    """Fork the ranks here when ``--launch fork`` applies; returns the launch that is used."""
    forkable = args.strategy in ("ddp", "ddp_find_unused_parameters_true") and args.num_nodes == 1
    if _launch.launched_externally():
        return "external"
    if args.launch == "fork" and forkable and args.devices > 1:
        _launch.fork_ranks(args.devices)
        return "fork"
    return "lightning"


def main(argv=None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if IMPORT_ERROR:
        finish(REPRO, SKIP, None, {"reason": f"import failed: {IMPORT_ERROR}"}, IMPORT_NAME)
    launched = launch(args)
    fd, result_path = tempfile.mkstemp(prefix="repro-20340-", suffix=".json")
    os.close(fd)
    rank, epochs, failure, where = None, [], None, {}
    try:
        pl.seed_everything(args.seed)
        gen = torch.Generator().manual_seed(args.seed)
        data = torch.utils.data.TensorDataset(torch.randn(args.samples, 32, generator=gen),
                                              torch.randn(args.samples, 2, generator=gen))
        check = ReplicaCheck(result_path)
        callbacks = [check]
        if not args.no_callback:
            callbacks.insert(0, pl.callbacks.BackboneFinetuning(
                unfreeze_backbone_at_epoch=args.unfreeze_epoch))
        trainer = pl.Trainer(
            accelerator=args.accelerator, devices=args.devices, num_nodes=args.num_nodes,
            strategy=make_strategy(args), max_epochs=args.epochs, callbacks=callbacks,
            accumulate_grad_batches=args.accumulate, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
        )
        trainer.fit(BackboneModel(), torch.utils.data.DataLoader(data, batch_size=args.batch_size))
        rank = trainer.global_rank
        # who started the ranks, as Lightning saw it (torchrun: TorchElasticEnvironment; srun:
        # SLURMEnvironment), and how many there were
        where = {"cluster_environment": type(trainer.strategy.cluster_environment).__name__,
                 "world_size": trainer.world_size, "num_nodes": trainer.num_nodes}
        epochs = check.epochs
        if not epochs and os.path.getsize(result_path):  # ddp_spawn: results came from rank 0
            with open(result_path) as fh:
                epochs = json.load(fh)
    except Exception as err:
        last = str(err).strip().splitlines()[-1:] or [""]
        failure = f"run failed: {type(err).__name__}: {last[0]}"
        if not epochs and os.path.getsize(result_path):  # ddp_spawn: rank 0 wrote its records
            with open(result_path) as fh:
                epochs = json.load(fh)
    finally:
        os.unlink(result_path)
    if failure and len(epochs) < args.epochs:
        finish(REPRO, SKIP, None, {"reason": failure}, IMPORT_NAME, rank)
    code, signature, details = judge(args, epochs)
    if failure:  # every epoch was recorded, then a process failed (e.g. a spawned rank at exit)
        details["after_training"] = failure
    details["strategy"] = args.strategy + (" static_graph" if args.static_graph else "")
    details["launch"] = launched
    details.update(where)
    finish(REPRO, code, signature, details, IMPORT_NAME, rank)


if __name__ == "__main__":
    main()
