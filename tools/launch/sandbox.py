"""The sandbox for untrusted code (a script pasted in an issue), on bubblewrap.

What runs inside sees the machine's system folders, its interpreter's environment and the
folders it was given, all read-only; a HOME, a TMPDIR (also at ``/tmp``), ``/dev/shm`` and its
working folder on one size-limited tmpfs (``DISK``) that vanishes with it; a private ``/proc``
(its own processes only), a minimal ``/dev``, no ``/sys`` but the CPU list, no ``/run`` or host
HOME; loopback only (a network namespace of its own: no route out, no abstract socket of the
host). It runs as an unprivileged user with no capabilities and ``no_new_privs``, under a seccomp
filter that refuses mount, umount, setns, unshare, new user namespaces, ptrace, bpf, the
kernel's keyrings and the like (``DENIED``), with limits on its processes (``PIDS``), memory
(``MEMORY``, where this machine's cgroups allow) and core files (none).

Started as root, the run is dropped to ``nobody`` (``setpriv``) after bubblewrap built the
sandbox: root outside is nobody inside. Started as another user, bubblewrap runs unprivileged,
in a user namespace of its own, as that user.

How it is put together: a trusted shell (``OUTER``) in a private mount namespace mounts the
tmpfs, joins the run's cgroups, copies the given working folder in, runs bubblewrap, and once
everything inside is dead copies what the run must hand back (``outputs``: the replica check's
reports, the nodes' logs; regular files only, ``OUTPUT_CAP`` bytes each) to the host. Nothing
the code writes reaches the host otherwise; its stdout and stderr go to the harness, which caps
them (``LOG_LIMIT``).

``unavailable()`` says why the sandbox cannot be made here (bubblewrap missing, no user
namespaces, no libseccomp); ``up()`` installs bubblewrap (root and apt-get) and checks it.
Everything a sandboxed run leaves on the host is a folder named for its owner process (``leftovers.owned``):
a SIGKILLed owner's is swept by the next run (``leftovers.sweep``), its cgroups by the next
sandbox (``sweep_cgroups``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tools.core import contract, packages
from tools.launch import harness, leftovers


def _mib(name: str, default: int) -> int:
    """A limit (in MiB, or a count) from the variable ``name`` (a machine with other needs sets
    it), in bytes."""
    try:
        return max(1, int(os.environ.get(name, default))) << 20
    except ValueError:
        raise contract.BadInput(f"{name} must be a whole number") from None


DISK = _mib("WORKSPACE_SANDBOX_DISK_MIB", 1024)  # HOME, TMPDIR, /dev/shm and the working folder together
MEMORY = _mib("WORKSPACE_SANDBOX_MEMORY_MIB", 8192)  # where the cgroups allow
LOG_LIMIT = _mib("WORKSPACE_SANDBOX_LOG_MIB", 64)  # of stdout and of stderr, kept in the run's logs
OUTPUT_CAP = 16 << 20  # bytes of each file handed back (its end: a log's traceback is there)
OUTPUT_FILES = 64  # files handed back, at most
OUTPUT_TOTAL = 32 << 20  # bytes handed back by one run, at most (a sparse file's too)
INODES = 65536  # files and folders on the tmpfs (each costs the kernel memory, whatever its size)
# the first program inside, trusted: says on fd 5 that bubblewrap built the sandbox, then becomes
# the run (a bubblewrap that failed never gets here: its own message is no verdict)
STARTED = ("/bin/sh", "-c", 'printf started >&5 && exec 5>&- && exec "$@"', "sandbox")
# processes and threads: a cgroup's pids.max where the cgroups allow, and RLIMIT_NPROC (per user)
PIDS = _mib("WORKSPACE_SANDBOX_PIDS", 2048) >> 20
UID = GID = 65534  # nobody: who a run started by root is inside
HOME, TMP, WORK = "/sandbox/home", "/sandbox/tmp", "/sandbox/work"
SETUP_FAILED = 97  # the trusted shell could not build the sandbox (never a verdict)
ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "bubblewrap"

# what a sandboxed run gets of this process's environment (no tokens, no credentials)
PASSED_ENV = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "PYTHONUNBUFFERED",
              "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "NO_COLOR", "PYTHONDONTWRITEBYTECODE")
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = ("passwd", "group", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
       "localtime", "os-release", "mime.types")
NETWORK_ETC = ("resolv.conf", "host.conf", "gai.conf", "ssl", "ca-certificates", "ca-certificates.conf")
# refused with EPERM inside: what changes mounts or namespaces, debugs or loads into the kernel
DENIED = ("mount", "umount", "umount2", "pivot_root", "chroot", "setns", "unshare", "ptrace",
          "process_vm_readv", "process_vm_writev", "bpf", "perf_event_open", "userfaultfd",
          "keyctl", "add_key", "request_key", "init_module", "finit_module", "delete_module",
          "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct", "syslog",
          "open_by_handle_at", "name_to_handle_at", "quotactl", "lookup_dcookie", "vhangup",
          "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
          "io_uring_setup", "io_uring_enter", "io_uring_register", "personality")
CLONE_NEWUSER, TIOCSTI = 0x10000000, 0x5412
# socket families refused inside (and every one from 17 on): all but AF_UNIX (1), AF_INET (2),
# AF_INET6 (10) and AF_NETLINK (16); AF_VSOCK (40) reaches the host whatever the namespaces
SOCKET_FAMILIES_DENIED = (0, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15)

# The trusted shell, in a mount namespace of its own: the tmpfs over the sandbox's folder, the
# cgroups, the working folder copied in; then bubblewrap ("$@"); then, everything inside dead,
# the outputs copied out (regular files only, capped) and how full the disk got.
OUTER = r"""
set -u
fail() { echo "sandbox setup failed: $1" >&2; exit 97; }
printf '%s\n' "$SANDBOX_CGROUPS" | while IFS= read -r cg; do
  [ -z "$cg" ] || echo $$ > "$cg/cgroup.procs" || exit 1; done || fail "cannot join its cgroups"
