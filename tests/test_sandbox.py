"""The sandbox holds against the code it runs (``tools/launch/sandbox.py``).

Each test is an attack a pasted script could make, run through the launcher as the triage runs
a report's script (``Run(sandbox=True)``), and checked from the host: twice, once started by
root (inside, the run is nobody) and once by an unprivileged user (bubblewrap in a user
namespace of its own). The unprivileged launcher is the system's Python with a copy of
``tools/``, dropped to nobody with ``setpriv`` when the suite runs as root.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tools.launch import harness, leftovers, sandbox

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = Path("/usr/bin/python3")
NOBODY = 65534
# the launcher, in a process of its own (root's, or the unprivileged user's): one sandboxed run
DRIVER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from tools.launch.launcher import Launcher, Run
from tools.launch import sandbox
r = Launcher().run(Run((sys.argv[2],), Path(sys.argv[4]), sandbox=True, log_stem=Path(sys.argv[3]),
                       timeout=float(sys.argv[5]), env=json.loads(sys.argv[6])))
print(json.dumps({**r.to_dict(), "unavailable": sandbox.unavailable()}))
"""
MODES = ["root", "user"]


@pytest.fixture(scope="module")
def tools_copy():
    """``tools/`` and the repro contract where nobody can read them (the checkout may not be)."""
    folder = Path(tempfile.mkdtemp(prefix="sandbox-tools-"))
    folder.chmod(0o755)
    shutil.copytree(ROOT / "tools", folder / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "repro").mkdir()
    shutil.copy(ROOT / "repro" / "_contract.py", folder / "repro")
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


class Attack:
    """A script run in the sandbox in one mode; its result and output, read on the host."""

    def __init__(self, mode: str, tools_copy: Path):
        if mode == "root" and os.geteuid() != 0:
            pytest.skip("the root mode needs the suite to run as root")
        why = sandbox.unavailable()
        if why and mode == "root":
            pytest.skip(why)
        self.mode = mode
        self.drop = mode == "user" and os.geteuid() == 0
        if self.drop and not SYSTEM_PYTHON.exists():
            pytest.skip("no system Python for the unprivileged launcher")
        self.folder = Path(tempfile.mkdtemp(prefix="attack-"))
        self.folder.chmod(0o755)
        if self.drop:
            os.chown(self.folder, NOBODY, NOBODY)
        self.tools = tools_copy if self.drop else ROOT
        self.python = SYSTEM_PYTHON if self.drop else Path(sys.executable)

    def run(self, code: str, env: dict | None = None, timeout: float = 60,
            run_env: dict | None = None) -> tuple[dict, str, str]:
        """``code`` run in the sandbox; ``env``: the launcher's variables, ``run_env``: the run's."""
        script = self.folder / "attack.py"
        script.write_text(code)
        script.chmod(0o644)
        stem = self.folder / "log"
        cmd = [str(self.python), "-c", DRIVER, str(self.tools), str(script), str(stem), str(self.python),
               str(timeout), json.dumps(run_env or {})]
        if self.drop:
            cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 60, cwd=self.folder,
                              env={**os.environ, **(env or {})})
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        if result["unavailable"]:
            pytest.skip(f"{self.mode}: {result['unavailable']}")
        out, err = (Path(f"{stem}.{s}").read_text(errors="replace") for s in ("stdout", "stderr"))
        return result, out, err

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(params=MODES)
def attack(request, tools_copy):
    a = Attack(request.param, tools_copy)
    yield a
    a.close()


