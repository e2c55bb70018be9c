#!/usr/bin/env python
"""Lightning #20706: ``AttributeError: 'NoneType' object has no attribute 'reducer'`` in DDP backward.

DDP puts a ``_DDPSink`` autograd node after its forward when ``find_unused_parameters=True`` (or
on the first iteration with ``static_graph=True``); since torch 2.1 that node holds the DDP module
by weak reference only. A loss whose graph was built by an earlier DDP wrapper that has been freed
since hits the error in backward. This script is a catalogue of short two-rank CPU (gloo)
scenarios: triggers that replace the wrapper, carriers that keep graph across it, stressors, the
garbage-collector timing that makes it intermittent, and controls that must stay clean.

    python repro/ddp_weakref_stress.py --list
    python repro/ddp_weakref_stress.py --quick                 # a representative subset
    python repro/ddp_weakref_stress.py                         # the whole catalogue
    python repro/ddp_weakref_stress.py --scenario pl_second_fit_extra_outputs   # one, for bisects

Runs are forked: this process imports torch and Lightning once, and every run is a fresh fork of
it (its own process group under the harness) that forks its second rank in turn. The import is
paid once per catalogue instead of twice per run. ``--fresh-process`` starts a new interpreter
per rank instead (the faithful mode: each run loads every module anew).

Exit code (the workspace contract): 1 if any run shows the raw signature, 0 if none does, 125 if
no scenario could run; ``--strict`` also fails (1) when a control is not clean or an expected
crash does not happen. The last stdout line is the JSON verdict; per-run results are written as
JSONL with a Markdown summary (``--out``).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import re
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # the workspace: tools.launch.harness bounds every run
import _launch  # noqa: E402
from _contract import FAIL, Parser, UsageError, finish, import_lightning  # noqa: E402

from tools.core import results  # noqa: E402  (atomic result files, shared with the workspace)

REPRO = "ddp_weakref_stress"
SIGNATURE = "'NoneType' object has no attribute 'reducer'"

# Per-rank outcomes, in order of precedence when a run is summed up.
OUTCOMES = ("signature", "clear_error", "peer_failure", "other_error", "timeout", "ok",
            "not_applicable")


class NotApplicable(Exception):
    """The scenario cannot be expressed with this Lightning release's API."""
# Messages of the fixes in patches/ (and any fix that names the cause this way).
CLEAR_ERROR = re.compile(r"(no longer exists|another DistributedDataParallel|stale DDP graph|"
                         r"DDP wrapper that (built|produced)|created by an earlier DDP)", re.I)
# gloo's and NCCL's words for "a peer went away or never answered" (NCCL: its watchdog's
# collective timeout, a remote or system error, an aborted communicator)
PEER_FAILURE = re.compile(r"(Connection closed by peer|Connection reset by peer|Broken pipe|"
                          r"Timed out waiting|timed out|Watchdog caught collective|"
                          r"ProcessGroupGloo|gloo/transport|NCCL (error|communicator)|"
                          r"ncclRemoteError|ncclSystemError|NCCL operations have failed)", re.I)


def classify(text: str) -> str:
    """Outcome of one rank from its traceback text ('' = no exception)."""
    if not text:
        return "ok"
    if text.rstrip().splitlines()[-1].startswith("NotApplicable:"):
        return "not_applicable"
    if CLEAR_ERROR.search(text):  # a fix's message, also one added to torch's (whose text stays)
        return "clear_error"
    if f"AttributeError: {SIGNATURE}" in text:  # the raw error itself, not a message quoting it
        return "signature"
    if PEER_FAILURE.search(text):
        return "peer_failure"
    return "other_error"


# --------------------------------------------------------------------------------------------
# The catalogue
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str  # torch | lightning | gc | control
    expect: str  # signature | no-signature | ok | signature-sometimes
    quick: bool
    doc: str


CATALOGUE: dict[str, Scenario] = {}


