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
    ddps: list = []  # weak references to every DistributedDataParallel built, in order
    checks = 0
    steps = 0  # optimizer steps seen by the torch hook
    last = None  # (step, epoch) of the last check
    mechanism = None
    why = None  # why nothing could be compared
    diverged = None  # the line, once found
    stepped = None  # weak reference to the DDP model the last optimizer step updated
    seconds = 0.0  # spent in the checks, this rank


def every() -> int | None:
    """N from ``WORKSPACE_CHECK_REPLICAS`` (None: at epoch ends)."""
    return int(EVERY) if EVERY.isdigit() and int(EVERY) > 0 else None


# -- hashing ---------------------------------------------------------------------------------

CHUNK = 1 << 24  # elements hashed at a time on an accelerator (bounded temporaries)


def _digests(tensors) -> list:
    """One digest per tensor (its bits, dtype and shape). On the CPU a BLAKE2 hash of the
    tensor's memory (exact); on an accelerator two 64-bit sums of its bits, one plain and one
    weighted by pseudo-random odd numbers, computed there in chunks, with one copy to the host
    per device. A tensor that cannot be read as plain memory (sparse, meta, nested) gets a
    digest naming it as not comparable, the same on every rank."""
    import torch

    out, on_device = [None] * len(tensors), {}
    for i, t in enumerate(tensors):
        t = t.detach()
        key = f"{t.dtype}{tuple(t.shape)}"
        if t.is_sparse or t.device.type == "meta" or getattr(t, "is_nested", False):
            out[i] = f"{key}:not comparable ({t.layout}, {t.device.type})"
            continue
        t = t.resolve_conj().resolve_neg().contiguous().reshape(-1)
        if t.device.type == "cpu":
            out[i] = key + hashlib.blake2b(t.view(torch.uint8).numpy(), digest_size=16).hexdigest()
        else:
            on_device.setdefault(t.device, []).append((i, key, t))
    for device, items in on_device.items():
        sums = []
        for _, _, t in items:
            raw = t.view(torch.uint8)
            bits = raw.view(torch.int32) if raw.numel() % 4 == 0 else raw
            plain = torch.zeros((), dtype=torch.int64, device=device)
            mixed = torch.zeros((), dtype=torch.int64, device=device)
            for at in range(0, bits.numel(), CHUNK):
                part = bits[at:at + CHUNK].to(torch.int64)
                index = torch.arange(at, at + part.numel(), device=device, dtype=torch.int64)
                weights = index * -7046029254386353131 + 1442695040888963407  # wraps: int64
                plain += part.sum()
                mixed += (part * (weights | 1)).sum()
            sums.append(torch.stack([plain, mixed]))
        for (i, key, _), pair in zip(items, torch.stack(sums).cpu().tolist()):  # noqa: B905
            out[i] = f"{key}{pair[0]}:{pair[1]}"
    return out


# -- the check -------------------------------------------------------------------------------

def _world():
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist


def check(named_parameters, *, step: int, epoch: int | None = None, ddp=None, ignore=()) -> None:
    """Compare this rank's parameters (and masks, and DDP's last broadcast buffers) with every
    other rank of ``ddp``'s process group (the default group without one). Every rank must call
    it at the same point: it is one all-gather (two on a mismatch, which every rank then knows
    of). ``ignore``: names DDP itself leaves per rank (``parameters_to_ignore``)."""
    dist = _world()
    group = getattr(ddp, "process_group", None)
    if dist is None or dist.get_world_size(group) < 2:
        _State.why = "one process: no replicas to compare"
        _write()
        return
    started = time.perf_counter()
    try:
        _check(dist, group, named_parameters, step, epoch, ddp, set(ignore))
    finally:
        _State.seconds += time.perf_counter() - started
        _write()