def test_a_mount_of_any_kind_is_refused_and_the_host_stays_read_only(attack):
    target = attack.folder / "escaped"  # the script's own folder: visible, read-only
    code = f"""
import os, sys, pickle, ctypes, subprocess
target = {str(target)!r}
from os import system
print("system", system("mount -o remount,bind,rw / && touch " + target + " 2>&1"))
payload = pickle.dumps(getattr)  # a payload that calls through pickle
class P:
    def __reduce__(self):
        return (os.system, ("mount -o remount,rw " + os.path.dirname(target) + "; touch " + target,))
print("pickle", pickle.loads(pickle.dumps(P())))
run = getattr(sys.modules["subprocess"], "run")
print("getattr", run(["mount", "-t", "tmpfs", "x", "/usr"], capture_output=True).returncode)
libc = ctypes.CDLL(None, use_errno=True)
print("mount(2)", libc.mount(b"none", b"/", None, 0x20 | 0x1000, None), ctypes.get_errno())
print("umount2", libc.umount2(b"/proc", 2), ctypes.get_errno())
try:
    open(target, "w").write("escaped")
except OSError as err:
    print("write:", err)
"""
    result, out, err = attack.run(code)
    assert not target.exists(), (out, err)
    assert "mount(2) -1 1" in out and "umount2 -1 1" in out, out  # EPERM, from the filter
    assert "Read-only file system" in out, out


def test_root_outside_is_nobody_without_capabilities_inside(attack):
    code = """
import os
print("ids", os.getuid(), os.geteuid(), os.getgid())
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
print("caps", status["CapEff"].strip(), status["CapPrm"].strip(), status["CapBnd"].strip())
print("nnp", status["NoNewPrivs"].strip(), "seccomp", status["Seccomp"].strip())
for path in ("/etc/shadow", "/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches",
             "/sys/fs/cgroup", "/proc/sysrq-trigger", "/root", "/home"):
    print("access", path, os.path.exists(path), os.access(path, os.W_OK), os.access(path, os.R_OK))
print("devices", sorted(os.listdir("/dev")))
try:
    print(open("/etc/shadow").read())
except OSError as err:
    print("shadow:", err)
"""
    result, out, err = attack.run(code)
    assert result["verdict"] == "good", (result, err)
    ids = out.split("ids ")[1].split()[:3]
    assert "0" not in ids, out
    assert "caps 0000000000000000 0000000000000000 0000000000000000" in out
    assert "nnp 1 seccomp 2" in out
    access = {line.split()[1]: line.split()[2:] for line in out.splitlines() if line.startswith("access ")}
    assert len(access) == 7, out
    assert all(writable == "False" for _, writable, _ in access.values()), access
    assert access["/etc/shadow"][2] == "False" and access["/home"][0] == "False", access
    assert "root:" not in out
    devices = eval(out.split("devices ")[1].splitlines()[0])  # noqa: S307  (our own print)
    assert not [d for d in devices if d.startswith(("sd", "vd", "nvme", "loop", "mem", "kmsg"))], devices


def test_host_sockets_cannot_be_reached(attack, tmp_path):
    """A listener on the host: a socket file in the temporary folder, an abstract one, TCP on
    loopback. None hears from the sandbox, whose own loopback works."""
    heard = []
    folder = Path(tempfile.mkdtemp(prefix="host-socket-"))
    folder.chmod(0o777)
    path = folder / "host.sock"
    listeners = []
    for family, address in ((socket.AF_UNIX, str(path)), (socket.AF_UNIX, f"\0ws-attack-{os.getpid()}"),
                            (socket.AF_INET, ("127.0.0.1", 0))):
        s = socket.socket(family)
        s.bind(address)
        s.listen()
        s.settimeout(0.2)
        listeners.append(s)
    path.chmod(0o777)
    port = listeners[2].getsockname()[1]
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            for s in listeners:
                try:
                    conn, _ = s.accept()
                    heard.append(conn.recv(100))
                    conn.close()
                except OSError:
                    pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    code = f"""
import socket
for family, address in ((socket.AF_UNIX, {str(path)!r}), (socket.AF_UNIX, "\\0ws-attack-{os.getpid()}"),
                        (socket.AF_INET, ("127.0.0.1", {port})), (socket.AF_INET, ("192.0.2.1", 80))):
    try:
        s = socket.socket(family)
        s.settimeout(3)
        s.connect(address)
        s.sendall(b"from the sandbox")
        print("reached", address)
    except OSError as err:
        print("refused", address, err)
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    print("raw socket made")
except OSError as err:
    print("raw:", err)
for family, number in (("AF_VSOCK", 40), ("AF_PACKET", 17), ("AF_BLUETOOTH", 31), ("AF_ALG", 38)):
    try:
        socket.socket(number, socket.SOCK_SEQPACKET if family == "AF_ALG" else socket.SOCK_STREAM)
        print("made", family)
    except OSError as err:
        print("refused", family, err.errno)
own = socket.socket(); own.bind(("127.0.0.1", 0)); own.listen()
socket.create_connection(own.getsockname(), timeout=3).close()
print("own loopback ok")
"""
    try:
        result, out, err = attack.run(code)
    finally:
        time.sleep(0.3)  # what was sent reached the accept loop (it polls every 0.2 s)
        stop.set()
        thread.join()
        for s in listeners:
            s.close()
        shutil.rmtree(folder, ignore_errors=True)
    assert heard == [], (heard, out)
    assert "reached" not in out and "raw socket made" not in out and "made AF_" not in out, out
    assert "refused AF_VSOCK 97" in out, out  # EAFNOSUPPORT: vsock crosses network namespaces
    assert "own loopback ok" in out, (out, err)


