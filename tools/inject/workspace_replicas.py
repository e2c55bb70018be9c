"""The replica check behind ``--check-replicas``: DDP keeps every replica bitwise identical after
each optimizer step, so a parameter that differs between ranks is a bug, even when training goes
on silently. Put on a run's path by the workspace (never installed, never imported by it).

With ``WORKSPACE_CHECK_REPLICAS`` set (``epoch`` or a number N), every rank hashes every
parameter and its ``requires_grad`` flag, all ranks all-gather the hashes, and on a mismatch rank 0
prints one line and every rank raises ``ReplicasDiverged``::

    replicas diverged at step 48 (epoch 3): 2 of 4 parameters differ: backbone.weight (max |diff|
    3.1e-03), backbone.bias; trainable masks agree

Two ways in, both without editing the script:

- Lightning (>= 1.7): ``ReplicaCheck``, a callback Lightning itself adds to every ``Trainer``
  through its ``callbacks_factory`` entry points (the ``workspace_replicas-0.dist-info`` next to
  this file). It checks at every epoch end (or every N training batches) and at the end of
  training: points every rank reaches, counted by batches, which DDP keeps equal on all ranks.
- plain torch DDP (torch >= 2.0): torch's global optimizer step hook, every N optimizer steps
  (100 for ``epoch``), and once more when the script calls ``destroy_process_group``; the
  ``DistributedDataParallel`` models built are recorded to name the tensors.

Buffers are compared as DDP last broadcast them (``broadcast_buffers``): their hashes are taken
in the forward right after DDP's broadcast, locally, and compared at the next check. Buffers DDP
does not broadcast are per rank by design (BatchNorm without SyncBatchNorm) and left alone.

Rank 0 writes what it did to ``WORKSPACE_CHECK_REPLICAS_REPORT`` (JSON: mechanism, checks,
the last step, the divergence line): the workspace reads it to tell "checked and equal" from
"never checked" (no DDP, an unsupported release), which is never a pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import weakref

SIGNATURE = r"replicas diverged at step \d+"
EVERY = os.environ.get("WORKSPACE_CHECK_REPLICAS", "")
REPORT = os.environ.get("WORKSPACE_CHECK_REPLICAS_REPORT")
TORCH_EVERY = 100  # optimizer steps between checks of a plain torch script at the default
SHOWN = 5  # parameters named with their difference, at most


class ReplicasDiverged(RuntimeError):
    """The replicas of a DDP model are no longer identical."""


class _State:
    lightning = False  # a Trainer runs the check: torch's step hook stands down
    ddps: list = []  # weak references to every DistributedDataParallel built
    checks = 0
    steps = 0  # optimizer steps seen by the torch hook
    last = None  # (step, epoch) of the last check
    mechanism = None
    why = None  # why nothing could be compared
    diverged = None  # the line, once found
    seconds = 0.0  # spent in the checks, this rank


def every() -> int | None:
    """N from ``WORKSPACE_CHECK_REPLICAS`` (None: at epoch ends)."""
    return int(EVERY) if EVERY.isdigit() and int(EVERY) > 0 else None


# -- hashing ---------------------------------------------------------------------------------

def _digests(tensors) -> list:
    """One exact digest per tensor (bytes, dtype and shape). On the CPU a hash of the tensor's
    memory; on an accelerator two integer checksums of its bits computed there, with one copy to
    the host for all of them."""
    import torch

    out, on_device = [None] * len(tensors), []
    for i, t in enumerate(tensors):
        t = t.detach()
        key = f"{t.dtype}{tuple(t.shape)}"
        if t.device.type == "cpu":
            raw = t.contiguous().reshape(-1).view(torch.uint8).numpy()
            out[i] = key + hashlib.blake2b(raw, digest_size=16).hexdigest()
        else:
            on_device.append((i, key, t))
    if on_device:
        ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
        sums = []
        for _, _, t in on_device:
            flat = t.contiguous().reshape(-1)
            bits = flat.view(ints[flat.element_size()]).to(torch.int64)
            weights = torch.arange(1, bits.numel() + 1, device=bits.device, dtype=torch.int64)
            sums.append(torch.stack([bits.sum(), (bits * weights).sum()]))
        for (i, key, _), pair in zip(on_device, torch.stack(sums).cpu().tolist(), strict=True):
            out[i] = f"{key}{pair[0]}:{pair[1]}"
    return out


def _strip(name: str) -> str:
    for prefix in ("_forward_module.", "module."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name


# -- the check -------------------------------------------------------------------------------

def _world():
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist


def check(named_parameters, *, step: int, epoch: int | None = None, ddp=None) -> None:
    """Compare this rank's parameters (and masks, and DDP's last broadcast buffers) with every
    other rank's. Every rank must call it at the same point: it is one all-gather (two on a
    mismatch, which every rank then knows of)."""
    dist = _world()
    if dist is None or dist.get_world_size() < 2:
        _State.why = "one process: no replicas to compare"
        _write()
        return
    started = time.perf_counter()
    try:
        _check(dist, named_parameters, step, epoch, ddp)
    finally:
        _State.seconds += time.perf_counter() - started
        _write(_State.diverged)


def _check(dist, named_parameters, step, epoch, ddp) -> None:
    pairs = [(_strip(n), p) for n, p in named_parameters]
    names, tensors = [n for n, _ in pairs], [p for _, p in pairs]
    mine = {
        "params": dict(zip(names, _digests(tensors), strict=True)),
        "mask": {n: bool(p.requires_grad) for n, p in zip(names, tensors, strict=True)},
        "buffers": _buffer_record(ddp),
    }
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    _State.checks += 1
    _State.last = (step, epoch)
    line = _compare(everyone, dict(zip(names, tensors, strict=True)), dist, step, epoch)
    rank = dist.get_rank()
    if line is None:
        if rank == 0:
            print(f"replicas agree at step {step}{_epoch(epoch)}: {len(names)} parameters",
                  file=sys.stderr, flush=True)
        return
    if rank == 0:
        print(line, file=sys.stderr, flush=True)
    _State.diverged = line
    raise ReplicasDiverged(line if rank == 0 else f"rank {rank} stops: rank 0 found the replicas apart")


def _epoch(epoch) -> str:
    return f" (epoch {epoch})" if epoch is not None else ""


def _compare(everyone, tensors, dist, step, epoch) -> str | None:
    ref = everyone[0]
    params = sorted(set().union(*(e["params"] for e in everyone)))
    differ = [n for n in params if any(e["params"].get(n) != ref["params"].get(n) for e in everyone)]
    masks = [n for n in params if any(e["mask"].get(n) != ref["mask"].get(n) for e in everyone)]
    buffers = []
    records = [e["buffers"] for e in everyone]
    if all(records) and len({r[0] for r in records}) == 1:  # taken at the same forward everywhere
        names = sorted(set().union(*(r[1] for r in records)))
        buffers = [n for n in names if any(r[1].get(n) != records[0][1].get(n) for r in records)]
    if not (differ or masks or buffers):
        return None
    shown = differ[:SHOWN]
    local = [tensors[n].detach().cpu() if n in tensors else None for n in shown]
    gathered = [None] * len(everyone)
    dist.all_gather_object(gathered, local)  # every rank knows the same names differ: all call it
    parts = []
    for i, n in enumerate(shown):
        worst = 0.0
        for other in gathered[1:]:
            a, b = gathered[0][i], other[i]
            if a is not None and b is not None and a.shape == b.shape:
                worst = max(worst, (a.double() - b.double()).abs().max().item() if a.numel() else 0.0)
        parts.append(f"{n} (max |diff| {worst:.1e})")
    parts += differ[SHOWN:SHOWN + 10]
    if len(differ) > SHOWN + 10:
        parts.append(f"and {len(differ) - SHOWN - 10} more")
    text = f"replicas diverged at step {step}{_epoch(epoch)}: "
    text += (f"{len(differ)} of {len(params)} parameters differ: {', '.join(parts)}" if differ
             else f"all {len(params)} parameters agree")
    if masks:
        flags = []
        for n in masks[:SHOWN]:
            ranks = ", ".join(f"{e['mask'].get(n)} on rank {r}" for r, e in enumerate(everyone))
            flags.append(f"{n} ({ranks})")
        text += f"; trainable masks differ (requires_grad): {', '.join(flags)}"
    else:
        text += "; trainable masks agree"
    if buffers:
        text += f"; buffers DDP broadcast differ: {', '.join(buffers[:SHOWN])}"
    return text


def _write(line: str | None = None) -> None:
    line = line or _State.diverged
    dist = _world()
    if not REPORT or (dist is not None and dist.get_rank() != 0):
        return
    step, epoch = _State.last or (None, None)
    record = {"mechanism": _State.mechanism, "checks": _State.checks, "step": step, "epoch": epoch,
              "diverged": line, "why": _State.why, "seconds": round(_State.seconds, 4),
              "world": dist.get_world_size() if dist is not None else 1}
    tmp = f"{REPORT}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(record, fh)
    os.replace(tmp, REPORT)


# -- buffers as DDP broadcast them -----------------------------------------------------------

_BUFFERS = weakref.WeakKeyDictionary()  # DDP model -> (forward count, {name: digest}) or None
_FORWARDS = weakref.WeakKeyDictionary()  # DDP model -> training forwards seen


def _buffer_record(ddp):
    if ddp is None:
        live = [ref() for ref in _State.ddps if ref() is not None]
        ddp = live[-1] if live else None
    if ddp is None:
        return None
    record = _BUFFERS.get(ddp)
    _BUFFERS[ddp] = None  # the next synced forward takes a fresh one
    return record


def _after_broadcast(ddp):
    """A forward pre-hook of DDP's inner module: it runs inside DDP's forward, after DDP has
    broadcast rank 0's buffers (when it does). Local only: no collective here."""

    def hook(module, args):
        count = _FORWARDS.get(ddp, 0) + 1
        _FORWARDS[ddp] = count
        if _BUFFERS.get(ddp, None) is not None or not module.training:
            return
        sync = getattr(ddp, "will_sync_module_buffers", None)
        if not (ddp.broadcast_buffers and (sync() if sync else ddp.require_forward_param_sync)):
            return
        named = [(_strip(n), b) for n, b in module.named_buffers()]
        if named:
            digests = _digests([b for _, b in named])
            _BUFFERS[ddp] = (count, dict(zip([n for n, _ in named], digests, strict=True)))

    return hook