def _check(dist, group, named_parameters, step, epoch, ddp, ignore) -> None:
    pairs = [(n, p) for n, p in named_parameters if n not in ignore]
    names, tensors = [n for n, _ in pairs], [p for _, p in pairs]
    mine = {
        "params": dict(zip(names, _digests(tensors))),  # noqa: B905
        "mask": {n: bool(p.requires_grad) for n, p in pairs},
        "buffers": _buffer_record(ddp),
    }
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    _State.checks += 1
    _State.last = (step, epoch)
    rank = dist.get_rank(group)
    found = _compare(everyone)
    if found is None:
        if rank == 0:
            print(f"replicas agree at step {step}{_epoch(epoch)}: {len(names)} parameters",
                  file=sys.stderr, flush=True)
        return
    differ, total, masks, buffers = found
    head = f"replicas diverged at step {step}{_epoch(epoch)}: "
    _State.diverged = head + _describe(differ, total, masks, buffers, everyone)  # kept, whatever follows
    alike = [n for n in differ[:SHOWN]  # the same dtype and shape everywhere: one broadcast fits all
             if len({str(e["params"].get(n, "")).partition(")")[0] for e in everyone}) == 1]
    sizes = _max_diffs(alike, dict(pairs), dist, group)
    line = head + _describe(differ, total, masks, buffers, everyone, sizes)
    _State.diverged = line
    if rank == 0:
        print(line, file=sys.stderr, flush=True)
    raise ReplicasDiverged(line if rank == 0 else f"rank {rank} stops: rank 0 found the replicas apart")


def _epoch(epoch) -> str:
    return f" (epoch {epoch})" if epoch is not None else ""


def _compare(everyone):
    """(differing parameters, how many, differing masks, differing buffers), or None."""
    ref = everyone[0]
    params = sorted(set().union(*(e["params"] for e in everyone)))
    differ = [n for n in params if any(e["params"].get(n) != ref["params"].get(n) for e in everyone)]
    masks = [n for n in params if any(e["mask"].get(n) != ref["mask"].get(n) for e in everyone)]
    buffers = []
    records = [e["buffers"] for e in everyone]
    if all(records) and len({r[0] for r in records}) == 1:  # taken after the same broadcast everywhere
        names = sorted(set().union(*(r[1] for r in records)))
        buffers = [n for n in names if any(r[1].get(n) != records[0][1].get(n) for r in records)]
    return (differ, len(params), masks, buffers) if differ or masks or buffers else None


def _max_diffs(names, tensors, dist, group) -> dict:
    """max |this rank - rank 0| of each named parameter, over ranks: rank 0's values broadcast,
    the difference taken on each rank's device, reduced with MAX (NaN where a side is NaN)."""

    out = {}
    for n in names:
        t = tensors[n].detach()
        if t.is_sparse or t.device.type == "meta" or not t.numel():
            continue
        mine = t.clone()
        src = dist.get_global_rank(group, 0) if group is not None and hasattr(dist, "get_global_rank") else 0
        dist.broadcast(mine, src=src, group=group)
        diff = (t.double() - mine.double()).abs()
        worst = diff.nan_to_num(nan=float("inf")).max().reshape(1)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
        out[n] = worst.item()
    return out


def _describe(differ, total, masks, buffers, everyone, sizes=None) -> str:
    sizes = sizes or {}
    parts = [f"{n} (max |diff| {sizes[n]:.1e})" if n in sizes else n for n in differ[:SHOWN]]
    parts += differ[SHOWN:SHOWN + 10]
    if len(differ) > SHOWN + 10:
        parts.append(f"and {len(differ) - SHOWN - 10} more")
    text = (f"{len(differ)} of {total} parameters differ: {', '.join(parts)}" if differ
            else f"all {total} parameters agree")
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