def test_the_host_processes_and_namespaces_are_out_of_reach(attack):
    marker = f"ws-host-marker-{os.getpid()}"
    host = subprocess.Popen(["sh", "-c", "sleep 60", marker])
    try:
        code = f"""
import os, ctypes, subprocess
libc = ctypes.CDLL(None, use_errno=True)
print("umount /proc", subprocess.run(["umount", "/proc"], capture_output=True).returncode)
seen = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            seen.append(open(f"/proc/{{pid}}/cmdline").read().replace("\\0", " "))
        except OSError:
            pass
print("marker seen", any({marker!r} in c for c in seen), "processes", len(seen))
print("unshare", libc.unshare(0x10000000), ctypes.get_errno())  # CLONE_NEWUSER
print("unshare net", libc.unshare(0x40000000), ctypes.get_errno())
fd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
print("setns", libc.setns(fd, 0), ctypes.get_errno())
print("ptrace", libc.ptrace(16, os.getppid(), None, None), ctypes.get_errno())  # PTRACE_ATTACH
print("bpf", libc.syscall(321, 0, None, 0), ctypes.get_errno())  # x86_64 bpf(2)
print("keyctl", libc.syscall(250, 0, 0, 0, 0), ctypes.get_errno())
print("unshare -U", subprocess.run(["unshare", "-U", "true"], capture_output=True).returncode)
"""
        result, out, err = attack.run(code)
    finally:
        host.kill()
        host.wait()
    assert "marker seen False" in out, (out, err)
    assert int(out.split("processes ")[1].split()[0]) < 10, out  # its own few only
    for call in ("unshare", "unshare net", "setns", "ptrace", "keyctl"):
        assert f"{call} -1 1\n" in out, (call, out)  # EPERM
    assert "bpf -1 1\n" in out or os.uname().machine != "x86_64", out
    assert "unshare -U 0" not in out


def test_dev_and_shm_are_its_own_and_nothing_it_writes_stays(attack):
    name = f"ws-attack-{os.getpid()}"
    code = f"""
import os
for path in ("/dev/shm/{name}", "/dev/{name}", os.path.join(os.environ["HOME"], "{name}"),
             os.path.join(os.environ["TMPDIR"], "{name}"), "/tmp/{name}", "{name}", "/{name}",
             "/etc/{name}", "/sandbox/{name}", "/sys/{name}"):
    try:
        open(path, "w").write("x")
        print("wrote", path)
    except OSError as err:
        print("refused", path, err)
"""
    result, out, err = attack.run(code)
    assert "refused /dev/" in out and "wrote /dev/shm/" in out, out
    for root_level in (f"/{name}", f"/etc/{name}", f"/sandbox/{name}", f"/sys/{name}"):  # its /, read-only
        assert f"refused {root_level} " in out, (root_level, out)
    for place in (Path("/dev/shm"), Path("/tmp"), Path(tempfile.gettempdir()), Path.home(), attack.folder):
        assert not (place / name).exists(), place


