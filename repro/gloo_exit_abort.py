#!/usr/bin/env python
"""A ``ddp_spawn`` worker on gloo now and then aborts as it exits, after its fit has finished.

Lightning registers an at-exit ``destroy_process_group`` only when the backend is NCCL
(``lightning.fabric.utilities.distributed._init_dist_connection``). A gloo group is left to
interpreter shutdown, where gloo's worker threads may still hold work with Python references:
freeing it then can end the process with "terminate called without an active exception"
(SIGABRT). The main process sees "process N terminated with signal SIGABRT" and ``fit`` raises,
although training finished. ``atexit`` handlers do run in ``start_method="spawn"`` workers, so
registering the destroy for every backend reaches them.

The abort is rare (a few fits in a hundred on a 2-core machine), so this repro measures a rate:
``--fits N`` fresh interpreters (default 40), each a 2-rank ``ddp_spawn`` fit on CPU of a few
steps; every one is judged by how it ended. Verdict:

* bad (1): at least one fit ended with a worker killed by SIGABRT after training finished;
  ``details.aborted`` counts them, ``details.rate`` is aborted / fits;
* good (0): every fit ended cleanly;
* skip (125): could not test (an import error, or a fit failed some other way and none aborted).

``--destroy`` (the control) destroys the group in a callback's ``teardown`` (what a test can do
by hand). ``--abort-at-exit`` (the positive control) makes every worker abort in an ``atexit``
handler, to show that an abort is seen. A bad verdict needs a rate above 0; a good one with a
rare abort is only an upper bound (0 of 40 fits: below about 7 % at 95 % confidence). Runs
standalone: ``python repro/gloo_exit_abort.py``; the last stdout line is the JSON verdict.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _contract import BAD, GOOD, SKIP, Parser, finish, import_lightning  # noqa: E402

REPRO = "gloo_exit_abort"
IMPORT_NAMES = ("auto", "lightning.pytorch", "pytorch_lightning")
ABORTED = "terminated with signal SIGABRT"
FINISHED = "[gloo_exit_abort] fit finished"
TRAINED = "[gloo_exit_abort] trained on rank"  # printed by each worker at the end of its fit


def parse_args(argv):
    p = Parser(description=__doc__.split("\n\n")[0], prog="gloo_exit_abort.py")
    p.add_argument("--fits", type=int, default=40, help="fresh 2-rank fits to run (default 40)")
    p.add_argument("--destroy", action="store_true",
                   help="the control: destroy the process group in a callback's teardown")
    p.add_argument("--abort-at-exit", action="store_true",
                   help="the positive control: every worker aborts in an atexit handler")
    p.add_argument("--timeout", type=float, default=120.0, help="limit of one fit, in seconds")
    p.add_argument("--import-name", choices=IMPORT_NAMES, default="auto")
    p.add_argument("--one-fit", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.fits < 1:
        p.error("--fits must be >= 1")
    if args.timeout <= 0:
        p.error("--timeout must be > 0")
    return args


CHILD = "GLOO_EXIT_ABORT_IMPORT"  # set for a fit's interpreter: its import name

if os.environ.get(CHILD):  # a fit and its spawned workers (which import this file again): picklable classes
    pl, _ = import_lightning(os.environ[CHILD])
    import torch

    class Model(pl.LightningModule):
        def __init__(self, abort_at_exit: bool):
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)
            self.abort_at_exit = abort_at_exit

        def training_step(self, batch, batch_idx):
            (x,) = batch
            if self.abort_at_exit and batch_idx == 0:
                import atexit

                atexit.register(os.abort)
            return self.layer(x).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Trained(pl.Callback):
        def on_fit_end(self, trainer, pl_module):
            print(f"{TRAINED} {trainer.global_rank}", flush=True)

    class DestroyGroup(pl.Callback):
        def teardown(self, trainer, pl_module, stage):
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()


def one_fit(args) -> None:
    """One 2-rank ddp_spawn fit in this interpreter (a child of the measuring process)."""
    from torch.utils.data import DataLoader, TensorDataset

    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_steps=3, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[Trained(), *([DestroyGroup()] if args.destroy else [])])
    data = TensorDataset(torch.randn(24, 4))
    trainer.fit(Model(args.abort_at_exit), DataLoader(data, batch_size=4))
    print(FINISHED, flush=True)


def judge(outcomes: list[str], details: dict):
    """(exit code, signature, details) from how each fit ended: clean, aborted or failed."""
    details = dict(details)
    fits = len(outcomes)
    aborted, failed = outcomes.count("aborted"), outcomes.count("failed")
    details.update(fits=fits, aborted=aborted, failed=failed, rate=round(aborted / fits, 3))
    if aborted:
        signature = f"a ddp_spawn worker aborted (SIGABRT) as it exited in {aborted} of {fits} fits"
        details["summary"] = signature
        return BAD, signature, details
    if failed:
        details["reason"] = f"{failed} of {fits} fits failed without an abort (see details.first_failure)"
        return SKIP, None, details
    details["summary"] = f"{fits} of {fits} fits ended cleanly"
    return GOOD, None, details


def outcome(returncode, output: str) -> str:
    """aborted: a worker killed by SIGABRT after both had trained (an abort during training is a
    failure of another kind)."""
    if ABORTED in output and output.count(TRAINED) >= 2 and FINISHED not in output:
        return "aborted"
    return "clean" if returncode == 0 and FINISHED in output else "failed"


def run_one(cmd: list[str], timeout: float) -> tuple[int | None, str]:
    """One fit in a session of its own: on a timeout (or an interrupt) its whole process group,
    the spawned workers included, is killed."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return None, f"timed out after {timeout:g} s\n{output}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.one_fit:
        one_fit(args)
        return
    try:
        _, import_name = import_lightning(args.import_name)
    except ImportError as err:
        finish(REPRO, SKIP, None, {"reason": f"import failed: {err}"})
    details = {"destroy": args.destroy, "abort_at_exit": args.abort_at_exit}
    os.environ[CHILD] = import_name
    child = [sys.executable, os.path.abspath(__file__), "--one-fit", "--import-name", import_name,
             *(["--destroy"] if args.destroy else []), *(["--abort-at-exit"] if args.abort_at_exit else [])]
    outcomes = []
    for i in range(args.fits):
        start = time.monotonic()
        code, output = run_one(child, args.timeout)
        outcomes.append(outcome(code, output))
        if outcomes[-1] == "failed" and "first_failure" not in details:
            details["first_failure"] = (output.strip().splitlines() or ["no output"])[-1][:300]
        took = time.monotonic() - start
        print(f"[gloo_exit_abort] fit {i + 1}/{args.fits}: {outcomes[-1]} ({took:.1f} s); "
              f"aborted so far {outcomes.count('aborted')}", file=sys.stderr, flush=True)
    code, signature, details = judge(outcomes, details)
    finish(REPRO, code, signature, details, import_name)


if __name__ == "__main__":
    main()