def _write() -> None:
    """This process's report, ``REPORT/<pid>.json`` (the workspace merges them)."""
    if not REPORT:
        return
    dist = _world()
    step, epoch = _State.last or (None, None)
    record = {"mechanism": _State.mechanism, "checks": _State.checks, "step": step, "epoch": epoch,
              "steps": _State.steps or None, "diverged": _State.diverged, "why": _State.why,
              "seconds": round(_State.seconds, 4), "rank": dist.get_rank() if dist is not None else None,
              "world": dist.get_world_size() if dist is not None else 1}
    os.makedirs(REPORT, exist_ok=True)
    path = os.path.join(REPORT, f"{os.getpid()}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(record, fh)
    os.replace(path + ".tmp", path)


# -- buffers as DDP broadcast them -----------------------------------------------------------

_BUFFERS = weakref.WeakKeyDictionary()  # DDP model -> (broadcasts seen, {name: digest}) or None
_SYNCS = weakref.WeakKeyDictionary()  # DDP model -> broadcasts seen


def _buffer_record(ddp):
    if ddp is None:
        return None
    record = _BUFFERS.get(ddp)
    _BUFFERS[ddp] = None  # the next broadcast takes a fresh one
    return record


def _after_sync(ddp) -> None:
    """Right after DDP broadcast rank 0's buffers (its ``_sync_buffers``): their hashes, at the
    first broadcast after a check. Local only: no collective here."""
    count = _SYNCS.get(ddp, 0) + 1
    _SYNCS[ddp] = count
    if _BUFFERS.get(ddp, None) is not None:
        return
    named = getattr(ddp, "named_module_buffers", None)
    named = list(named.items()) if isinstance(named, dict) else [
        (n, b) for n, b in ddp.module.named_buffers() if n not in ddp.parameters_to_ignore]
    named = [(n[len("_forward_module."):] if n.startswith("_forward_module.") else n, b) for n, b in named]
    if named:
        digests = _digests([b for _, b in named])
        _BUFFERS[ddp] = (count, dict(zip([n for n, _ in named], digests)))  # noqa: B905


# -- plain torch: step hook, DDP record, destroy_process_group -------------------------------

def install_torch(torch) -> None:
    """Called once torch is imported (``sitecustomize``)."""
    import importlib

    from torch.nn.parallel import DistributedDataParallel

    init = DistributedDataParallel.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._workspace_replica_id = len(_State.ddps)  # the same on every rank: built in one order
        _State.ddps.append(weakref.ref(self))

    DistributedDataParallel.__init__ = recording_init
    sync = getattr(DistributedDataParallel, "_sync_buffers", None)
    if sync is not None:
        def syncing(self, *args, **kwargs):
            result = sync(self, *args, **kwargs)
            _after_sync(self)
            return result

        DistributedDataParallel._sync_buffers = syncing
    module = importlib.import_module("torch.optim.optimizer")
    pre = getattr(module, "register_optimizer_step_pre_hook", None)
    post = getattr(module, "register_optimizer_step_post_hook", None)
    if pre is None or post is None:  # torch < 2.0: only Lightning's callback can check
        return
    pre(_before_step)
    post(_after_step)
    destroy = torch.distributed.destroy_process_group

    def checking_destroy(group=None):
        # not from a rank that is failing (a ``finally`` after an exception): its peers may be
        # inside a collective of their own
        if group is None and not _State.lightning and sys.exc_info()[0] is None and _State.steps \
                and _State.last != (_State.steps, None):
            _torch_check()
        return destroy(group)

    torch.distributed.destroy_process_group = checking_destroy


_DEPTH = [0]  # optimizer steps under way (ZeroRedundancyOptimizer's step runs an inner one)


def _before_step(optimizer, args, kwargs) -> None:
    _DEPTH[0] += 1


def _after_step(optimizer, args, kwargs) -> None:
    _DEPTH[0] -= 1
    if _State.lightning or _DEPTH[0] > 0:
        return
    ddp = _stepped_model(optimizer)
    if ddp is None:
        return
    _State.stepped = weakref.ref(ddp)
    _State.steps += 1
    if _State.steps % (every() or TORCH_EVERY) == 0:
        _torch_check(ddp)


def _stepped_model(optimizer):
    """The newest recorded DDP model whose parameters this optimizer updates (None: a probe's
    optimizer, a rank's own model). The newest, since ranks build their models in one order
    while older wrappers may live on in one rank's garbage and not another's."""
    mine = {id(p) for g in optimizer.param_groups for p in g["params"]}
    for ref in reversed(_State.ddps):
        ddp = ref()
        if ddp is not None and any(id(p) in mine for p in ddp.module.parameters()):
            return ddp
    return None


def _torch_check(ddp=None) -> None:
    _State.mechanism = "torch optimizer step hook"
    ddp = ddp or (_State.stepped() if _State.stepped else None)
    if ddp is None:
        _State.why = "no DistributedDataParallel model took an optimizer step"
        _write()
        return
    check(ddp.module.named_parameters(), step=_State.steps, ddp=ddp, ignore=ddp.parameters_to_ignore)


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
            ignore = {n[len("_forward_module."):] for n in getattr(model, "parameters_to_ignore", ())}
            check(pl_module.named_parameters(), step=trainer.global_step, epoch=trainer.current_epoch,
                  ddp=model, ignore=ignore)

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