def test_a_host_mount_with_a_space_in_its_path_stays_read_only(attack):
    if os.geteuid() != 0:
        pytest.skip("making a host mount needs root")
    inner = attack.folder / "a mount with spaces"
    inner.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0777", "ws-space", str(inner)], check=True)
    try:
        code = f"""
try:
    open({str(inner / 'escaped')!r}, "w").write("x")
    print("wrote")
except OSError as err:
    print("refused", err)
"""
        result, out, err = attack.run(code)
        assert "refused" in out and not (inner / "escaped").exists(), (out, err)
    finally:
        subprocess.run(["umount", "-l", str(inner)], check=False)


def test_a_full_disk_is_could_not_test_and_nothing_reaches_the_host_disk(attack):
    code = """
import os
for where in (os.environ["HOME"], os.environ["TMPDIR"], "/dev/shm", "."):
    try:
        with open(os.path.join(where, "fill"), "wb") as fh:
            for _ in range(100):
                fh.write(b"x" * (1 << 20))
        print("filled", where, "to 100 MiB")
    except OSError as err:
        print("stopped", where, err)
raise RuntimeError("the bug")
"""
    result, out, err = attack.run(code, env={"WORKSPACE_SANDBOX_DISK_MIB": "32"})
    assert result["verdict"] == "skip", result
    assert result["reason"] == "could not test: the sandbox's disk limit (32 MiB) was reached"
    assert "No space left on device" in out and "filled" not in out


def test_output_past_the_log_limit_is_cut(attack):
    code = "import sys\nfor _ in range(12):\n    sys.stdout.write('y' * (1 << 20))\n"
    result, out, err = attack.run(code, env={"WORKSPACE_SANDBOX_LOG_MIB": "4"})
    size = (attack.folder / "log.stdout").stat().st_size
    assert (4 << 20) <= size < (5 << 20), size
    assert out.endswith("[the log stops here: its limit is 4 MiB]\n")


def test_a_fork_storm_stops_at_the_process_limit(attack):
    code = """
import os, time
n = 0
try:
    for _ in range(1000):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as err:
    print("stopped after", n, err)
"""
    result, out, err = attack.run(code, env={"WORKSPACE_SANDBOX_PIDS": "40"})
    assert "stopped after" in out, (out, err)
    assert int(out.split("stopped after ")[1].split()[0]) <= 40


def test_memory_past_the_limit_is_could_not_test_where_cgroups_allow(attack):
    if attack.mode != "root":
        pytest.skip("the memory cgroups are root's here")
    memory, _, made = sandbox._cgroups(f"probe-{os.getpid()}")
    for group in made:
        group.rmdir()
    if not memory:
        pytest.skip("this machine's cgroups give no memory limit")
    code = "x = []\nwhile True:\n    x.append(bytearray(16 << 20))\n"
    result, out, err = attack.run(code, env={"WORKSPACE_SANDBOX_MEMORY_MIB": "128"})
    assert result["verdict"] == "skip", result
    assert result["reason"] == "could not test: the sandbox's memory limit (128 MiB) was reached", result