def scenario(kind: str, expect: str, quick: bool = False):
    def register(fn):
        name = fn.__name__
        CATALOGUE[name] = Scenario(name, kind, expect, quick, (fn.__doc__ or "").strip())
        RUNNERS[name] = fn
        return fn
    return register


RUNNERS: dict = {}
STEP = [0]  # the training step the scenario is at, reported with each outcome


# ---- plain torch --------------------------------------------------------------------------

def _torch_setup(ctx):
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if ctx.gpu else "gloo", rank=ctx.rank, world_size=ctx.world_size,
                                timeout=timedelta(seconds=ctx.collective_timeout))
    torch.manual_seed(0)
    device = torch.device(f"cuda:{ctx.local_rank}" if ctx.gpu else "cpu")
    if ctx.gpu:
        torch.cuda.set_device(device)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(device)
    gen = torch.Generator().manual_seed(ctx.rank)
    return torch, model, lambda: torch.randn(4, 8, generator=gen).to(device)


def _ddp(torch, model, **kw):
    return torch.nn.parallel.DistributedDataParallel(model, **kw)


def _train(torch, ddp, batch, steps):
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    out = None
    for _ in range(steps):
        STEP[0] += 1
        out = ddp(batch())
        out.sum().backward()
        opt.step()
        opt.zero_grad()
    return out


@scenario("torch", "signature", quick=True)
def torch_rewrap_cached_output(ctx):
    """Train, keep an output without detach, re-wrap the module, backprop a loss that uses it."""
    torch, model, batch = _torch_setup(ctx)
    ddp = _ddp(torch, model, find_unused_parameters=True)
    kept = _train(torch, ddp, batch, 3)
    ddp = _ddp(torch, model, find_unused_parameters=True)  # the old wrapper is freed here
    STEP[0] += 1
    (ddp(batch()).sum() + kept.sum()).backward()


@scenario("torch", "signature")
def torch_temporary_wrapper(ctx):
    """Backprop through the output of a DDP wrapper that was only a temporary; a backward that
    completes must have reduced the gradients (each rank's batch differs)."""
    torch, model, batch = _torch_setup(ctx)
    STEP[0] += 1
    out = _ddp(torch, model, find_unused_parameters=True)(batch())
    out.sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    both = [torch.empty_like(grads) for _ in range(ctx.world_size)]
    torch.distributed.all_gather(both, grads)
    if not all(torch.equal(both[0], g) for g in both[1:]):
        raise RuntimeError("backward completed but the ranks' gradients differ: no all-reduce ran")


@scenario("torch", "signature")
def torch_accumulated_loss_after_rewrap(ctx):
    """Sum losses over steps without backward, re-wrap, then backprop the sum."""
    torch, model, batch = _torch_setup(ctx)
    ddp = _ddp(torch, model, find_unused_parameters=True)
    total = 0
    for _ in range(3):
        STEP[0] += 1
        total = total + ddp(batch()).sum()
    ddp = _ddp(torch, model, find_unused_parameters=True)
    total.backward()


@scenario("torch", "signature")
def torch_static_graph_first_iteration(ctx):
    """static_graph=True puts the sink on the first iteration: keep that output across a re-wrap."""
    torch, model, batch = _torch_setup(ctx)
    ddp = _ddp(torch, model, static_graph=True)
    STEP[0] += 1
    first = ddp(batch())
    ddp = _ddp(torch, model, static_graph=True)
    first.sum().backward()


@scenario("control", "no-signature", quick=True)
def torch_rewrap_without_sink(ctx):
    """The re-wrap with a cached output, without find_unused_parameters: no sink, no signature."""
    torch, model, batch = _torch_setup(ctx)
    ddp = _ddp(torch, model)
    kept = _train(torch, ddp, batch, 3)
    ddp = _ddp(torch, model)
    STEP[0] += 1
    (ddp(batch()).sum() + kept.sum()).backward()


