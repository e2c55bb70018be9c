"""A pasted script made safe to run and runnable here: the static check that refuses what would
reach outside the sandbox (a courtesy, never the defence), the port of a GPU script to the CPU
(shown as a diff), and the nodes and ranks it asks for."""

from __future__ import annotations

import ast
import difflib
import re

RISKY_MODULES = {
    "requests": "network access", "urllib": "network access", "httpx": "network access",
    "aiohttp": "network access", "http": "network access", "socket": "network access",
    "ftplib": "network access", "paramiko": "network access", "boto3": "network access",
    "wget": "network access", "huggingface_hub": "downloads", "subprocess": "runs commands",
    "pty": "runs commands", "ctypes": "calls into C (namespaces, memory)", "importlib": "imports by name",
}


def dangerous(code: str, depth: int = 0) -> list[str]:
    """What the script could do outside its run: network access, downloads, commands, code made
    or imported by name at run time, writes or deletes on absolute, home or parent paths. One
    line each (with the line number). The sandbox is the boundary; this is the second line,
    so that a refused script is reported as such instead of failing inside."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        at = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for mod in mods:
                why = RISKY_MODULES.get(mod.split(".")[0])
                if why:
                    out.append(f"{at}: imports {mod} ({why})")
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        dotted = ast.unparse(f)
        for kw in node.keywords:
            if kw.arg == "download" and not (isinstance(kw.value, ast.Constant) and not kw.value.value):
                out.append(f"{at}: {dotted}(download={ast.unparse(kw.value)}) downloads a dataset")
            weights = isinstance(kw.value, ast.Constant) and kw.value.value not in (None, False)
            if kw.arg == "weights" and weights:
                out.append(f"{at}: {dotted}(weights={kw.value.value!r}) downloads weights")
        if name in ("from_pretrained", "load_dataset", "urlopen", "hf_hub_download", "snapshot_download") \
                or dotted.startswith("torch.hub."):
            out.append(f"{at}: {dotted}() downloads")
        if dotted in ("os.system", "os.popen", "os.setns", "os.unshare") or dotted.startswith(
                ("os.exec", "os.spawn", "os.posix_spawn")):
            out.append(f"{at}: {dotted}() runs a command or leaves the sandbox")
        if name == "__import__" or (name == "getattr" and len(node.args) > 1
                                    and not isinstance(node.args[1], ast.Constant)):
            out.append(f"{at}: {dotted}() reaches a module or builtin by a name made at run time")
        if name in ("eval", "exec"):
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and depth < 3:
                out += [f"{at}: in {name}(): {f}" for f in dangerous(first.value, depth + 1)]
            elif not isinstance(first, ast.Constant):
                out.append(f"{at}: {name}() of a string built at run time")
        if name in ("rmtree", "remove", "unlink", "rmdir", "open", "write_text", "write_bytes", "makedirs",
                    "mkdir", "rename", "replace", "save", "copy", "copyfile", "copytree", "move", "symlink",
                    "chmod", "chown") and _outside(node):
            out.append(f"{at}: {dotted}() on a path outside the working folder")
    return sorted(set(out), key=lambda s: int(re.search(r"\d+", s)[0]) if re.search(r"\d+", s) else 0)


def _outside(call: ast.Call) -> bool:
    """A write or delete whose path is written out as absolute, home or parent (``/``, ``~``,
    ``..``, also joined with ``os.path.join`` or ``/``). Reads are fine."""
    texts = [a for a in call.args[:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    for a in call.args[:2]:
        if isinstance(a, ast.Call) and ast.unparse(a.func) in ("os.path.join", "Path", "pathlib.Path"):
            texts += [x for x in a.args[:1] if isinstance(x, ast.Constant) and isinstance(x.value, str)]
        if isinstance(a, ast.BinOp):
            texts += [x for x in (a.left,) if isinstance(x, ast.Constant) and isinstance(x.value, str)]
    paths = texts
    if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Call):  # Path("/x").write()
        inner = call.func.value
        paths += [a for a in inner.args[:1] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    mode_at = 1 if isinstance(call.func, ast.Name) else 0  # open(path, mode) / Path(path).open(mode)
    modes = [a.value for a in call.args[mode_at:mode_at + 1] if isinstance(a, ast.Constant)]
    modes += [k.value.value for k in call.keywords if k.arg == "mode" and isinstance(k.value, ast.Constant)]
    if name == "open" and not any(isinstance(m, str) and set(m) & set("wax+") for m in modes):
        return False  # open() for reading
    return any(p.value.startswith(("/", "~")) or ".." in p.value.split("/") for p in paths)


class _CpuPort(ast.NodeVisitor):
    """Only these: accelerator gpu/cuda/auto/mps -> cpu; 16-bit precision -> bf16-mixed; NCCL ->
    gloo; ``.cuda()`` dropped; ``.to("cuda...")`` / ``torch.device("cuda...")`` -> cpu;
    ``torch.cuda.set_device(...)``, ``synchronize()``, ``empty_cache()`` statements -> ``pass``.
    Each an edit of the source span of that node alone: the rest keeps the reporter's text."""

    def __init__(self):
        self.edits: list[tuple[ast.AST, str, str]] = []  # (node, new source, what changed)

    def _constant(self, node, value, what):
        self.edits.append((node, repr(value), what))

    def visit_keyword(self, node):
        v = node.value
        if isinstance(v, ast.Constant):
            value = v.value
            if node.arg == "accelerator" and value in ("gpu", "cuda", "auto", "mps", "tpu"):
                self._constant(v, "cpu", f"accelerator={value!r} -> 'cpu'")
            elif node.arg == "precision" and value in (16, "16", "16-mixed"):
                self._constant(v, "bf16-mixed", f"precision={value!r} -> 'bf16-mixed'")
            elif node.arg == "precision" and value == "16-true":
                self._constant(v, "bf16-true", "precision='16-true' -> 'bf16-true'")
            elif node.arg in ("backend", "process_group_backend") and value == "nccl":
                self._constant(v, "gloo", f"{node.arg}='nccl' -> 'gloo'")
            elif node.arg in ("device", "map_location") and str(value).startswith("cuda"):
                self._constant(v, "cpu", f"{node.arg}={value!r} -> 'cpu'")
            elif node.arg == "devices" and value in (-1, "-1", "auto"):
                self.edits.append((v, "2", f"devices={value!r} -> 2 (CPU processes)"))
        elif node.arg == "devices" and isinstance(v, ast.List) and v.elts:
            n = len(v.elts)
            self.edits.append((v, str(n), f"devices={ast.unparse(v)} -> {n} (CPU processes)"))
        elif node.arg == "device_ids":
            self.edits.append((v, "None", f"device_ids={ast.unparse(v)} -> None (CPU)"))
        elif isinstance(v, ast.JoinedStr) and node.arg in ("device", "map_location") and _cuda_fstring(v):
            self.edits.append((v, "'cpu'", f"{node.arg}={ast.unparse(v)} -> 'cpu'"))
        self.generic_visit(node)

    def visit_Call(self, node):
        f = node.func
        dotted = ast.unparse(f)
        if isinstance(f, ast.Attribute) and f.attr == "cuda" and ast.unparse(f.value) != "torch":
            self.edits.append((node, None, f"{ast.unparse(node)} -> {ast.unparse(f.value)}"))
        if dotted == "torch.cuda.device_count":
            self.edits.append((node, "2", "torch.cuda.device_count() -> 2 (CPU processes)"))
        if isinstance(f, ast.Attribute) and f.attr == "to" and node.args \
                and isinstance(node.args[0], ast.JoinedStr) and _cuda_fstring(node.args[0]):
            self.edits.append((node.args[0], "'cpu'", f"{ast.unparse(node.args[0])} -> 'cpu'"))
        first = node.args[0] if node.args else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            moves = (isinstance(f, ast.Attribute) and f.attr == "to") or dotted in ("torch.device", "device")
            if first.value.startswith("cuda") and moves:
                self._constant(first, "cpu", f"{dotted}({first.value!r}) -> 'cpu'")
            if first.value == "nccl" and dotted.endswith("init_process_group"):
                self._constant(first, "gloo", "init_process_group('nccl') -> 'gloo'")
        self.generic_visit(node)

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Call) and ast.unparse(node.value.func) in (
                "torch.cuda.set_device", "torch.cuda.synchronize", "torch.cuda.empty_cache"):
            self.edits.append((node, "pass", f"{ast.unparse(node.value)} -> pass"))
            return
        self.generic_visit(node)