def test_the_environment_keeps_its_secrets_and_home(attack, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_not_a_real_token_0123456789abcdef")
    code = """
import os
print("token", os.environ.get("GITHUB_TOKEN"))
print("home", os.environ["HOME"], os.path.exists(os.path.expanduser("~/.ssh")))
print("listing /root", os.path.isdir("/root") and os.listdir("/root"))
print("variables", sorted(os.environ))
"""
    result, out, err = attack.run(code, env={"GITHUB_TOKEN": "ghp_not_a_real_token_0123456789abcdef"})
    assert "token None" in out
    assert "home /sandbox/home False" in out
    listed = out.split("listing /root ")[1].splitlines()[0]
    assert listed in ("False", "[]", "['.pyenv']"), listed  # at most the interpreter's folder
    names = eval(out.split("variables ")[1].splitlines()[0])  # noqa: S307  (our own print)
    assert not [n for n in names if n.startswith(("SANDBOX_", "HARNESS_", "OLDPWD", "GITHUB"))], names


# -- what a SIGKILLed owner leaves ------------------------------------------------------------------

def test_the_next_run_sweeps_what_a_killed_owner_left(tmp_path):
    """A process that made a sandbox folder and a pid file, then died of SIGKILL: the next
    process's first run removes both and says so; a live owner's are kept."""
    made = tmp_path / "made"
    code = (f"import sys, os, time; sys.path.insert(0, {str(ROOT)!r}); from tools.launch import leftovers\n"
            "d = leftovers.owned_tempdir('sandbox'); (d / 'untrusted').write_text('x')\n"
            "import tempfile\n"
            "f = tempfile.NamedTemporaryFile(prefix=leftovers.owned('ranks'), suffix='.pids', delete=False)\n"
            f"open({str(made)!r}, 'w').write(str(d) + '\\n' + f.name); time.sleep(60)\n")
    temp = tmp_path / "tmp"  # a temporary folder of its own: another test's first run sweeps the shared one
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    owner = subprocess.Popen([sys.executable, "-c", code], env=env)
    for _ in range(300):
        if made.exists() and made.read_text().count("\n") == 1 and made.read_text().endswith(".pids"):
            break
        time.sleep(0.05)
    folder, pids = (Path(p) for p in made.read_text().splitlines())
    mine = Path(tempfile.mkdtemp(prefix=leftovers.owned("sandbox"), dir=temp))  # this process is alive: kept
    try:
        probe = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
                                "from tools.launch import leftovers; leftovers.sweep()"],
                               capture_output=True, text=True, timeout=60, env=env)
        assert folder.exists() and pids.exists(), probe.stderr  # its owner is alive
        owner.kill()
        owner.wait()
        probe = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
                                "from tools.launch import harness; harness.run(['true'], timeout=10)"],
                               capture_output=True, text=True, timeout=60, env=env)
        assert not folder.exists() and not pids.exists()
        assert f"[sweep] removed {folder}: left by process {owner.pid}, which is gone" in probe.stderr
        assert mine.exists()
    finally:
        owner.kill()
        shutil.rmtree(mine, ignore_errors=True)


def test_what_the_code_inside_exits_with_or_prints_is_never_a_harness_failure(attack):
    """A malformed verdict line, an exit status above 128, a death by a signal: the script's own
    doing, "could not test" (a bisect goes on), never "the harness failed" and never a crash."""
    for code, reason in (
            ('print(\'{"verdict": "skip", "exit_code": 125, "details": []}\')\nraise SystemExit(125)', None),
            ("raise SystemExit(200)", "the script exited 200"),
            ("raise SystemExit(168)", "killed by signal 40"),  # (as a shell says it: no name in Python)
            ("import os\nos.kill(os.getpid(), 40)", "killed by signal 40"),
            ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "killed by SIGSEGV")):
        result, out, err = attack.run(code)
        assert result["verdict"] == "skip", (code, result)
        if reason:
            assert result["reason"] == reason, result


def test_many_small_files_reach_the_disk_limit_too(attack):
    code = """
import os
try:
    for i in range(200000):
        open(os.path.join(os.environ["TMPDIR"], f"{i:0>180}"), "w").close()
except OSError as err:
    print("stopped", err)
"""
    result, out, err = attack.run(code)
    assert "stopped" in out, out
    limit = f"{sandbox.INODES} files"
    assert result["reason"] == f"could not test: the sandbox's disk limit ({limit}) was reached"


def test_a_text_about_a_full_disk_is_not_a_full_disk(attack):
    result, out, err = attack.run("print('OSError: [Errno 28] No space left on device')\n")
    assert result["verdict"] == "good", result


def test_the_privileged_helpers_are_never_taken_from_the_runs_path(attack, tmp_path):
    """setpriv and prlimit run inside with the capabilities to drop to nobody: a program of that
    name early on the run's PATH (an environment's bin) must not be the one run."""
    fake = attack.folder / "bin"
    fake.mkdir()
    fake.chmod(0o755)
    marker = Path(tempfile.gettempdir()) / f"ws-fake-helper-{os.getpid()}"
    for name in ("setpriv", "prlimit"):
        (fake / name).write_text(f"#!/bin/sh\ntouch {marker}\nexec /usr/bin/{name} \"$@\"\n")
        (fake / name).chmod(0o755)
    path = f"{fake}{os.pathsep}{os.environ['PATH']}"
    result, out, err = attack.run("print('ran')\n", run_env={"PATH": path})
    assert "ran" in out, (result, err)
    assert not marker.exists()