@scenario("control", "ok")
def torch_rewrap_detached(ctx):
    """The re-wrap with the cached output detached (the remedy): clean."""
    torch, model, batch = _torch_setup(ctx)
    ddp = _ddp(torch, model, find_unused_parameters=True)
    kept = _train(torch, ddp, batch, 3).detach()
    ddp = _ddp(torch, model, find_unused_parameters=True)
    _train(torch, ddp, lambda: batch() + 0 * kept.sum(), 2)


@scenario("control", "ok")
def torch_old_graph_kept_unused(ctx):
    """Rank 0 alone keeps an output of a wrapper (as code that caches a prediction to log does),
    never backpropagates it, and re-wraps; the new wrapper trains: clean, the ranks' gradients
    equal. A design that kept the freed wrapper's reducer alive would let its hooks fire, on
    rank 0 only, in the new wrapper's backward."""
    torch, model, batch = _torch_setup(ctx)
    ddp = _ddp(torch, model, find_unused_parameters=True)
    STEP[0] += 1
    out = ddp(batch())
    kept = out if ctx.rank == 0 else out.detach()  # noqa: F841 - rank 0 keeps the graph (and sink)
    del out
    ddp = _ddp(torch, model, find_unused_parameters=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for _ in range(3):
        STEP[0] += 1
        ddp(batch()).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        both = [torch.empty_like(grads) for _ in range(ctx.world_size)]
        torch.distributed.all_gather(both, grads)
        if not all(torch.equal(both[0], g) for g in both[1:]):
            raise RuntimeError("the ranks' gradients differ after the new wrapper's backward")
        opt.step()
        opt.zero_grad()


# ---- Lightning ------------------------------------------------------------------------------

def _lightning(ctx, *, carrier=None, manual=False, accumulate=1, validate=False, checkpoint=False,
               cycle=False, gc_mode=None, extra_callbacks=(), max_epochs=1):
    """Build (trainer factory, model) for the Lightning scenarios.

    carrier: None | "outputs" (training_step extra outputs kept in on_train_batch_end without
    detach) | "bank" (a memory bank computed with ``self.trainer.model(x)`` in a hook). Carried
    tensors are consumed, one per step, only once ``model.consume`` is set (after the trigger).
    """
    import torch

    pl, _ = import_lightning(ctx.import_name)
    if carrier == "bank" and _version(pl) < (2, 1):
        # before 2.1 the DDP wrapper's forward runs training_step, not forward
        raise NotApplicable("self.trainer.model(x) does not call forward before Lightning 2.1")

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.backbone = torch.nn.Linear(8, 8)
            self.head = torch.nn.Linear(8, 2)
            self.carry: list = []
            self.consume = False
            self.automatic_optimization = not manual

        def forward(self, x, embed_only=False):
            if embed_only:  # saves no parameter for backward: survives optimizer steps
                return self.backbone(x)
            return self.head(torch.relu(self.backbone(x)))

        def training_step(self, batch, batch_idx):
            STEP[0] += 1
            out = self(batch[0])
            loss = out.pow(2).mean()
            if self.consume and self.carry:
                loss = loss + 0.0 * self.carry.pop(0).sum()  # the stale graph enters the loss
            if gc_mode == "random" and STEP[0] in ctx.gc_steps:
                gc.collect()
            if gc_mode == "natural":
                _garbage(ctx)
            if manual:
                opt = self.optimizers()
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
                return {"out": out}
            return {"loss": loss, "out": out}

        # module hooks, not callbacks: Tuner.lr_find() swaps the callbacks out
        def on_train_batch_start(self, batch, batch_idx):
            if carrier == "bank" and not self.consume:
                # embeddings through the DDP wrapper, kept with their graph (before the step's
                # own forward, so the wrapper's reducer ends each step in its normal state)
                self.carry.append(self.trainer.model(batch[0], embed_only=True))

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if carrier == "outputs" and not self.consume:
                self.carry.append(outputs["out"])  # no .detach(): keeps the graph

        def validation_step(self, batch, batch_idx):
            self.log("val", self(batch[0]).sum(), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class KeepInCycle(pl.Callback):
        def on_fit_start(self, trainer, pl_module):
            wrapper = trainer.strategy.model
            # a plain list, not a submodule: freed only by a full cyclic collection
            wrapper.keep_alive = [wrapper]

    gen = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 8, generator=gen))
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    strategy = pl.strategies.DDPStrategy(find_unused_parameters=True,
                                         timeout=timedelta(seconds=ctx.collective_timeout))
    callbacks = [*extra_callbacks]
    if cycle:
        callbacks.append(KeepInCycle())
    if checkpoint:
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=ctx.tmp, every_n_train_steps=1,
                                                      save_top_k=-1))

    def trainer(epochs=max_epochs):
        return pl.Trainer(accelerator="gpu" if ctx.gpu else "cpu", devices=ctx.per_node, num_nodes=ctx.nodes,
                          strategy=strategy, max_epochs=epochs,
                          callbacks=callbacks, accumulate_grad_batches=accumulate,
                          limit_train_batches=8, limit_val_batches=2, logger=False,
                          enable_checkpointing=checkpoint, enable_progress_bar=False,
                          enable_model_summary=False, num_sanity_val_steps=0,
                          check_val_every_n_epoch=1)

    model = Net()
    fit = (lambda t: t.fit(model, loader, loader)) if validate else (lambda t: t.fit(model, loader))
    return pl, trainer, model, fit, loader


