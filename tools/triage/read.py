"""Read a report: the issue (a URL through GitHub's API, cached; a saved Markdown or JSON file), its
sections, its fenced code blocks and the script they make, its tracebacks (headerless and
``[rankN]:``-prefixed ones too), and the versions the reporter states."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tools import fingerprint
from tools.core import results
from tools.core.contract import BadInput
from tools.triage.progress import progress

ROOT = Path(__file__).resolve().parents[2]  # the workspace
CACHE = ROOT / ".cache" / "issues"
ISSUE_URL = re.compile(r"^https://github\.com/(?P<repo>[\w.-]+/[\w.-]+)/issues/(?P<number>\d+)/?$")
FORM = ("Bug description", "What version are you seeing the problem on?", "How to reproduce the bug",
        "Error messages and logs", "Environment", "More info")



@dataclass
class Issue:
    source: str  # what was given
    id: str  # for the results folder: owner-repo-N, or the file's stem
    title: str
    body: str
    url: str | None = None
    comments: list[str] = field(default_factory=list)

    @property
    def folder(self) -> str:
        """Its results folder: ``id`` (for a saved issue, ``_file_id``: its name and which file it
        is, so two ``issue.md`` of two folders are two triages; the same file triaged again resumes)."""
        return self.id


def read_issue(spec: str) -> Issue:
    match = ISSUE_URL.match(re.sub(r"[#?].*$", "", spec))
    if match:
        return _from_api(spec, match["repo"], int(match["number"]))
    path = Path(spec)
    if not path.is_file():
        raise BadInput(f"{spec}: neither a GitHub issue URL nor a file")
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        raise BadInput(f"{spec}: cannot read it ({err.strerror})") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as err:
            raise BadInput(f"{spec}: not JSON ({err})") from None
        if not isinstance(data, dict) or not isinstance(data.get("body"), (str, type(None))) \
                or "body" not in data:
            raise BadInput(f"{spec}: not an issue as GitHub's API gives it (no 'body' text)")
        return _issue(spec, data, _file_id(path))
    return Issue(spec, _file_id(path), _first_heading(text) or path.stem, text)


def _file_id(path: Path) -> str:
    """A saved issue's results folder: its name, and which file it is (two ``issue.md`` of two
    folders are two triages; the same file triaged again is the same one)."""

    return f"{path.stem}-{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]}"


def _first_heading(text: str) -> str | None:
    m = re.search(r"^#\s+(.+)$", text, re.M)
    return m[1].strip() if m else None


def _issue(spec: str, data: dict, ident: str, comments=()) -> Issue:
    return Issue(spec, ident, data.get("title") or ident, data.get("body") or "", data.get("html_url"),
                 [c.get("body") or "" for c in comments])


def _from_api(url: str, repo: str, number: int) -> Issue:
    ident = f"{repo.replace('/', '-')}-{number}"
    cached = CACHE / f"{ident}.json"
    api = os.environ.get("GITHUB_API_URL", "https://api.github.com").rstrip("/")
    try:
        data = _get(f"{api}/repos/{repo}/issues/{number}")
        comments = _get(f"{api}/repos/{repo}/issues/{number}/comments") if data.get("comments") else []
        results.write_json(cached, {"issue": data, "comments": comments})
    except (urllib.error.URLError, OSError, ValueError) as err:
        if not cached.is_file():
            raise BadInput(f"{url}: cannot read it ({getattr(err, 'reason', err)}) and no copy is cached") \
                from None
        progress("read", f"offline ({getattr(err, 'reason', err)}): the cached copy of {url}")
        try:
            saved = json.loads(cached.read_text())
            data, comments = saved["issue"], saved["comments"]
        except (OSError, ValueError, KeyError, TypeError):
            raise BadInput(f"{url}: cannot read it, and the cached copy {cached} is damaged") from None
    return _issue(url, data, ident, comments)


def _get(url: str):
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.github+json"})
    if os.environ.get("GITHUB_TOKEN"):
        request.add_header("Authorization", f"Bearer {os.environ['GITHUB_TOKEN']}")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read().decode())


def sections(body: str) -> dict[str, str]:
    """The form's sections by heading (``### Bug description`` ...); text before any: ``""``."""
    out, name = {"": []}, ""
    for line in body.splitlines():
        m = re.match(r"^#{2,4}\s+(.+?)\s*$", line)
        if m:
            name = m[1]
            out.setdefault(name, [])
        else:
            out[name].append(line)
    return {k: "\n".join(v).strip() for k, v in out.items()}


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # where it starts in the body (1-based, its first code line)


def code_blocks(body: str) -> list[Block]:
    blocks, lines, i = [], body.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m[1], m[2].lower(), i + 1
        j = start
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        blocks.append(Block(lang, "\n".join(lines[start:j]), start + 1))
        i = j + 1
    return blocks


