"""Start the ranks of a run by forking this process, as an external launcher would.

``fork_ranks(n)`` is called after torch and Lightning are imported: it forks ranks 1..n-1 from the
calling process, which becomes rank 0, and gives every rank the environment torchrun gives its
workers (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``, ...). Lightning then sees an external
launcher and starts no interpreter of its own: every rank costs one fork instead of one import.

Fork before anything else happens in the process: no CUDA initialised, no torch operation run
(its intra-op thread pool would be started, and a fork copies only the calling thread), no
process group created. Every forked rank is killed by Linux when rank 0 dies (``PR_SET_PDEATHSIG``).
Under the workspace's harness, the forked ranks' pids are declared in the file named by
``HARNESS_RANKS_FILE``: a forked rank has no rank variables of its own a supervisor could see, and
the harness ends the run when a declared rank dies and rank 0 does not follow.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import socket
import sys
import time

_CHILDREN: list[int] = []
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK")


def launched_externally() -> bool:
    """Does an outer launcher (torchrun, SLURM, MPI, Lightning's own) already run the ranks?"""
    return any(var in os.environ for var in LAUNCHER_VARS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent(parent: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the request: nothing would ever end us
        os._exit(128 + signal.SIGKILL)


def torchrun_env(world_size: int, rank: int, port: int, run_id: str) -> dict[str, str]:
    """The variables torchrun gives rank ``rank`` of a one-node job."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
            "ROLE_NAME": "default", "ROLE_WORLD_SIZE": str(world_size), "NODE_RANK": "0",
            "TORCHELASTIC_RUN_ID": run_id, "RANK": str(rank), "LOCAL_RANK": str(rank),
            "ROLE_RANK": str(rank)}


def _tell_lightning(rank: int) -> None:
    """Lightning reads the rank once, when it is imported (``rank_zero_only.rank``): here that
    was before the fork, so set it as an import under this rank's environment would have."""
    for name, module in list(sys.modules.items()):
        if name.endswith("rank_zero") and hasattr(getattr(module, "rank_zero_only", None), "rank"):
            module.rank_zero_only.rank = rank


def _declare(pids: list[int]) -> None:
    path = os.environ.get("HARNESS_RANKS_FILE")
    if path:
        try:
            with open(path, "a") as fh:
                fh.write("".join(f"{pid}\n" for pid in pids))
        except OSError:
            pass  # no supervisor to tell: the run is not under the harness


def fork_ranks(world_size: int) -> int:
    """Fork ranks 1..world_size-1 of one node; returns this process's rank (0 in the caller)."""
    port, run_id, parent = free_port(), f"fork-{os.getpid()}", os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    rank = 0
    for r in range(1, world_size):
        pid = os.fork()
        if pid == 0:
            _die_with_parent(parent)
            _CHILDREN.clear()
            rank = r
            break
        _CHILDREN.append(pid)
    if rank == 0:
        _declare(_CHILDREN)
    os.environ.update(torchrun_env(world_size, rank, port, run_id))
    _tell_lightning(rank)
    gc.collect()  # every rank starts from a collected heap (see tools/launch/harness.py run_forked)
    return rank


def join(timeout: float = 10.0) -> None:
    """In rank 0: wait (bounded) for the ranks it forked, so they finish their own teardown."""
    deadline = time.monotonic() + timeout
    for pid in _CHILDREN:
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done:
                break
            time.sleep(0.02)
    _CHILDREN.clear()