def _version(module) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", getattr(module, "__version__", "") or "")
    return (int(found.group(1)), int(found.group(2))) if found else (99, 0)


def _second_fit(ctx, **kw):
    pl, trainer, model, fit, _ = _lightning(ctx, **kw)
    t = trainer()
    fit(t)
    ctx.rank = t.global_rank
    model.consume = bool(kw.get("carrier"))
    t.fit_loop.max_epochs += 1
    fit(t)


@scenario("lightning", "signature", quick=True)
def pl_second_fit_extra_outputs(ctx):
    """trainer.fit() twice; training_step extra outputs kept without detach feed fit 2's loss."""
    _second_fit(ctx, carrier="outputs")


@scenario("lightning", "signature")
def pl_second_fit_memory_bank(ctx):
    """trainer.fit() twice; a memory bank computed with self.trainer.model(x) feeds fit 2's loss."""
    _second_fit(ctx, carrier="bank")


@scenario("lightning", "signature")
def pl_lr_find_then_fit(ctx):
    """Tuner.lr_find() (a fit of its own) then fit(), extra outputs kept from lr_find's steps."""
    pl, trainer, model, fit, loader = _lightning(ctx, carrier="outputs")
    t = trainer()
    from importlib import import_module

    tuner = import_module(pl.__name__ + ".tuner").Tuner(t)
    tuner.lr_find(model, loader, num_training=6, early_stop_threshold=None, update_attr=False)
    ctx.rank = t.global_rank
    model.consume = True
    fit(t)


@scenario("lightning", "signature")
def pl_fit_validate_fit(ctx):
    """fit -> validate -> fit, extra outputs kept from the first fit."""
    pl, trainer, model, fit, loader = _lightning(ctx, carrier="outputs")
    t = trainer()
    fit(t)
    ctx.rank = t.global_rank
    t.validate(model, loader, verbose=False)
    model.consume = True
    t.fit_loop.max_epochs += 1
    fit(t)


def _rewrap_callback(pl, consume: bool):
    class Rewrap(pl.Callback):
        """At the start of epoch 1, wrap the module again (what a finetuning fix does)."""

        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 1:
                strategy = trainer.strategy
                strategy.model = strategy._setup_model(strategy.lightning_module)
                pl_module.consume = consume

    return Rewrap()