# -- plain torch: step hook, DDP record, destroy_process_group -------------------------------

def install_torch(torch) -> None:
    """Called once torch is imported (``sitecustomize``)."""
    from torch.nn.parallel import DistributedDataParallel

    init = DistributedDataParallel.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _State.ddps.append(weakref.ref(self))
        self.module.register_forward_pre_hook(_after_broadcast(self))

    DistributedDataParallel.__init__ = recording_init
    import importlib

    register = getattr(importlib.import_module("torch.optim.optimizer"),
                       "register_optimizer_step_post_hook", None)
    if register is None:  # torch < 2.0: only Lightning's callback can check
        return
    register(_after_step)
    destroy = torch.distributed.destroy_process_group

    def checking_destroy(group=None):
        if group is None and not _State.lightning and _State.steps and _State.last != (_State.steps, None):
            _torch_check()
        return destroy(group)

    torch.distributed.destroy_process_group = checking_destroy


def _after_step(optimizer, args, kwargs) -> None:
    if _State.lightning:
        return
    _State.steps += 1
    if _State.steps % (every() or TORCH_EVERY) == 0:
        _torch_check()


def _torch_check() -> None:
    live = [ref() for ref in _State.ddps if ref() is not None]
    _State.mechanism = "torch optimizer step hook"
    if not live:
        _State.why = "no DistributedDataParallel model was built"
        _write()
        return
    named = [(f"{i}.{n}" if len(live) > 1 else n, p)
             for i, ddp in enumerate(live) for n, p in ddp.module.named_parameters()]
    check(named, step=_State.steps, ddp=live[-1])