def test_a_sandbox_that_cannot_be_built_is_a_harness_failure_not_the_scripts(tmp_path, monkeypatch):
    """Its working folder does not fit on its disk: the script never ran, so no return code (the
    callers stop: a harness failure), and the reason says so."""
    if sandbox.unavailable():
        pytest.skip(sandbox.unavailable())
    monkeypatch.setattr(sandbox, "DISK", 8 << 20)
    work = tmp_path / "work"
    work.mkdir(parents=True)
    (work / "big").write_bytes(b"x" * (16 << 20))
    tmp_path.chmod(0o755)
    work.chmod(0o755)
    with sandbox.Sandbox(["/bin/true"], {"PATH": "/usr/bin:/bin"}, cwd=work) as box:
        result = box.judge(harness.run(box.argv, timeout=60, env=box.outer_env, log_stem=tmp_path / "log",
                                       exit_is_signal=True))
    assert result.code == 128 and result.returncode is None, result
    assert result.reason.startswith("the sandbox could not be built: sandbox setup failed: cannot copy"), \
        result


def test_only_the_named_outputs_come_back_capped_in_number_and_size(tmp_path, monkeypatch):
    if sandbox.unavailable():
        pytest.skip(sandbox.unavailable())
    monkeypatch.setattr(sandbox, "OUTPUT_CAP", 1 << 20)
    monkeypatch.setattr(sandbox, "OUTPUT_FILES", 5)
    tmp_path.chmod(0o755)
    out = tmp_path / "reports"
    script = tmp_path / "write.py"
    script.write_text(f"""
import os
for i in range(20):
    open(os.path.join({str(out)!r}, f"{{i}}.json"), "w").write("{{}}")
open(os.path.join({str(out)!r}, "0.json"), "w").write("x" * (3 << 20))
open(os.path.join({str(out)!r}, "other.txt"), "w").write("not asked for")
os.symlink("/etc/passwd", os.path.join({str(out)!r}, "link.json"))
os.mkfifo(os.path.join({str(out)!r}, "fifo.json"))
""")
    script.chmod(0o644)
    with sandbox.Sandbox([sys.executable, str(script)], {"PATH": "/usr/bin:/bin"},
                         outputs=((out, "*.json"),)) as box:
        result = box.judge(harness.run(box.argv, timeout=60, env=box.outer_env, log_stem=tmp_path / "log",
                                       exit_is_signal=True))
    assert result.verdict == "good", (result, (tmp_path / "log.stderr").read_text())
    back = sorted(p.name for p in out.iterdir())
    assert len(back) == 5 and all(name.endswith(".json") for name in back), back
    assert "link.json" not in back and "fifo.json" not in back
    assert (out / "0.json").stat().st_size == 1 << 20  # its end, cut to the cap


def test_what_comes_back_is_capped_in_total_sparse_files_included(tmp_path, monkeypatch):
    if sandbox.unavailable():
        pytest.skip(sandbox.unavailable())
    monkeypatch.setattr(sandbox, "OUTPUT_TOTAL", 3 << 20)
    tmp_path.chmod(0o755)
    out = tmp_path / "reports"
    script = tmp_path / "sparse.py"
    script.write_text(f"import os\nfor i in range(10):\n"
                      f"    open(os.path.join({str(out)!r}, f'{{i}}.json'), 'w').truncate(10 ** 12)\n")
    script.chmod(0o644)
    with sandbox.Sandbox([sys.executable, str(script)], {"PATH": "/usr/bin:/bin"},
                         outputs=((out, "*.json"),)) as box:
        result = box.judge(harness.run(box.argv, timeout=120, env=box.outer_env, log_stem=tmp_path / "log",
                                       exit_is_signal=True))
    assert result.verdict == "good", (result, (tmp_path / "log.stderr").read_text())
    assert sum(p.stat().st_size for p in out.iterdir()) <= 3 << 20