@scenario("lightning", "signature", quick=True)
def pl_callback_rewraps_mid_fit(ctx):
    """A callback re-wraps the model at epoch 1; extra outputs of epoch 0 feed epoch 1's loss."""
    pl, _ = import_lightning(ctx.import_name)
    _, trainer, model, fit, _ = _lightning(ctx, carrier="outputs", max_epochs=2,
                                           extra_callbacks=[_rewrap_callback(pl, True)])
    fit(trainer())


@scenario("lightning", "signature")
def pl_second_fit_manual_optimization(ctx):
    """Second fit + kept outputs, with manual optimization."""
    _second_fit(ctx, carrier="outputs", manual=True)


@scenario("lightning", "signature")
def pl_second_fit_accumulation(ctx):
    """Second fit + kept outputs, with accumulate_grad_batches=2."""
    _second_fit(ctx, carrier="outputs", accumulate=2)


@scenario("lightning", "signature")
def pl_second_fit_validation(ctx):
    """Second fit + kept outputs, with validation every epoch."""
    _second_fit(ctx, carrier="outputs", validate=True)


@scenario("lightning", "signature")
def pl_second_fit_checkpoint_every_step(ctx):
    """Second fit + kept outputs, with a checkpoint saved every step."""
    _second_fit(ctx, carrier="outputs", checkpoint=True)


# ---- garbage-collector timing ---------------------------------------------------------------

_AGING: list = []


def _garbage(ctx):
    """Per-rank, per-step amounts of cyclic garbage that lives a while (as uneven data, logging
    and caches make it), so each process reaches its next full collection at its own time."""
    for _ in range(ctx.rng.randint(0, 60000)):
        a: list = []
        a.append(a)
        _AGING.append(a)
    del _AGING[:-40000]


@scenario("gc", "signature-sometimes", quick=True)
def gc_random_collections(ctx):
    """Old wrapper kept in a reference cycle; each rank collects at its own random step of fit 2."""
    _second_fit(ctx, carrier="bank", cycle=True, gc_mode="random")


@scenario("gc", "signature-sometimes")
def gc_natural(ctx):
    """Old wrapper kept in a reference cycle; the collector left alone, uneven garbage per rank."""
    _second_fit(ctx, carrier="bank", cycle=True, gc_mode="natural")


# ---- controls -------------------------------------------------------------------------------

@scenario("control", "ok", quick=True)
def control_second_fit_no_carrier(ctx):
    """trainer.fit() twice, nothing kept across: clean."""
    _second_fit(ctx)


@scenario("control", "ok")
def control_lr_find_then_fit_no_carrier(ctx):
    """lr_find then fit, nothing kept across: clean."""
    pl, trainer, model, fit, loader = _lightning(ctx)
    t = trainer()
    from importlib import import_module

    import_module(pl.__name__ + ".tuner").Tuner(t).lr_find(
        model, loader, num_training=6, early_stop_threshold=None, update_attr=False)
    fit(t)


@scenario("control", "ok")
def control_fit_validate_fit_no_carrier(ctx):
    """fit -> validate -> fit, nothing kept across: clean."""
    pl, trainer, model, fit, loader = _lightning(ctx)
    t = trainer()
    fit(t)
    t.validate(model, loader, verbose=False)
    t.fit_loop.max_epochs += 1
    fit(t)


@scenario("control", "ok")
def control_rewrap_no_carrier(ctx):
    """A callback re-wraps mid-fit, nothing kept across: clean."""
    pl, _ = import_lightning(ctx.import_name)
    _, trainer, model, fit, _ = _lightning(ctx, max_epochs=2,
                                           extra_callbacks=[_rewrap_callback(pl, False)])
    fit(trainer())


