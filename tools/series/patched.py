"""Environments with patches of the series applied: a throwaway copy of a cell's environment
(uv, hard links), the series' Lightning patches applied to its installed package, and a run in it."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import tempfile
from pathlib import Path

from tools.environments import envs, index
from tools.launch import harness
from tools.launch.launcher import Launcher, Run
from tools.series import patches

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache"


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


@contextlib.contextmanager
def scratch(prefix: str):
    """A temporary folder for throwaway environments, removed however the block ends.

    The removal runs in a session of its own and is waited for: neither a Ctrl-C nor a kill of
    this process stops it halfway (removing a torch environment takes about 0.4 s; plain nox
    SIGKILLs a command 0.5 s after Ctrl-C).
    """
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        subprocess.Popen(["rm", "-rf", "--", str(folder)], start_new_session=True).wait()


def _uv(cmd: list[str], **kwargs) -> None:
    """``subprocess.run(cmd, check=True)``; when interrupted, uv is killed and waited for: it
    must be gone before the folder it writes into is removed, or it writes on into the removal.

    SIGINT and SIGTERM are held while Popen starts uv: one landing inside Popen (it waits there
    for uv's exec) would leave a uv that nothing kills or waits for. Held, it lands once ``proc``
    can be killed. uv starts with them held too, and is killed with SIGKILL."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        proc = subprocess.Popen(cmd, **kwargs)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        raise
    with proc:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a signal held meanwhile lands here
            code = proc.wait()
        except BaseException:
            # a second signal (plain nox sends SIGTERM 0.3 s after Ctrl-C) must not cut this
            # wait short: uv would be left unreaped, perhaps still writing, while the folder goes
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                proc.kill()
                proc.wait()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            raise
    if code:
        raise subprocess.CalledProcessError(code, cmd)


def throwaway(args: list[str], folder: Path, like: Path | None = None) -> Path:
    """A new environment in ``folder`` (in a ``scratch`` folder: removed even on an interrupt).
    ``like``: the Python of an environment made from the same requirements (the cell's): its
    bytecode is linked in rather than compiled again."""
    python = folder / "bin" / "python"
    _uv([index.uv(), "venv", "--quiet", "--python", "3.11", str(folder)])
    if like is None:
        _uv([index.uv(), "pip", "install", "--quiet", "--python", str(python), *args], env=envs.uv_env())
    else:
        _uv([index.uv(), "pip", "install", "--quiet", "--no-compile-bytecode", "--python", str(python),
             *args])
        envs.link_bytecode(site_packages(like), site_packages(python))
    return python


def run(patch: patches.Patch, python: Path, log_stem: Path) -> harness.RunResult:
    script, *rest = patch.repro
    return Launcher().run(Run((str(ROOT / script), *rest), python, log_stem=log_stem))


def patched_env(args: list[str], folder: Path, applied: list[patches.Patch],
                like: Path | None = None) -> Path:
    """A throwaway environment of the cell with ``applied`` patched into its installed files
    (``like``: see ``throwaway``)."""
    python = throwaway(args, folder, like)
    for p in applied:
        root, level = patches.installed_root(site_packages(python), p)
        patches.apply(p, root, level, patches.installable_for(p, root))
    return python