options="size=$SANDBOX_DISK,nr_inodes=$SANDBOX_INODES,mode=0755,nosuid,nodev"
mount -t tmpfs -o "$options" sandbox "$SANDBOX_DIR" || fail "no tmpfs"
cd "$SANDBOX_DIR" || fail "no folder"
mkdir home tmp work shm out || fail "mkdir"
if [ -n "$SANDBOX_CWD" ]; then cp -a -- "$SANDBOX_CWD/." work/ || fail "cannot copy the working folder"; fi
i=0; printf '%s\n' "$SANDBOX_OUTPUTS" | while IFS= read -r line; do
  [ -n "$line" ] && { mkdir "out/$i" || exit 1; }; i=$((i + 1)); done || fail "mkdir"
chmod 1777 tmp shm || fail "chmod"
[ "$SANDBOX_OWNER" = "" ] || chown -R "$SANDBOX_OWNER" home work out || fail "chown"
"$@" 3<"$SANDBOX_SECCOMP" 5>"$SANDBOX_STARTED"
rc=$?
i=0; n=0; left=$SANDBOX_OUTPUT_TOTAL
printf '%s\n' "$SANDBOX_OUTPUTS" | while IFS="$(printf '\t')" read -r pattern host; do
  [ -n "$host" ] || continue
  for f in "out/$i"/$pattern; do
    [ "$n" -lt "$SANDBOX_OUTPUT_FILES" ] && [ "$left" -gt 0 ] || break
    [ -f "$f" ] && [ ! -h "$f" ] || continue
    size=$(stat -c %s -- "$f"); [ "$size" -le "$SANDBOX_OUTPUT_CAP" ] || size=$SANDBOX_OUTPUT_CAP
    [ "$size" -le "$left" ] || size=$left
    tail -c "$size" -- "$f" > "$host/${f##*/}" && n=$((n + 1)) && left=$((left - size))
  done
  i=$((i + 1)); done