# -- Lightning: a callback from its callbacks_factory entry points ---------------------------

_CLASSES = {"LightningReplicaCheck": "lightning.pytorch", "PLReplicaCheck": "pytorch_lightning"}


def _callback(class_name: str):
    """``ReplicaCheck`` on the ``Callback`` of one import name, made on first use and kept as
    this module's attribute ``class_name`` (so a trainer pickled for ``ddp_spawn`` unpickles)."""
    pl = __import__(_CLASSES[class_name], fromlist=["Callback"])

    class ReplicaCheck(pl.Callback):
        """Checks the replicas at every epoch end (or every N training batches) and at the end
        of training. Counted by batches, equal on every rank under DDP; one check per point."""

        def __init__(self):
            self.batches, self.checked_at = 0, None

        def setup(self, trainer, pl_module, stage=None, *args, **kwargs):
            _State.lightning = True  # in every rank's process, spawned ones too

        def on_train_batch_end(self, trainer, pl_module, *args, **kwargs):
            self.batches += 1
            if every() and self.batches % every() == 0:
                self._check(trainer, pl_module)

        def on_train_epoch_end(self, trainer, pl_module, *args, **kwargs):
            if every() is None:
                self._check(trainer, pl_module)

        def on_train_end(self, trainer, pl_module, *args, **kwargs):
            self._check(trainer, pl_module)

        def _check(self, trainer, pl_module):
            if self.checked_at == self.batches:
                return
            self.checked_at = self.batches
            _State.mechanism = "Lightning callback"
            from torch.nn.parallel import DistributedDataParallel

            model = getattr(trainer.strategy, "model", None)
            if not isinstance(model, DistributedDataParallel):
                if _world() is not None:  # sharded or other strategies: replicas are not copies
                    _State.why = f"the strategy ({type(trainer.strategy).__name__}) wraps no DDP model"
                    _write()
                    return
                model = None
            check(pl_module.named_parameters(), step=trainer.global_step, epoch=trainer.current_epoch,
                  ddp=model)

    ReplicaCheck.__name__ = ReplicaCheck.__qualname__ = class_name
    ReplicaCheck.__module__ = __name__
    globals()[class_name] = ReplicaCheck
    return ReplicaCheck


def __getattr__(name):
    if name in _CLASSES:
        return _callback(name)
    raise AttributeError(name)


def _factory(class_name: str):
    if not EVERY:
        return []
    _State.lightning = True
    return [globals().get(class_name) or _callback(class_name)]


def lightning_factory():
    """Entry point of ``lightning.pytorch.callbacks_factory``."""
    return [cls() for cls in _factory("LightningReplicaCheck")]


def pytorch_lightning_factory():
    """Entry point of ``pytorch_lightning.callbacks_factory``."""
    return [cls() for cls in _factory("PLReplicaCheck")]
