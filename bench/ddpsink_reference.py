"""#20706, torch: why ``_DDPSink`` should keep its weak reference to the DDP instance rather than
hold it strongly again (the alternative a torch reviewer asks about first).

    python bench/ddpsink_reference.py [--rounds 5]

One process, a Gloo group of one rank. Each round wraps a small module in a new
``DistributedDataParallel(find_unused_parameters=True)`` (the case that puts the sink after the
forward), runs one forward and lets the module keep, without ``detach()``, either that output (a
cache) or a value computed from it (a running loss, a memory bank); then it drops every name of
the module and the instance and runs ``gc.collect()``. It counts the instances still alive, with
torch's sink as it is and with the sink's forward patched to keep a strong reference on its
context as well. Prints one JSON line per sink and kept value.
"""

import argparse
import gc
import json
import os
import tempfile
import weakref

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parallel import distributed as ddp_module


class Keeper(torch.nn.Module):
    """A module that keeps its last output as it is, graph and all."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.kept = None

    def forward(self, x):
        return self.layer(x)


KEPT = {"the output": lambda out: out, "a value computed from it": lambda out: out.sum()}


def alive_after_collect(rounds: int, keep) -> int:
    refs = []
    for _ in range(rounds):
        module = Keeper()
        instance = DistributedDataParallel(module, find_unused_parameters=True)
        module.kept = keep(instance(torch.rand(3, 4)))  # instance -> module -> kept -> ... -> sink
        refs.append(weakref.ref(instance))
        del instance, module
    gc.collect()
    return sum(ref() is not None for ref in refs)


def strong_sink():
    """Patch the sink's forward to hold the instance on its context too; returns the undo."""
    forward = ddp_module._DDPSink.forward

    def holding(ctx, ddp_weakref, *inputs):
        ctx.ddp_instance = ddp_weakref()
        return forward(ctx, ddp_weakref, *inputs)

    ddp_module._DDPSink.forward = staticmethod(holding)
    return lambda: setattr(ddp_module._DDPSink, "forward", staticmethod(forward))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="DDP instances made and dropped")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:  # a file store: no port, so two runs at once do not meet
        store = dist.FileStore(os.path.join(folder, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            rows = [("weak reference (as released)", kept, alive_after_collect(args.rounds, keep))
                    for kept, keep in KEPT.items()]
            undo = strong_sink()
            try:
                rows += [("strong reference", kept, alive_after_collect(args.rounds, keep))
                         for kept, keep in KEPT.items()]
            finally:
                undo()
        finally:
            dist.destroy_process_group()
    for sink, kept, alive in rows:
        print(json.dumps({"torch": torch.__version__, "sink": sink, "module keeps": kept,
                          "instances": args.rounds, "alive_after_gc_collect": alive}))


if __name__ == "__main__":
    main()