@scenario("control", "ok", quick=True)
def control_bank_one_fit(ctx):
    """A memory bank through the live wrapper, consumed in the same fit: clean."""
    pl, trainer, model, fit, _ = _lightning(ctx, carrier="bank", max_epochs=2)

    class ConsumeFromEpoch1(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            pl_module.consume = trainer.current_epoch == 1

    t = trainer()
    t.callbacks.append(ConsumeFromEpoch1())
    fit(t)


@scenario("control", "ok")
def control_outputs_kept_one_fit(ctx):
    """Extra outputs kept without detach, never used across a wrapper: clean."""
    _, trainer, model, fit, _ = _lightning(ctx, carrier="outputs")
    fit(trainer())


# --------------------------------------------------------------------------------------------
# One rank of one run (``--worker``)
# --------------------------------------------------------------------------------------------

class Ctx:
    def __init__(self, args):
        self.rank = int(os.environ["RANK"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", str(self.rank)))
        self.gpu = args.accelerator == "gpu"
        self.world_size = int(os.environ.get("WORLD_SIZE", "2"))
        self.per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(self.world_size)))
        self.nodes = self.world_size // self.per_node
        self.import_name = args.import_name
        self.collective_timeout = args.collective_timeout
        self.tmp = args.out
        self.rng = random.Random(f"{args.seed}-{self.rank}")
        self.gc_steps = {self.rng.randint(1, 8) + 8}  # one collection during fit 2, per rank


def worker(args) -> None:
    if "RANK" not in os.environ:  # started by hand or by the orchestrator: start the peers
        _start_peers(args.ranks_per_node)
    ctx = Ctx(args)
    text = ""
    try:
        RUNNERS[args.worker](ctx)
    except BaseException:  # noqa: B036  (every failure is an outcome to classify)
        text = traceback.format_exc()
    rank = ctx.rank
    outcome = {"rank": rank, "outcome": classify(text), "step": STEP[0],
               "error": text.strip().splitlines()[-1] if text else None}
    if text:
        outcome["traceback"] = text[-4000:]
    results.write_json(Path(args.out) / f"rank{rank}.json", outcome)
    if text and rank == 0:  # let the peers record their own outcomes before the group is killed
        _teardown_pg()
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not all(
                (Path(args.out) / f"rank{r}.json").exists() for r in range(1, ctx.world_size)):
            time.sleep(0.1)
    elif rank == 0:
        _launch.join()  # a forked peer (fork mode) records its outcome before the group is killed
    sys.stdout.flush()
    os._exit(0 if not text else 1)


def forked_worker(args, name: str, seed: int, folder: Path) -> None:
    """One run in a fork of the orchestrator: fork the peer rank, then be rank 0."""
    args = argparse.Namespace(**{**vars(args), "worker": name, "seed": seed, "out": str(folder)})
    _launch.fork_ranks(args.ranks_per_node)
    worker(args)


def preload(import_name: str) -> str | None:
    """Import torch and Lightning once in the orchestrator; None, or why runs must be fresh."""
    try:
        import torch  # noqa: F401

        import_lightning(import_name)
    except Exception as err:  # each run will report its own import failure
        return f"{type(err).__name__}: {err}"
    return None


def _start_peers(world_size: int):
    """Start ranks 1..world_size-1 before importing anything heavy, so all ranks import torch in
    parallel. The variables are torchrun's (as in the forked mode): Lightning starts no process
    itself."""
    port, run_id = _launch.free_port(), f"fresh-{os.getpid()}"
    os.environ.update(_launch.torchrun_env(world_size, 0, port, run_id))
    for rank in range(1, world_size):
        subprocess.Popen([sys.executable, *sys.argv],
                         env={**os.environ, **_launch.torchrun_env(world_size, rank, port, run_id)})


def _teardown_pg():
    """Close this rank's connections, so that a peer blocked in a collective notices at once.

    What the failed scenario built (trainer, DDP wrapper, reducer) may sit in reference cycles
    that still hold the process group: collect them first, or the sockets stay open.
    """
    gc.collect()
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass
    gc.collect()


def select(args) -> list[Scenario]:
    if args.scenario:
        return [CATALOGUE[args.scenario]]
    chosen = [s for s in CATALOGUE.values() if s.quick or not args.quick]
    if args.filter:
        chosen = [s for s in chosen if re.search(args.filter, s.name)]
    return chosen


def parse_args(argv):
    p = Parser(prog="ddp_weakref_stress.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--quick", action="store_true", help="a representative subset")
    p.add_argument("--scenario", help="run only this scenario")
    p.add_argument("--filter", help="regex on scenario names")
    p.add_argument("--repeat", type=int, help="runs of each GC-timing scenario (3; --quick: 1)")
    p.add_argument("--time-limit", "--budget", dest="budget", type=float, metavar="SECONDS",
                   help="stop starting new runs after this many seconds (--budget: its old name)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 also when a control is not clean or an expected crash is missing")
    p.add_argument("--seed", default="0",
                   help="seed of the GC-timing scenarios; 'random': a new one each run (a flaky "
                        "predicate, as the report saw it)")
    p.add_argument("--out", help="results folder (runs.jsonl, summary.md, per-run logs)")
    p.add_argument("--import-name", default="auto",
                   choices=("auto", "lightning.pytorch", "pytorch_lightning"))
    p.add_argument("--run-timeout", type=float, default=90.0, metavar="SECONDS",
                   help="wall-clock limit of one run (default: 90 s)")
    p.add_argument("--collective-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="the process group's timeout of one collective (default: 30 s)")
    p.add_argument("--fresh-process", action="store_true",
                   help="a new interpreter per rank of every run instead of forks of this process")
    p.add_argument("--nodes", type=int, default=1,
                   help="run each scenario as this many nodes, each a torchrun with c10d rendezvous "
                        "on this machine (as a cluster launches a job)")
    p.add_argument("--ranks-per-node", type=int, default=None,
                   help="ranks of each node (default 2 on one node, 1 with --nodes)")
    p.add_argument("--accelerator", choices=("cpu", "gpu"), default="cpu",
                   help="gpu: NCCL (untested here: no GPU); cpu: gloo")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in filter(None, [args.scenario, args.worker]):
        if name not in CATALOGUE:
            p.error(f"unknown scenario {name!r} (see --list)")
    if args.seed == "random":
        args.seed = random.SystemRandom().randrange(1 << 30)
    elif not args.seed.lstrip("-").isdigit():
        p.error("--seed takes a number or 'random'")
    args.seed = int(args.seed)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.ranks_per_node is None:
        args.ranks_per_node = 2 if args.nodes == 1 else 1
    if args.nodes < 1 or args.ranks_per_node < 1 or args.nodes * args.ranks_per_node < 2:
        p.error("--nodes and --ranks-per-node must be >= 1, with at least 2 ranks in all")
    if args.nodes > 1 and args.accelerator == "gpu" and not args.worker:
        p.error("--nodes with --accelerator gpu starts every node on this machine, each numbering its "
                "GPUs from 0: on a GPU cluster start one torchrun per node (see README), here use "
                "--ranks-per-node")
    return args


def main(argv=None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        for sc in CATALOGUE.values():
            print(f"{sc.name:40} {sc.kind:9} expect {sc.expect:19} {'quick' if sc.quick else '':5} "
                  f"{sc.doc}")
        return
    if args.worker:
        worker(args)
    from tools.stages import stress  # the orchestration: runs under the harness, outcomes, summary

    try:
        stress.orchestrate(args, sys.modules[__name__])
    except KeyboardInterrupt:
        raise
    except UsageError:
        raise
    except Exception as err:
        finish(REPRO, FAIL, None, {"reason": f"harness failure: {type(err).__name__}: {err}"})


if __name__ == "__main__":
    main()