set -- $(stat -f -c "%b %a %S %f %d" .)
echo "$(( ($1 - $2) * $3 )) $5" > "$SANDBOX_USED"
exit $rc
"""


class Unavailable(contract.BadInput):
    """The sandbox cannot be made on this machine (one line: why, and what to do)."""


def up(log=print) -> None:
    """Install bubblewrap when it is missing (root, apt-get), then check that the sandbox works
    here; ``Unavailable`` says why not."""
    packages.install((PACKAGE,), ("bwrap",), "sandbox", Unavailable, log)
    why = unavailable()
    if why:
        raise Unavailable(why)
    log("[sandbox] the sandbox works here")


_WHY: list[str | None] = []


def unavailable() -> str | None:
    """Why the sandbox cannot be made here, or None when it can (tried once per process: a
    sandboxed ``true``)."""
    if not _WHY:
        _WHY.append(_probe())
    return _WHY[0]


def _probe() -> str | None:
    missing = [b for b in ("bwrap", "unshare", "setpriv", "prlimit")
               if not shutil.which(b, path="/usr/sbin:/usr/bin:/sbin:/bin")]
    if missing:
        return (f"no sandbox here: {', '.join(missing)} not installed (`nox -s sandbox_up` as root "
                f"installs {PACKAGE})")
    try:
        seccomp_filter()
    except OSError as err:
        return f"no sandbox here: no seccomp filter ({err})"
    with Sandbox(["true"], {"PATH": "/usr/bin:/bin"}) as box:
        try:
            proc = subprocess.run(box.argv, env=box.outer_env, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"no sandbox here: {err}"
    if proc.returncode != 0:
        said = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return f"no sandbox here: bubblewrap failed ({said}; user namespaces may be off)"
    return None


# -- the seccomp filter, from libseccomp -------------------------------------------------------------

class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


_FILTER: list[bytes] = []


def seccomp_filter() -> bytes:
    """The compiled (BPF) filter for this machine's architecture, made by libseccomp: every
    syscall allowed but ``DENIED`` (EPERM), ``clone`` with a new user namespace (EPERM),
    ``clone3`` (ENOSYS: its flags cannot be inspected, and the C library then falls back to
    ``clone``), sockets of other families than unix, IPv4, IPv6 and netlink (EAFNOSUPPORT) and
    the ``TIOCSTI`` ioctl (typing into a terminal). OSError without libseccomp."""
    if _FILTER:
        return _FILTER[0]
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    lib = ctypes.CDLL(name, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    allow, equal, at_least, masked_eq = 0x7FFF0000, 4, 5, 7

    def refuse(err: int) -> int:
        return 0x00050000 | err  # SCMP_ACT_ERRNO

    ctx = lib.seccomp_init(allow)
    if not ctx:
        raise OSError("seccomp_init failed")
    try:
        def rule(action, syscall, *cmps):
            nr = lib.seccomp_syscall_resolve_name(syscall.encode())
            if nr < 0:  # not on this architecture
                return
            array = (_ArgCmp * len(cmps))(*cmps) if cmps else None
            if lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), array) < 0:
                raise OSError(f"seccomp rule for {syscall} refused")

        for syscall in DENIED:
            rule(refuse(errno.EPERM), syscall)
        rule(refuse(errno.EPERM), "clone", _ArgCmp(0, masked_eq, CLONE_NEWUSER, CLONE_NEWUSER))
        rule(refuse(errno.ENOSYS), "clone3")
        for family in SOCKET_FAMILIES_DENIED:  # loopback only: no vsock, no bluetooth, no kernel crypto
            rule(refuse(errno.EAFNOSUPPORT), "socket", _ArgCmp(0, equal, family, 0))
        rule(refuse(errno.EAFNOSUPPORT), "socket", _ArgCmp(0, at_least, 17, 0))
        rule(refuse(errno.EPERM), "ioctl", _ArgCmp(1, masked_eq, 0xFFFFFFFF, TIOCSTI))
        read, write = os.pipe()
        try:
            if lib.seccomp_export_bpf(ctx, write) < 0:
                raise OSError("seccomp_export_bpf failed")
            os.close(write)
            write = -1
            chunks = []
            while chunk := os.read(read, 1 << 16):
                chunks.append(chunk)
        finally:
            os.close(read)
            if write >= 0:
                os.close(write)
    finally:
        lib.seccomp_release(ctx)
    _FILTER.append(b"".join(chunks))
    return _FILTER[0]


# -- one sandboxed run -------------------------------------------------------------------------------

def _which(program: str) -> str:
    """A program of the system's (the privileged helpers: never one found on a run's PATH)."""
    found = shutil.which(program, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if not found:
        raise Unavailable(f"no sandbox here: {program} not installed")
    return found


def interpreter_folders(python: str | Path) -> list[Path]:
    """What an interpreter needs to run: its environment (a venv's folder) and the installation
    it was made from (``home`` of ``pyvenv.cfg``), or its own installation."""
    python = Path(python).absolute()
    found = []
    venv = python.parent.parent
    cfg = venv / "pyvenv.cfg"
    if cfg.is_file():
        found.append(venv)
        for line in cfg.read_text(errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                found.append(Path(value.strip()).parent)
    found.append(Path(os.path.realpath(python)).parent.parent)
    return found


def _nested_out(paths) -> list[Path]:
    """``paths`` without those inside another one (a bind of the outer one shows them)."""
    kept: list[Path] = []
    for p in sorted({Path(os.path.realpath(p)) for p in paths}, key=lambda p: len(p.parts)):
        if not any(p == k or p.is_relative_to(k) for k in kept):
            kept.append(p)
    return kept


def _cgroup_parents() -> list[tuple[Path, list[tuple[str, int]]]]:
    """This process's own cgroups that can limit memory or processes (v1 hierarchies or v2),
    each with the limits to write into a child of it."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: where the memory and pids controllers are enabled for children
            base = next((b for b in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
                         if (b / "cgroup.controllers").exists()), None)
            if base is None:
                continue
            control = base / path.lstrip("/") / "cgroup.subtree_control"
            enabled = control.read_text().split() if control.exists() else []
            limits = [(f, v) for c, f, v in (("memory", "memory.max", MEMORY), ("pids", "pids.max", PIDS))
                      if c in enabled]
        elif "memory" in controllers.split(","):
            base, limits = Path("/sys/fs/cgroup/memory"), [("memory.limit_in_bytes", MEMORY)]
        elif "pids" in controllers.split(","):
            base, limits = Path("/sys/fs/cgroup/pids"), [("pids.max", PIDS)]
        else:
            continue
        parent = base / path.lstrip("/")
        if limits and parent.is_dir():
            found.append((parent, limits))
    return found


def _cgroups(name: str) -> tuple[list[Path], list[Path]]:
    """Cgroups made for one run, with its limits, where this machine lets us: (those that limit
    memory, those that limit processes, all)."""
    memory, pids, made = [], [], []
    for parent, limits in _cgroup_parents():
        group = parent / name
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            for file, value in limits:
                (group / file).write_text(str(value))
        except OSError:
            group.rmdir()
            continue
        made.append(group)
        files = [f for f, _ in limits]
        if any(f.startswith("memory") for f in files):
            memory.append(group)
        if "pids.max" in files:
            pids.append(group)
    return memory, pids, made


def sweep_cgroups(log=print) -> None:
    """Remove the cgroups of sandboxes whose owner process is gone (a SIGKILLed triage)."""
    for parent, _ in _cgroup_parents():
        for group in parent.glob("sandbox-*"):
            if not leftovers.owner_alive(group.name):
                try:
                    group.rmdir()
                    log(f"[sweep] removed the cgroup {group} of a sandbox whose owner is gone")
                except OSError:
                    pass


def _oom_killed(group: Path) -> bool:
    for file, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
        try:
            for line in (group / file).read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == key and int(v) > 0:
                    return True
        except (OSError, ValueError):
            continue
    return False


@dataclass
class Sandbox:
    """One sandboxed run of ``command`` with the variables ``env`` (nothing else of this
    process's), as a context manager: ``argv`` and ``env`` are what to start (one process group,
    under the harness); ``judge`` corrects the harness's result (a disk or memory limit reached
    is "could not test", a sandbox that could not be built a harness failure). ``cwd``: a folder
    whose copy the run starts in (else an empty one); ``visible``: more folders it may read;
    ``outputs``: (host folder, file pattern) pairs: the run writes into the folder (at the same
    path inside), and the files that match come back after it (``OUTPUT_FILES`` at most, the
    last ``OUTPUT_CAP`` bytes of each, regular files only); ``network``: the machine's network
    instead of loopback only."""

    command: list[str]
    env: dict
    cwd: Path | None = None
    visible: tuple = ()
    outputs: tuple = ()
    network: bool = False
    argv: list[str] = field(default_factory=list)
    outer_env: dict = field(default_factory=dict)
    folder: Path | None = None
    memory_groups: list[Path] = field(default_factory=list)
    groups: list[Path] = field(default_factory=list)

    def __enter__(self) -> Sandbox:
        self.folder = leftovers.owned_tempdir("sandbox")
        try:
            self._prepare()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for group in self.groups:
            try:
                group.rmdir()
            except OSError:
                pass
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _prepare(self) -> None:
        root = os.geteuid() == 0
        if root:
            self._readable()
        for out, _ in self.outputs:
            if "\n" in str(out) or "\t" in str(out):
                raise contract.BadInput(f"a folder with a line break or tab in its name: {out!r}")
            Path(out).mkdir(parents=True, exist_ok=True)
        inside = self.folder / "mnt"
        inside.mkdir()
        (self.folder / "seccomp.bpf").write_bytes(seccomp_filter())
        pids_groups = []
        if root:
            sweep_cgroups()
            self.memory_groups, pids_groups, self.groups = _cgroups(self.folder.name)
        env = {**self.env, "HOME": HOME, "TMPDIR": TMP, "XDG_CACHE_HOME": f"{HOME}/.cache",
               "USER": "nobody" if root else os.environ.get("USER", "user")}
        workdir = str(self.cwd) if self.cwd else WORK
        bwrap = [_which("bwrap"), "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
                 "--die-with-parent", "--hostname", "sandbox", "--seccomp", "3",
                 *([] if self.network else ["--unshare-net"])]
        if root:  # privileged bwrap keeps only what setpriv needs to drop to nobody
            bwrap += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
        else:
            bwrap += ["--unshare-user", "--disable-userns"]
        bwrap += ["--proc", "/proc", "--dev", "/dev"]
        for path in SYSTEM:
            if os.path.islink(path):
                bwrap += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                bwrap += ["--ro-bind", path, path]
        bwrap += ["--perms", "0755", "--dir", "/etc"]  # (privileged bwrap makes the folders 0700)
        hosts = self.folder / "hosts"  # the sandbox's own name resolves (gloo looks it up)
        hosts.write_text("127.0.0.1 localhost sandbox\n::1 localhost\n")
        bwrap += ["--ro-bind", str(hosts), "/etc/hosts"]
        for name in ETC + (NETWORK_ETC if self.network else ()):
            bwrap += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        for folder in ("/sys", "/sys/devices", "/sys/devices/system"):
            bwrap += ["--perms", "0755", "--dir", folder]
        bwrap += ["--ro-bind-try", "/sys/devices/system/cpu", "/sys/devices/system/cpu"]
        bwrap += ["--bind", f"{inside}/shm", "/dev/shm", "--remount-ro", "/dev"]
        bwrap += [*self._mounts(inside, workdir), "--remount-ro", "/"]  # (unprivileged, / would be its own)
        bwrap += ["--clearenv"]
        for key in sorted(env):
            bwrap += ["--setenv", key, str(env[key])]
        bwrap += ["--chdir", workdir, "--"]
        # the programs that run with privileges inside by absolute path: never one of the run's PATH
        limits = [_which("prlimit"), "--core=0", "--"]
        if not pids_groups:  # per user: every sandbox of root's is nobody, so a cgroup is better
            limits[1:1] = [f"--nproc={PIDS}"]
        setpriv = _which("setpriv")
        drop = ([setpriv, f"--reuid={UID}", f"--regid={GID}", "--clear-groups", "--no-new-privs",
                 "--bounding-set=-all", "--inh-caps=-all", "--"] if root else [])
        unshare = [_which("unshare"), "--mount", "--propagation", "private"]
        if not root:  # the mount needs the namespace's capabilities; bwrap refuses to start with them
            unshare[1:1] = ["--user", "--map-current-user", "--keep-caps"]
            bwrap = [setpriv, "--inh-caps=-all", "--ambient-caps=-all", "--", *bwrap]
        self.argv = [*unshare, "--", "/bin/sh", "-c", OUTER, "sandbox", *bwrap, *STARTED, *limits, *drop,
                     *self.command]
        self.outer_env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SANDBOX_DIR": str(inside), "SANDBOX_DISK": str(DISK),
            "SANDBOX_CWD": str(self.cwd or ""),
            "SANDBOX_OUTPUTS": "\n".join(f"{pattern}\t{Path(o).resolve()}" for o, pattern in self.outputs),
            "SANDBOX_OUTPUT_CAP": str(OUTPUT_CAP), "SANDBOX_OUTPUT_FILES": str(OUTPUT_FILES),
            "SANDBOX_OUTPUT_TOTAL": str(OUTPUT_TOTAL), "SANDBOX_INODES": str(INODES),
            "SANDBOX_SECCOMP": str(self.folder / "seccomp.bpf"),
            "SANDBOX_STARTED": str(self.folder / "started"), "SANDBOX_USED": str(self.folder / "used"),
            "SANDBOX_CGROUPS": "\n".join(str(g) for g in self.groups),
            "SANDBOX_OWNER": f"{UID}:{GID}" if root else ""}

    def _mounts(self, inside: Path, workdir: str) -> list[str]:
        """bubblewrap's binds: the folders the run reads (read-only, at their own paths), its
        HOME, TMPDIR, ``/tmp`` and working folder (from the tmpfs) and the outputs; a parent
        before what lies in it, and every folder bubblewrap must make for them readable (it
        makes them 0700 when started by root)."""
        system = [Path(p) for p in SYSTEM]
        mounts = [(p, "--ro-bind", str(p)) for p in _nested_out(self._visible())
                  if not any(p.is_relative_to(s) for s in system)]
        mounts += [(Path(HOME), "--bind", f"{inside}/home"), (Path(TMP), "--bind", f"{inside}/tmp"),
                   (Path("/tmp"), "--bind", f"{inside}/tmp"), (Path(workdir), "--bind", f"{inside}/work")]
        mounts += [(Path(out).resolve(), "--bind", f"{inside}/out/{i}")
                   for i, (out, _) in enumerate(self.outputs)]
        args, done, made = [], [], set()
        for dest, how, source in sorted(mounts, key=lambda m: (len(m[0].parts), str(m[0]))):
            for parent in reversed(dest.parents[:-1]):
                exists = any(parent == d or (parent.is_relative_to(d) and h == "--ro-bind") for d, h in done)
                if not exists and parent not in made:
                    args += ["--perms", "0755", "--dir", str(parent)]
                    made.add(parent)
            args += [how, source, str(dest)]
            done.append((dest, how))
        return args

    def _readable(self) -> None:
        """Started by root, the run is nobody: the files of its command and what its workspace
        variables give (a Lightning checkout, the injected check) must be readable by others. A
        folder made 0700, as pytest's are, would fail it as "cannot open file", or worse, leave
        the installed Lightning in place of a checkout's."""
        paths = [Path(w) for w in self.command if w.startswith("/") and Path(w).is_file()]
        for value in (v for k, v in self.env.items() if k == "PYTHONPATH" or k.startswith("WORKSPACE_")):
            for entry in str(value).split(os.pathsep):
                path = Path(entry)
                if entry and path.is_absolute() and path.exists() and (path.is_dir() or path.suffix == ".py"):
                    paths += [path, *(p for p in (path / "sitecustomize.py",) if p.is_file())]
        for path in paths:
            checks = [(path, 0o005)] if path.is_dir() else [(path, 0o004), (path.parent, 0o005)]
            for p, bit in checks:
                if p.stat().st_mode & bit != bit:
                    raise contract.BadInput(f"the sandbox runs it as nobody, who cannot read {p} "
                                            f"(mode {p.stat().st_mode & 0o777:o}): chmod o+rX")

    def _visible(self) -> list[Path]:
        """The folders the run reads: its interpreters' (the command's first, this process's
        when it runs a workspace program inside), those on its PYTHONPATH, those of the paths in
        its command, and ``visible``."""
        found: list[Path] = []
        import tempfile

        private = {Path("/"), *Path.home().parents, Path.home(), Path("/tmp"), Path(tempfile.gettempdir()),
                   Path("/dev"), Path("/dev/shm")}
        for word in self.command:
            if not word.startswith("/") or not os.path.exists(word):
                continue
            path = Path(word)
            if path.is_dir():
                found.append(path)
            elif (path.parent.parent / "pyvenv.cfg").is_file() or path.name.startswith("python"):
                found += interpreter_folders(path)
            else:  # a script: its folder (what it imports beside it), never a host HOME or /
                found.append(path if path.parent in private else path.parent)
        # its PYTHONPATH, and the paths the workspace's own variables give (a Lightning checkout)
        said = [v for k, v in self.env.items() if k == "PYTHONPATH" or k.startswith("WORKSPACE_")]
        for entry in (e for v in said for e in str(v).split(os.pathsep)):
            if entry and os.path.isabs(entry) and os.path.exists(entry):
                found.append(Path(entry))
        if self.cwd:  # what its copy links to
            for entry in Path(self.cwd).iterdir():
                if entry.is_symlink() and entry.exists():
                    target = Path(os.path.realpath(entry))
                    found.append(target if target.is_dir() else target.parent)
        found += [Path(v) for v in self.visible]
        mine = [Path(o).resolve() for o, _ in self.outputs]
        return [p for p in found if p.exists() and not any(p == m or p.is_relative_to(m) for m in mine)
                and not (self.cwd and Path(os.path.realpath(p)) == Path(os.path.realpath(self.cwd)))]

    def judge(self, result: harness.RunResult) -> harness.RunResult:
        """``result`` as the sandbox's: a sandbox that could not be built fails the harness (no
        return code: the script never ran); the disk or the memory limit reached cannot test; and
        whatever exit the code inside chose, it never says "harness failure"."""
        try:
            started = (self.folder / "started").read_text() == "started"
        except OSError:
            started = False
        if result.returncode is not None and not started:
            # the run's command never started (bubblewrap or the trusted shell failed): no verdict
            result.returncode = None
            return _override(result, contract.FAIL, f"the sandbox could not be built: "
                                                    f"{_last_line(result.stderr_path)}")
        try:
            used, inodes_free = (int(x) for x in (self.folder / "used").read_text().split())
        except (OSError, ValueError):
            used, inodes_free = 0, INODES
        if used >= DISK - (1 << 20) or inodes_free < 16:
            limit = f"{DISK >> 20} MiB" if used >= DISK - (1 << 20) else f"{INODES} files"
            return _override(result, contract.SKIP, f"could not test: the sandbox's disk limit "
                                                    f"({limit}) was reached")
        if any(_oom_killed(g) for g in self.memory_groups):
            return _override(result, contract.SKIP, f"could not test: the sandbox's memory limit "
                                                    f"({MEMORY >> 20} MiB) was reached")
        if result.code >= contract.FAIL and result.returncode is not None and result.returncode >= 0 \
                and not (result.reason or "").startswith("harness failure"):
            return _override(result, contract.SKIP, f"the script exited {result.returncode}")
        return result


def _override(result: harness.RunResult, code: int, reason: str) -> harness.RunResult:
    result.code, result.verdict, result.reason, result.final = code, contract.name(code), reason, False
    return result


def _tail(path: str | None, size: int = 1 << 16) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - size))
            return fh.read().decode(errors="replace")
    except (OSError, TypeError):
        return ""


def _last_line(path: str | None) -> str:
    lines = _tail(path).strip().splitlines()
    return lines[-1][:300] if lines else "no message"