def imports_of(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def builds(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("Trainer", "DistributedDataParallel", "DDP", "Fabric", "spawn", "init_process_group",
                        "LightningCLI", "start_processes"):
                return True
    return False


@dataclass
class Script:
    code: str
    origin: list[tuple[int, int]]  # (block line in the body, count of lines) of each joined block
    problem: str | None = None  # why it cannot run (a syntax error, ...)


def pick_script(blocks: list[Block], body: str = "") -> Script | None:
    """The runnable program: one Python block that imports torch or Lightning and builds a
    Trainer or DDP model, else the Python blocks that parse on their own joined in order if
    together they do; a paste that looks like the program but does not parse is returned with
    its problem. Blocks under the form's "Error messages and logs" and "Environment" headings
    are output, not code."""
    lines = body.splitlines()

    def heading(b: Block) -> str:
        for line in reversed(lines[:b.line - 1]):
            m = re.match(r"^#{2,4}\s+(.+?)\s*$", line)
            if m:
                return m[1]
        return ""

    python = [b for b in blocks if b.lang in ("", "python", "py", "python3")
              and not fingerprint.HEADER.search(b.code) and b.code.strip()
              and not (b.lang == "" and (heading(b) in (FORM[3], FORM[4]) or "nvironment" in heading(b)))]

    def runnable(code: str) -> tuple[bool, str | None]:
        try:
            tree = ast.parse(code)
        except SyntaxError as err:
            looks = re.search(r"^\s*(?:import|from)\s+(?:torch|lightning|pytorch_lightning)\b", code, re.M)
            return bool(looks and re.search(r"Trainer\(|DistributedDataParallel\(|DDP\(", code)), \
                f"a syntax error at line {err.lineno}: {err.msg}"
        wanted = {"torch", "lightning", "pytorch_lightning"} & imports_of(tree)
        return bool(wanted and builds(tree)), None

    for b in python:
        ok, problem = runnable(b.code)
        if ok:
            return Script(b.code + "\n", [(b.line, len(b.code.splitlines()))], problem)
    parsed = [b for b in python if parses(b.code)]
    if len(parsed) > 1:
        python = parsed
        joined = "\n\n".join(b.code for b in python)
        ok, problem = runnable(joined)
        if ok:
            return Script(joined + "\n", [(b.line, len(b.code.splitlines())) for b in python], problem)
    return None


def is_output(code: str) -> bool:
    """A block of printed output or a shell session, not code (it parses only by chance)."""
    lines = [line for line in code.splitlines() if line.strip()]
    return bool(lines) and all(re.match(r"^\s*(?:\$ |>>> |\[rank\d+\]|Epoch \d|GPU available|\d+(?:\.\d+)?$)",
                                        line) for line in lines)


def parses(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


FRAME_LINE = re.compile(r'^\s*(?:\[rank\d+\]:\s*)?File "[^"\n]+", line \d+', re.M)


def is_traceback(text: str) -> bool:
    """A traceback, with its ``Traceback (most recent call last):`` header or without it (pasted
    from its frames on): frame lines and an exception line after them."""
    return bool(fingerprint.HEADER.search(text)) or bool(FRAME_LINE.search(text)) and \
        exception_line(text[FRAME_LINE.search(text).start():]) is not None


def tracebacks(text: str) -> list[str]:
    """Every block (or run of plain text) that holds a traceback."""
    found = [b.code for b in code_blocks(text) if is_traceback(b.code)]
    if not found and is_traceback(text):
        found = [text]
    return found


CONSEQUENCES = re.compile(r"ChildFailedError|ProcessRaisedException|ProcessExitedException|"
                          r"Connection (?:closed|reset) by peer|DistBackendError|SignalException")


def exception_line(traceback: str) -> tuple[str, str] | None:
    """(class, message) of the exception that a traceback shows as the cause: the last one, in
    the order of the paste, that is not a consequence of another rank's failure (a launcher's
    ChildFailedError, a peer's closed connection); one of those only when nothing else is."""
    found = []
    for stream in fingerprint.streams(traceback).values():
        for pos, line in stream:
            m = re.match(r"^(?P<cls>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure|Warning))"
                         r"(?::\s*(?P<msg>.*))?$", line.strip())
            if m:
                found.append((pos, m["cls"], (m["msg"] or "").strip()))
    found.sort()
    causes = [f for f in found if not CONSEQUENCES.search(f"{f[1]}: {f[2]}")]
    pick = (causes or found)[-1:]
    return (pick[0][1], pick[0][2]) if pick else None


VERSION = r"v?(\d+\.\d+(?:\.\d+)?(?:\.post\d+|rc\d+)?)"


def stated_versions(issue: Issue) -> dict:
    """What the reporter says: Lightning (the form's version field, ``v2.4`` meaning the newest
    2.4.x; the Environment section; "since upgrading to 2.5.0") and torch."""
    s = sections(issue.body)
    said: dict = {"lightning": None, "torch": None, "from": []}
    form = s.get(FORM[1], "")
    m = re.search(VERSION, form)
    if m:
        said["lightning"] = m[1]
        said["from"].append(f"the form's version field: {form.splitlines()[0].strip()}")
    env = "\n".join(v for k, v in s.items() if k == FORM[4] or "nvironment" in k)
    note = r"\s*(?:\([^)]*\))?\s*"  # the form's "(e.g., 1.5.0)"
    lightning_rx = (rf"(?:pytorch[ _-]?lightning|lightning)\s*(?:version)?{note}[:=]{{1,2}}\s*{VERSION}"
                    rf"|^\s*[-*#]?\s*(?:pytorch-lightning|lightning)\s+{VERSION}")
    torch_rx = (rf"(?:pytorch|torch)\s*(?:version)?{note}[:=]{{1,2}}\s*{VERSION}"
                rf"|^\s*[-*#]?\s*(?:torch|pytorch)\s+{VERSION}")
    for name, rx in (("lightning", lightning_rx), ("torch", torch_rx)):
        m = re.search(rx, env, re.I | re.M)
        if m and (name == "torch" or not said["lightning"] or said["lightning"].count(".") < 2):
            said[name] = next(g for g in m.groups() if g)
            said["from"].append(f"the Environment section: {m[0].strip()}")
    if not said["lightning"]:
        m = re.search(rf"(?:since|after) (?:upgrading|updating|moving|going) to (?:lightning )?{VERSION}",
                      issue.body, re.I)
        if m:
            said["lightning"] = m[1]
            said["from"].append(f"the text: {m[0]}")
    return said