def _cuda_fstring(node: ast.JoinedStr) -> bool:
    head = node.values[0] if node.values else None
    return isinstance(head, ast.Constant) and str(head.value).startswith("cuda")


def cpu_port(code: str) -> tuple[str, list[str], str]:
    """The script for this machine's CPUs: (code, the changes, a unified diff); unchanged when
    nothing needs it."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code, [], ""
    port = _CpuPort()
    port.visit(tree)
    lines = code.splitlines(keepends=True)
    data = [line.encode() for line in lines]  # ast's columns are UTF-8 byte offsets
    edits = []
    for node, text, _ in port.edits:
        if text is None:  # x.cuda() -> x: only ".cuda()" goes, edits inside x stay apart
            inner = node.func.value
            edits.append(((inner.end_lineno, inner.end_col_offset),
                          (node.end_lineno, node.end_col_offset), ""))
        else:
            edits.append(((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset), text))
    for (l1, c1), (l2, c2), text in sorted(edits, reverse=True):
        head, tail = data[l1 - 1][:c1], data[l2 - 1][c2:]
        data[l1 - 1:l2] = [head + text.encode() + tail]
    new = "".join(d.decode() for d in data)
    diff = "".join(difflib.unified_diff(lines, new.splitlines(keepends=True), "reported.py", "run.py", n=1))
    order = sorted(port.edits, key=lambda e: (e[0].lineno, e[0].col_offset))
    return new, [what for _, _, what in order], diff


def topology(code: str) -> tuple[int, int]:
    """(nodes, ranks per node) of a script written for several nodes: a call with an integer
    ``num_nodes`` >= 2 (a Trainer's), with its integer ``devices`` (else 1); (1, 1) otherwise."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return 1, 1
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            n, d = kw.get("num_nodes"), kw.get("devices")
            if isinstance(n, ast.Constant) and type(n.value) is int and n.value >= 2:
                per = d.value if isinstance(d, ast.Constant) and type(d.value) is int and d.value >= 1 else 1
                return n.value, per
    return 1, 1