def test_a_bubblewrap_that_fails_after_it_started_is_no_verdict(tmp_path):
    """bubblewrap fails while it builds the sandbox (a folder to show is gone): its message is
    not the script's output, whatever a signature would make of it."""
    if sandbox.unavailable():
        pytest.skip(sandbox.unavailable())
    gone = tmp_path / "gone"
    gone.mkdir()
    with sandbox.Sandbox(["/bin/true"], {"PATH": "/usr/bin:/bin"}, visible=(gone,)) as box:
        gone.rmdir()
        result = box.judge(harness.run(box.argv, timeout=60, env=box.outer_env, log_stem=tmp_path / "log",
                                       signature="No such file", exit_is_signal=True))
    assert result.code == 128 and result.returncode is None, result
    assert "Can't find source path" in result.reason, result


def test_a_lightning_checkout_a_run_is_given_is_visible_and_a_missing_one_is_said(attack, tmp_path):
    """A commit bisect's run imports Lightning from a checkout (``WORKSPACE_LIGHTNING_SRC``): the
    sandbox shows it; where it is not there the run cannot test, never the installed release."""
    src = attack.folder / "checkout" / "src"
    (src / "lightning").mkdir(parents=True)
    for p in (attack.folder / "checkout", src, src / "lightning"):
        p.chmod(0o755)
    inject = ROOT / "tools" / "inject" if attack.tools == ROOT else attack.tools / "tools" / "inject"
    env = {"PYTHONPATH": str(inject), "WORKSPACE_LIGHTNING_SRC": str(src)}
    result, out, err = attack.run(f"import os\nprint('seen', os.path.isdir({str(src)!r}))\n", run_env=env)
    assert "seen True" in out, (out, err)
    env["WORKSPACE_LIGHTNING_SRC"] = str(attack.folder / "gone" / "src")
    result, out, err = attack.run("print('ran the release')\n", run_env=env)
    assert "ran the release" not in out
    assert result["verdict"] == "skip" and "is not there" in result["reason"], result


def test_a_sigkilled_launcher_leaves_nothing_running_and_its_folder_is_swept(tmp_path):
    """The triage SIGKILLed while its sandboxed run goes on: the run dies with it (its watchdog,
    bubblewrap's --die-with-parent), and the folder it left on the host goes with the next run."""
    if sandbox.unavailable():
        pytest.skip(sandbox.unavailable())
    tmp_path.chmod(0o755)
    script = tmp_path / "sleeper.py"
    script.write_text("import time\ntime.sleep(120)\n")
    script.chmod(0o644)
    temp = tmp_path / "tmp"  # a temporary folder of its own: another test's first run sweeps the shared one
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(ROOT), str(script), str(tmp_path / "log"),
                               sys.executable, "300", "{}"], stdout=subprocess.DEVNULL, env=env)
    marker = str(script)
    deadline = time.monotonic() + 60
    while not any(_cmdline(pid).split("\0")[1:2] == [marker] for pid in os.listdir("/proc")
                  if pid.isdigit() and int(pid) != driver.pid):  # the script runs, inside
        assert time.monotonic() < deadline and driver.poll() is None
        time.sleep(0.05)
    left = list(temp.glob(f"sandbox-{driver.pid}.*"))
    assert len(left) == 1, left
    driver.kill()
    driver.wait()
    deadline = time.monotonic() + 30
    while any(marker in _cmdline(pid) for pid in os.listdir("/proc") if pid.isdigit()):
        assert time.monotonic() < deadline, "the sandboxed run outlived its launcher"
        time.sleep(0.1)
    assert left[0].exists()
    probe = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
                            "from tools.launch import harness; harness.run(['true'], timeout=10)"],
                           capture_output=True, text=True, timeout=60, env=env)
    assert not left[0].exists(), probe.stderr
    assert f"[sweep] removed {left[0]}: left by process {driver.pid}, which is gone" in probe.stderr


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return ""
