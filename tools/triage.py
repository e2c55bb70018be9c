"""``nox -s triage -- ISSUE``: from a reported issue to a paste-ready triage comment backed by runs.

ISSUE is a GitHub issue URL (read through GitHub's REST API, ``GITHUB_TOKEN`` if set, cached under
``.cache/issues/`` so a re-run works offline; ``GITHUB_API_URL`` points elsewhere), or a saved
file: the API's JSON, or the issue's Markdown. The headings of Lightning's bug-report form are
understood.

1. **Read**: the runnable script (the fenced blocks that import torch or Lightning and build a
   ``Trainer`` or a DDP model; blocks that belong together are joined in order), the tracebacks
   (``[rankN]:`` prefixes too), the versions the reporter states, and the signature: the reported
   exception's class and message, never generic (``--signature`` overrides). A run reproduces
   only when it fails with that exception raised at the same place. A report of ranks or results
   drifting apart turns on the replica check (``--check-replicas``).
2. **Run it safely**: pasted code is untrusted. A static check refuses downloads, shell-outs,
   ``eval``/``exec`` of built strings and writes outside the working folder (``--trust`` runs it
   anyway): a courtesy that explains a refusal early, never the defence. Every run is in the
   sandbox (``tools/sandbox.py``: bubblewrap, nobody inside, loopback only, the system read-only,
   a throwaway HOME, TMPDIR and folder on a size-limited tmpfs); where the machine cannot make
   one, nothing runs, unless ``--allow-unsandboxed`` says so. A
   GPU script is ported to the CPU (accelerator, ``.cuda()``, NCCL, 16-bit precision), shown as
   a diff.
3. **Reproduce and locate**: ``--trials`` runs in the reporter's versions and in the newest
   release on the newest torch, with the rate; when it reproduces on the newest, a release
   bisect (``nox -s bisect``), then the commits with ``--repo``/``LIGHTNING_REPO``; when it
   reproduces on the reporter's versions only, the bisect for the fix (``--find-fix``) on the
   reporter's torch; a minimization within ``--minimize-budget``. A reproduced report that shows a
   bug the workspace knows (``known_as`` in ``repro/matrix.toml``) is run again with the series'
   fix (``nox -s patches -- --script``): bad before, good after. A report with a traceback and no
   script gets its frames, the workspace's repro of a bug it matches run in the reporter's
   versions (stated, else fingerprinted), and the questions for the reporter.
4. **Output**: ``results/triage/<id>/comment.md`` (its first line a status a bot can parse),
   ``triage.json`` (every field), the script as run, logs per run.

Exit codes: 0 the triage is done (whatever it found), 2 bad input (one line), 128 harness
failure, 130 interrupted.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools import contract, envs, fingerprint, index, results, sandbox
from tools.contract import BadInput, HarnessFailure
from tools.launcher import How, Launcher, Run

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "issues"
AUTO_TRIALS = 5  # --trials auto: runs per cell, the rate the bisect's own auto measures from
NEWEST_TORCH = "2.13.0"  # the newest torch this workspace runs on (its CPU build)
ISSUE_URL = re.compile(r"^https://github\.com/(?P<repo>[\w.-]+/[\w.-]+)/issues/(?P<number>\d+)/?$")
FORM = ("Bug description", "What version are you seeing the problem on?", "How to reproduce the bug",
        "Error messages and logs", "Environment", "More info")
_APART = r"(?:diverg\w*|drift\w*|out of sync|differ\w*|disagree\w*|not (?:the same|identical))"
_RANKS = r"(?:ranks?|replicas?|gpus|processes|devices|workers|nodes)\b"
HANG = re.compile(r"\b(?:hangs?|hanging|hung|stuck|deadlock\w*|never (?:finishes|returns|ends|completes))\b"
                  r"(?!\s+(?:at|around|near)\s+[\d.]+)", re.I)  # not "loss stuck at 0.69"
NOT_A_HANG = re.compile(r"\b(?:loss|accuracy|acc|metric|lr|learning rate|value|score)\w*\W+(?:\w+\W+){0,3}$",
                        re.I)
DEFAULT_TIMEOUT = 300.0
HANG_TIMEOUT = 120.0  # seconds: a run of a report that says it hangs is bad when it outlives this
DRIFT = re.compile(rf"\b{_APART}\b[^.\n]{{0,80}}\b{_RANKS}|\b{_RANKS}[^.\n]{{0,80}}\b{_APART}", re.I)
_started = time.monotonic()


def progress(stage: str, text: str) -> None:
    print(f"[triage {time.monotonic() - _started:5.0f} s] {stage}: {text}", flush=True)


# -- 1. read the issue ------------------------------------------------------------------------

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


def _imports(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def _builds(tree: ast.AST) -> bool:
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
        wanted = {"torch", "lightning", "pytorch_lightning"} & _imports(tree)
        return bool(wanted and _builds(tree)), None

    for b in python:
        ok, problem = runnable(b.code)
        if ok:
            return Script(b.code + "\n", [(b.line, len(b.code.splitlines()))], problem)
    parsed = [b for b in python if _parses(b.code)]
    if len(parsed) > 1:
        python = parsed
        joined = "\n\n".join(b.code for b in python)
        ok, problem = runnable(joined)
        if ok:
            return Script(joined + "\n", [(b.line, len(b.code.splitlines())) for b in python], problem)
    return None


def completed_script(issue: Issue, text: str, t: dict) -> Script | None:
    """The report's Python snippets (joined in order) completed into a program
    (``tools/completion.py``) against the newest release's exports: its imports, a model it
    never makes, a ``fit`` of a module it never trains. None when it still is not one; what is
    missing then goes in ``t["missing"]``."""
    from tools import bisect_cli, completion

    def snippets(text: str) -> list[Block]:
        return [b for b in code_blocks(text) if b.lang in ("", "python", "py", "python3") and b.code.strip()
                and not _is_traceback(b.code) and _parses(b.code) and not _is_output(b.code)]

    # the reporter's own code: the body's blocks, else one comment's (never a mix of people's)
    blocks = snippets(issue.body) or next((found for c in issue.comments if (found := snippets(c))), [])
    if not blocks:
        t["missing"] = ["the report holds no Python code" + (" (only a diff of a proposed change)" if any(
            b.lang in ("diff", "patch") for b in code_blocks(issue.body)) else "")]
        return None
    code = "\n\n".join(b.code for b in blocks) + "\n"
    package = completion.guess_package(code, text)
    try:
        python = bisect_cli.release_env(package, newest_release(package), NEWEST_TORCH, ())
    except envs.EnvError as err:
        t["missing"] = [f"the snippet could not be completed: no environment ({err})"]
        return None
    done = completion.complete(code, package, completion.exports(python, package))
    t["missing"] = done.missing
    if done.stand_ins and t.get("tracebacks"):  # the traceback came from the reporter's own model
        t["missing"] = done.missing + [f"the snippet does not make {', '.join(done.stand_ins)}, and the "
                                       "traceback came from the reporter's own: a stand-in would not "
                                       "be the reported run"]
        return None
    tree = ast.parse(done.code)
    if not ({"torch", "lightning", "pytorch_lightning"} & _imports(tree) and _builds(tree)):
        t["missing"] = done.missing + ["no `Trainer` or DDP model is built, and no `LightningModule` "
                                       "defined to train"]
        return None
    t.update(package=package, completion={"changes": done.changes, "diff": done.diff})
    progress("read", f"the snippet completed: {'; '.join(done.changes)}")
    return Script(done.code, [(b.line, len(b.code.splitlines())) for b in blocks])


def _is_output(code: str) -> bool:
    """A block of printed output or a shell session, not code (it parses only by chance)."""
    lines = [line for line in code.splitlines() if line.strip()]
    return bool(lines) and all(re.match(r"^\s*(?:\$ |>>> |\[rank\d+\]|Epoch \d|GPU available|\d+(?:\.\d+)?$)",
                                        line) for line in lines)


def _assert_message(code: str) -> str | None:
    """The message of the script's own ``assert`` (a constant one): its failure is what the
    script shows. A bare ``assert`` says too little (torch's own asserts raise the same class)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    return next((n.msg.value for n in ast.walk(tree) if isinstance(n, ast.Assert)
                 and isinstance(n.msg, ast.Constant) and isinstance(n.msg.value, str)
                 and n.msg.value.strip()), None)


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


FRAME_LINE = re.compile(r'^\s*(?:\[rank\d+\]:\s*)?File "[^"\n]+", line \d+', re.M)


def _is_traceback(text: str) -> bool:
    """A traceback, with its ``Traceback (most recent call last):`` header or without it (pasted
    from its frames on): frame lines and an exception line after them."""
    return bool(fingerprint.HEADER.search(text)) or bool(FRAME_LINE.search(text)) and \
        exception_line(text[FRAME_LINE.search(text).start():]) is not None


def tracebacks(text: str) -> list[str]:
    """Every block (or run of plain text) that holds a traceback."""
    found = [b.code for b in code_blocks(text) if _is_traceback(b.code)]
    if not found and _is_traceback(text):
        found = [text]
    return found


# an exception a sentence quotes: "... fails with `ValueError: x must be ...`", or unquoted on its line
PROSE_EXCEPTION = re.compile(
    r"`(?P<cls>[A-Za-z_][\w.]*(?:Error|Exception))(?::\s*(?P<msg>[^`\n]+))?`"
    r"|\*\*(?P<cls3>[A-Za-z_][\w.]*(?:Error|Exception)):\s*(?P<msg3>[^*\n]+)\*\*"
    r"|\b(?P<cls2>[A-Z]\w*(?:Error|Exception)):\s+(?P<msg2>[^\n`*]+?)\s*(?:$|(?<=[.!?])\s)", re.M)
# a sentence that mentions an exception in passing, not as the error reported
ELSEWHERE = re.compile(r"\b(?:like|as in|see|similar to|unlike|used to|previously|before|expected|"
                       r"instead of)\b|#\d+|\bin (?:v?\d+\.\d+|the old)", re.I)


def hang_said(body: str):
    """The words by which the report's own text (not its code, not its comments) says the run
    hangs ("gets stuck", "never returns"); not a value that is stuck ("the loss is stuck")."""
    prose = re.sub(r"^\s*(`{3,}|~{3,}).*?^\s*\1", "", body, flags=re.M | re.S)
    prose = re.sub(r"(?<!\n)\n(?!\n)", " ", prose)
    return next((m for m in HANG.finditer(prose) if not NOT_A_HANG.search(prose[:m.start()])), None)


def prose_exception(text: str) -> tuple[str, str] | None:
    """(class, message) of an exception the report quotes in a sentence, outside its code
    blocks (a report without a traceback): the first one with a message, in backticks, in bold,
    or plain to the end of its sentence; one the sentence only mentions in passing ("like #123",
    "in 2.3 this raised ...") does not count."""
    fenced = re.sub(r"^\s*(`{3,}|~{3,}).*?^\s*\1", "", text, flags=re.M | re.S)
    for m in PROSE_EXCEPTION.finditer(fenced):
        cls = m["cls"] or m["cls3"] or m["cls2"]
        msg = (m["msg"] or m["msg3"] or m["msg2"] or "").strip().rstrip(".")
        before = fenced[:m.start()]
        sentence = before[max((b.end() for b in re.finditer(r"[.!?]\s|\n", before)), default=0):]
        if msg and not ELSEWHERE.search(sentence):
            return cls, msg
    return None


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


def derive_signature(cls: str, message: str, quoted: bool = False) -> str:
    """A regex for ``cls: message``: the class, and the message's distinctive part (its first
    sentence, up to 80 characters) with addresses and numbers generalized, quotes either way.
    ``quoted``: a message quoted in prose, where Markdown ate the backticks the real one has
    around names (``ModelCheckpoint``): a backtick is allowed at every word's edge."""
    if quoted:
        message = message.replace("`", "")
    first = re.split(r"(?<=[.:;])\s", message, maxsplit=1)[0]
    if len(first) < 20 or first.endswith(":"):  # "CUDA error:" says little: the next sentence too
        first = message
    message = first[:80].rstrip()
    parts = []
    for token in re.findall(r"0x[0-9a-fA-F]+|\d+|['\"]|[^'\"\d]+|\d", message):
        if token.startswith("0x"):
            parts.append("0x[0-9a-fA-F]+")
        elif token.isdigit():
            parts.append(r"\d+")
        elif token in ("'", '"'):
            parts.append("['\"]")
        else:
            parts.append(re.escape(token).replace("\\ ", "`?\\ `?") if quoted else re.escape(token))
    short = re.escape(cls.rsplit(".", 1)[-1])
    return f"{short}: {'`?' if quoted else ''}{''.join(parts)}" if parts else short


def _report_site(traceback: str, signature: str) -> tuple[str, ...] | None:
    """Where the report raised the signature: within one rank's lines (interleaved ranks would
    give one rank's exception another's frame)."""
    from tools.minimize import crash_site

    for rank, stream in fingerprint.streams(traceback).items():
        # "[rank5]: File" keeps the space after the prefix: one less gives the original indent
        text = "\n".join(line[1:] if rank and line.startswith(" ") else line for _, line in stream)
        site = crash_site(text, signature, ())
        if site:
            return _normal(site)
    return None


def same_exception_in_own_code(here, site) -> bool:
    """Both raised in the reporter's own code (not a library frame), the same exception class:
    the report's function may have been renamed or inlined since its traceback."""
    return bool(here and site and here[1] == site[1] == "(script)" and here[0] == site[0])


def _normal(site: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """(class, where, function) with a library path as fingerprint names it, a user's file as
    its function only (the reporter's path is not ours)."""
    if site is None:
        return None
    cls, where, func = site
    located = fingerprint.locate(where if where.startswith("/") else f"/x/site-packages/{where}")
    return (cls.rsplit(".", 1)[-1], f"{located[0]}:{located[1]}" if located else "(script)", func)


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


def resolve(package: str, version: str | None) -> str | None:
    """A stated Lightning version as a release: ``2.4`` is the newest 2.4.x; None if unknown."""
    if not version:
        return None
    known = [str(v) for v, r in index.releases(package).items() if not v.is_prerelease and not r.yanked]
    if version in known:
        return version
    series = [v for v in known if v.startswith(version + ".")]
    return series[-1] if series else None


def fingerprinted(frames: list, package: str, repo: str | None, t: dict | None = None) -> str | None:
    """The newest release whose source has every quoted line of the traceback's Lightning frames
    (``nox -s fingerprint``; a Lightning checkout's tags when one is configured, else wheels);
    for a lossy traceback (a frame without its line, a line of an edited file) the newest of
    those that match the most frames, as ``nox -s fingerprint`` ranks them (``t["fingerprint"]``
    says how many matched)."""
    from packaging.version import Version

    mine = [f for f in frames if f.package in fingerprint.PACKAGES[package]]
    versions = fingerprint.releases_since(package, Version("2.0.0"), mine)
    if not versions:
        return None
    if repo:
        from tools import gitrange

        checkout = gitrange.repo_at(repo)
        tags = {t.name for t in checkout.tags}
        versions = [v for v in versions if str(v) in tags]
        sources = lambda v: fingerprint.GitSources(checkout, str(v))  # noqa: E731
    else:
        sources = lambda v: fingerprint.WheelSources(package, v)  # noqa: E731
    progress("read", f"fingerprinting {len(mine)} {package} frame(s) over {len(versions)} releases")
    try:
        total, ranking = fingerprint.rank(mine, versions, sources, log=lambda m: None)
    except (OSError, index.UnknownRelease) as err:
        progress("read", f"  fingerprint failed: {err}")
        return None
    if not total or not ranking or not ranking[0][0]:
        return None
    score, best = ranking[0]
    if score * 2 < total:  # fewer than half the frames: no release is the reporter's
        return None
    if t is not None:
        t["fingerprint"] = {"matched": score, "frames": total, "releases": best}
    return best[-1]


# -- 2. run it safely ---------------------------------------------------------------------------

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


# -- 3. reproduce and locate -----------------------------------------------------------------

@dataclass
class Cell:
    label: str  # "reporter's", "newest"
    package: str
    lightning: str
    torch: str
    verdicts: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0
    python: Path | None = None  # its environment's interpreter, once made
    source: str | None = None  # a Lightning checkout run from source (master), on ``base``'s environment
    base: str | None = None

    @property
    def bad(self) -> int:
        return self.verdicts.count("bad")

    @property
    def tested(self) -> int:
        return self.bad + self.verdicts.count("good")

    @property
    def rate(self) -> str:
        """bad of the runs that could test, and the ones that could not apart."""
        skips = len(self.verdicts) - self.tested
        return f"{self.bad}/{self.tested}" + (f" ({skips} could not test)" if skips else "")


RUNS: list[float] = []  # seconds of each run of the cells so far (the ETA)


def eta(left: int) -> str:
    """``left`` more runs at the mean pace so far."""
    return f", ETA ~{left * sum(RUNS) / len(RUNS):.0f} s for the cells" if RUNS and left else ""


def run_cell(cell: Cell, script: Path, args, out: Path, launcher: Launcher, site, after: int = 0) -> None:
    """``--trials`` runs of the script in ``cell``; ``after``: the runs of the cells still to come."""
    from tools import bisect_cli

    progress("run", f"{cell.label} cell: {cell.package} {cell.lightning} + torch {cell.torch}")
    try:
        python = bisect_cli.release_env(cell.package, cell.base or cell.lightning, cell.torch, ())
    except envs.EnvError as err:
        cell.verdicts, cell.reasons = ["skip"], [f"environment: {err}"]
        return
    cell.python = python
    env = bisect_cli.source_env(Path(cell.source)) if cell.source else {}
    started = time.monotonic()
    for trial in range(args.trials):
        name = cell.lightning.replace(" ", "-")
        stem = out / "logs" / f"{cell.package}-{name}-torch{cell.torch}-{trial + 1}"
        r = launcher.run(Run((str(script),), python, env=env, timeout=args.timeout, signature=args.signature,
                             bad_output=args.bad_output, log_stem=stem, check_replicas=args.check_replicas,
                             sandbox=sandbox_mode(args)))
        verdict, reason = r.verdict, r.reason or ""
        logs = [Path(p) for p in (r.stdout_path, r.stderr_path) if p and Path(p).exists()]
        logs += sorted(stem.parent.glob(f"{stem.name}.node*"))  # a job of several nodes: each one's
        text = "\n".join(p.read_text(errors="replace")[-200_000:] for p in logs) if verdict == "bad" else ""
        if verdict == "bad" and site is not None:
            raw = _crash_site(text, args.signature)
            here = _normal(raw)
            if here != site and same_exception_in_own_code(here, site) and Path(raw[1]).name == script.name:
                # the posted script is often not the one that made the traceback (a helper
                # inlined, renamed): in the reporter's own code the exception is what counts
                reason = (f"the signature, raised in the script's `{here[2]}` (the report's traceback: "
                          f"`{site[2]}`; the script was edited since?)")
            elif here != site:
                verdict, reason = "skip", (f"the signature, but raised elsewhere: {here} (reported: "
                                           f"{site})")
        if getattr(args, "hang", False) and reason.startswith("timed out"):  # the hang the report says
            verdict, reason = "bad", f"it hangs: {reason}"
        if r.code >= contract.FAIL:
            if r.returncode is None or (r.reason or "").startswith("harness failure"):
                # the harness could not start it or keep its logs (a full disk): never the script's
                raise HarnessFailure(f"{cell.label} cell: {reason}")
            verdict, reason = "skip", f"the script exited {r.returncode} (its own failure): {reason}"
        cell.verdicts.append(verdict)
        cell.reasons.append(reason)
        if verdict == "bad":
            SEEN.setdefault(cell.label, text)
        RUNS.append(r.seconds)
        left = args.trials - trial - 1 + after
        progress("run", f"  trial {trial + 1}/{args.trials}: {verdict} ({reason[:120]}){eta(left)}")
    cell.seconds = round(time.monotonic() - started, 1)


SEEN: dict[str, str] = {}  # a cell's label -> the output of its first bad run (for known bugs)


def _cells_key(code: str, args) -> str:
    """What a cell's runs depend on besides its versions: the script as run, how it is judged."""

    said = json.dumps([code, args.signature, args.check_replicas, args.timeout, args.trials,
                       list(getattr(args, "nodes", (1, 1))), sandbox_mode(args),
                       getattr(args, "hang", False), getattr(args, "bad_output", None)])
    return hashlib.sha256(said.encode()).hexdigest()


def _earlier_cells(out: Path, code: str, args) -> list[dict]:
    """The cells an earlier triage of the same input finished with the same script and judgement
    (an interrupted or repeated triage resumes there)."""
    try:
        t = json.loads((out / "triage.json").read_text())
    except (OSError, ValueError):
        return []
    if t.get("cells_key") != _cells_key(code, args):
        return []
    return [c for c in t.get("cells") or [] if len(c.get("verdicts") or []) == args.trials]


def _resume(cell: Cell, earlier: list[dict], out: Path) -> bool:
    """``cell``'s runs from the earlier triage, when it made them all; its first bad run's output
    read back from its logs."""
    done = next((c for c in earlier if (c["label"], c["package"], c["lightning"], c["torch"]) ==
                 (cell.label, cell.package, cell.lightning, cell.torch)), None)
    if done is None:
        return False
    cell.verdicts, cell.reasons, cell.seconds = list(done["verdicts"]), list(done["reasons"]), done["seconds"]
    cell.python = Path(done["python"]) if done.get("python") not in (None, "None") else None
    if "bad" in cell.verdicts:
        stem = out / "logs" / f"{cell.package}-{cell.lightning.replace(' ', '-')}-torch{cell.torch}-" \
                              f"{cell.verdicts.index('bad') + 1}"
        logs = [Path(f"{stem}.stdout"), Path(f"{stem}.stderr"),
                *sorted(stem.parent.glob(f"{stem.name}.node*"))]
        SEEN.setdefault(cell.label, "\n".join(p.read_text(errors="replace")[-200_000:] for p in logs
                                               if p.exists()))
    progress("run", f"{cell.label} cell: {cell.rate} bad, from the earlier triage of this input")
    return True


def master_cell(args, package: str, newest: str) -> Cell | None:
    """Lightning's master of the configured checkout, its source on the newest release's
    environment (as the commit bisect runs commits); None without a checkout."""
    if not args.repo:
        return None
    import git

    from tools import bisect_cli, gitrange

    try:
        repo = gitrange.open_repo(args.repo, bisect_cli.CACHE / "repos", log=lambda m: progress("run", m))
        try:  # the source's master now (a local source was fetched by open_repo)
            repo.git.fetch("--quiet", "origin", "+refs/heads/master:refs/remotes/origin/master")
        except git.GitCommandError as err:
            progress("run", f"master not fetched ({str(err).strip().splitlines()[-1][:120]}): the clone's")
        try:
            sha = gitrange.resolve(repo, "origin/master")
        except BadInput:
            sha = gitrange.resolve(repo, "master")
        tree = gitrange.Worktree.claim(repo, bisect_cli.CACHE / "worktrees" / repo.working_dir.split("/")[-1])
        path = tree.checkout(sha)
    except (BadInput, OSError, git.GitError) as err:
        progress("run", f"no master cell: {err}")
        return None
    return Cell("master", package, f"master {sha[:12]}", NEWEST_TORCH, source=str(path), base=newest)


def _crash_site(text: str, signature: str):
    from tools.minimize import crash_site

    return crash_site(text, signature, ())


def bisect(script: Path, args, out: Path, oldest: str, package: str, torch: str = NEWEST_TORCH,
           fix: tuple[str, str] | None = None, torch_axis: tuple[str, str, str] | None = None) -> dict | None:
    """The release bisect (then the commits with a repo) as ``nox -s bisect`` runs it; with
    ``fix`` (a release with the bug, a newer one without it) the bisect for the fix; with
    ``torch_axis`` (a Lightning release, an older and a newer torch) torch's releases, that
    Lightning release fixed."""
    cmd = [sys.executable, "-m", "tools.bisect_cli", "--tier", "both" if args.repo else "releases",
           "--package", package, "--repro", str(script), "--torch", torch, "--oldest", oldest,
           "--out", str(out / "bisect"), "--timeout", str(args.timeout), *sandbox_flag(args)]
    if torch_axis:
        lightning, older, newer = torch_axis
        cmd[cmd.index("--tier") + 1] = "releases"
        cmd += ["--axis", "torch", "--lightning", lightning]
        if not fix:
            cmd += ["--good", older, "--bad", newer]
    if fix:
        cmd += ["--find-fix", "--bad", fix[0], "--good", fix[1]]
    if getattr(args, "auto", False):
        cmd += ["--trials", "auto"]
    cmd += ["--jobs", args.jobs, *_nodes_args(args), *(["--state", args.state] if args.state else [])]
    if args.signature:
        cmd += ["--signature", args.signature]
    if args.check_replicas:
        cmd.append(f"--check-replicas={args.check_replicas}")
    if getattr(args, "hang", False):
        cmd.append("--hang")
    if getattr(args, "bad_output", None):
        cmd += ["--bad-output", args.bad_output]
    if args.repo:
        cmd += ["--repo", args.repo]
    progress("bisect", shlex.join(cmd[2:]))
    proc = subprocess.run(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(proc.stderr)
    if proc.returncode >= contract.FAIL:
        raise HarnessFailure(f"the bisect failed (exit {proc.returncode})")
    try:
        return {"exit": proc.returncode, **json.loads((out / "bisect" / "report.json").read_text()),
                "markdown": (out / "bisect" / "report.md").read_text()}
    except (OSError, ValueError):  # no report: its one-line reason (an end that does not hold)
        said = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return {"exit": proc.returncode, "markdown": None, "why": said.removeprefix("error: ")}


def sandbox_mode(args) -> bool | str:
    """What a run's ``sandbox`` is: the sandbox (True), with the machine's network ("network"),
    or none at all ("none": ``--allow-unsandboxed``)."""
    return "none" if args.allow_unsandboxed else "network" if args.allow_network else True


def sandbox_flag(args) -> list[str]:
    """The same for ``tools.bisect_cli`` and ``tools.minimize`` run as programs."""
    mode = sandbox_mode(args)
    return [] if mode == "none" else ["--sandbox=network"] if mode == "network" else ["--sandbox"]


def _nodes_args(args) -> list[str]:
    n, r = getattr(args, "nodes", (1, 1))
    return ["--nodes", str(n), "--ranks-per-node", str(r)] if n > 1 else []


def minimize(script: Path, args, out: Path, python: Path) -> dict | None:
    if not args.minimize_budget:
        return None
    if getattr(args, "hang", False):  # every candidate would run to its limit
        return {"exit": None, "lines": None, "why": "a hang is not minimized"}
    if getattr(args, "bad_output", None):
        return {"exit": None, "lines": None, "why": "a behaviour without an exception is not minimized"}
    target = out / "minimize"
    cmd = [sys.executable, "-m", "tools.minimize", str(script), "--python", str(python), "--budget",
           str(args.minimize_budget), "--out", str(target)]
    cmd += sandbox_flag(args)
    if args.signature:
        cmd += ["--signature", args.signature]
    if args.check_replicas:
        cmd.append(f"--check-replicas={args.check_replicas}")
    cmd += _nodes_args(args)
    progress("minimize", f"{args.minimize_budget:g} min")
    proc = subprocess.run(cmd, cwd=ROOT)
    result = target / "minimized.py"
    if proc.returncode == 0 and result.is_file():
        from tools.minimize import size

        lines, before = size({"m": result.read_text()})[0], size({"s": script.read_text()})[0]
        if lines < before:  # only a smaller one goes in the comment
            return {"lines": lines, "of": before, "code": result.read_text()}
        return {"exit": 0, "lines": None, "why": f"not smaller ({lines} of {before} lines)"}
    return {"exit": proc.returncode, "lines": None}


# -- known bugs: the workspace's own repros ------------------------------------------------------

def known(text: str) -> list:
    """The workspace's repros (``repro/matrix.toml``) whose ``known_as`` the text shows: what a
    report's traceback, or a run of the reporter's script, has in common with a bug we know."""
    from tools import matrix

    return [r for r in matrix.load().repros if r.known_as and re.search(r.known_as, text)]


def patches_for(repro) -> list:
    """The series' patches whose ``X-Repro`` is that repro: the fix the workspace has for it."""
    from tools import patches

    return [p for p in patches.series() if p.repro and p.repro[0] == repro.script]


def run_known(repro, package: str, lightning: str, torch: str, args, out: Path, launcher: Launcher) -> dict:
    """The workspace's repro in the reporter's versions, ``--trials`` times: its own verdicts."""
    from tools import bisect_cli

    row = {"repro": repro.name, "issue": repro.issue, "script": repro.script, "package": package,
           "lightning": lightning, "torch": torch, "verdicts": [], "reasons": []}
    progress("known", f"{repro.name} (#{repro.issue}) on {package} {lightning} + torch {torch}")
    try:
        python = bisect_cli.release_env(package, lightning, torch, ())
    except envs.EnvError as err:
        row.update(verdicts=["skip"], reasons=[f"environment: {err}"])
        return row
    for trial in range(args.trials):
        stem = out / "logs" / f"known-{repro.name}-{trial + 1}"
        argv = [a.replace("{out}", f"{stem}.d") for a in repro.args]
        r = launcher.run(Run((str(ROOT / repro.script), *argv), python, timeout=args.timeout, log_stem=stem,
                             own=True))
        row["verdicts"].append(r.verdict)
        row["reasons"].append(r.reason or "")
        progress("known", f"  trial {trial + 1}/{args.trials}: {r.verdict} ({(r.reason or '')[:120]})")
    bad, tested = row["verdicts"].count("bad"), sum(v in ("bad", "good") for v in row["verdicts"])
    row["rate"] = f"{bad}/{tested}"
    row["tested"] = tested
    return row


def fixed_by_series(script: Path, repro, cell_id: str, args, out: Path) -> dict:
    """The reporter's script without and with the series in a cell the series targets, as
    ``nox -s patches -- --script`` runs it: the evidence that it is the known bug."""
    from tools import matrix, patches, validate_patches

    cells = {c.id: c for c in matrix.load().cells}
    series = patches.series()
    progress("known", f"the reporter's script without and with the series in {cell_id}")
    row = validate_patches.script_row(
        validate_patches.Script(script, args.signature, (cell_id,), "python", args.check_replicas,
                                sandbox_mode(args), getattr(args, "nodes", (1, 1))),
        cells[cell_id], series, out / "known")
    return {"repro": repro.name, "issue": repro.issue, "cell": cell_id, "patches": row["on_top_of"],
            "before": row["before"], "after": row["after"], "after_detail": row["after_detail"],
            "runs": [row["before_runs"], row["after_runs"]], "ok": row["ok"]}


def runs_made(k: dict) -> str:
    """How many runs the series' evidence took, in words."""
    before, after = k.get("runs") or (1, 1)
    if before == after == 1:
        return "one run each"
    return (f"{before} run(s) without, {after} with: a run that died of a signal before a verdict "
            "was made again")


def series_cell(package: str, lightning: str, torch: str, fixes: list) -> str | None:
    """The matrix cell of these versions, if a patch of the fix targets it."""
    from tools import matrix

    for c in matrix.load().cells:
        if (c.package, c.lightning, c.torch) == (package, lightning, torch) and any(
                c.id in p.cells for p in fixes):
            return c.id
    return None


# -- 4. the comment -----------------------------------------------------------------------------

def questions(issue: Issue, like: int | None = None) -> list[str]:
    """The questions for the reporter: ``patches/questions.toml``'s for this issue, or for the
    known bug it matches (``like``), else the "needs a repro" template."""
    number = issue.id.rsplit("-", 1)[-1]
    asked = tomllib.loads((ROOT / "patches" / "questions.toml").read_text())
    return asked.get(number) or (like and asked.get(str(like))) or [
        "Can you share a self-contained script that shows it on one node with two devices (or two "
        "CPU processes), with the smallest model and random data?",
        "How many nodes and devices per node, and which launcher (Lightning's own, torchrun, SLURM)?",
        "The exact versions: `python -m lightning.pytorch.utilities.collect_env_details` or `pip list`.",
        "The full log of every rank (with `[rankN]:` prefixes), not only rank 0's.",
    ]


def _fence(code: str) -> str:
    longest = max((len(m) for m in re.findall(r"`{3,}", code)), default=2)
    return "`" * max(3, longest + 1)


# what a secret looks like, wherever it came from (a run's output reaches the comment's reasons)
SECRETS = [re.compile(p) for p in (
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)",
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})",  # GitHub
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}",  # Slack
    r"\b(?:sk|pk|rk)[-_](?:live|test|proj)?[-_]?[A-Za-z0-9_-]{20,}",  # OpenAI, Stripe, ...
    r"\bhf_[A-Za-z0-9]{20,}",  # Hugging Face
    r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # JSON web tokens
    r"(?i)\b(?:password|passwd|secret|token|api[_-]?key|access[_-]?key)\b\s*[=:]\s*['\"]?[^\s'\",;]{6,}",
    # lines of a password or shadow file: name:pw:uid:gid:... / name:hash:lastchange:...
    r"\b[a-z_][a-z0-9_.-]*:[^:\s]*:\d+:\d+:[^:\n]*:[^:\n]*:[^:\s]*",
    r"\b[a-z_][a-z0-9_.-]*:(?:\$[0-9a-z]+\$[^:\s]+|[!*]+[^:\s]*):\d+:",
)]
STATUS_CAP = 400  # characters of the comment's first line
COMPLETED = "(on the report's snippet, completed: see below) "


def _redact(text: str) -> str:
    """No secret in a comment meant to be pasted publicly: this process's secret variables, and
    anything shaped like a key, a token or a password-file line."""
    for name, value in os.environ.items():
        if value and len(value) >= 8 and re.search(r"TOKEN|SECRET|PASSWORD|KEY", name):
            text = text.replace(value, f"[{name}]")
    for pattern in SECRETS:
        text = pattern.sub("[redacted]", text)
    return text


def comment(t: dict) -> str:
    return _redact(_public(_comment(_redacted(t)), t))


def _redacted(value):
    """``value`` (the triage's record) with every text redacted, before any of it is cut short."""
    if isinstance(value, str):
        return _redact(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(v) for v in value]
    return value


def _public(text: str, t: dict) -> str:
    """No path of this machine in a comment: the results folder as the workspace names it, the
    Lightning checkout as ``$LIGHTNING_REPO``."""
    if t.get("repo"):
        text = text.replace(str(t["repo"]), "$LIGHTNING_REPO")
    if t.get("out"):
        text = text.replace(str(t["out"]), f"results/triage/{t.get('folder') or t['id']}")
    return text.replace(f"{ROOT}{os.sep}", "").replace(f"{Path.home()}{os.sep}", f"~{os.sep}")


def _comment(t: dict) -> str:
    status = t["status"] if len(t["status"]) <= STATUS_CAP else t["status"][:STATUS_CAP - 1] + "…"
    lines = [f"**Triage:** {status}", ""]
    if t.get("refused"):
        lines += ["The script was not run: it could reach outside its sandbox.", "",
                  *[f"- {r}" for r in t["refused"]], "",
                  "Run it anyway with `--trust` (review it first).", ""]
    how = ["- Signature: none"]
    if t.get("signature"):
        source = f" ({t['signature_from']})" if t.get("signature_from") else ""
        how = [f"- Signature: `{t['signature']}`{source}"]
    if t.get("bad_output"):
        how = [f"- Bad when a run exits 0 and prints `{t['bad_output']}` (`--bad-output`): "
               f"{t['signature_from']}"]
    d = t.get("differential") or {}
    if d:
        ran = (f"ran once in {d['broken']} (exit {d['broken_exit']}) and in {d['worked']} (exit "
               f"{d['worked_exit']}), torch {d['torch']}" if "worked_exit" in d else "not run")
        how.append(f"- The report says {d['said']!r}: {ran}" + (f"; {d['why']}" if d.get("why") else ""))
    if t.get("check_replicas"):
        how.append("- Replica check: on (`--check-replicas`): " + t["replicas_why"])
    if t.get("hang_why"):
        how.append("- A hang: a run that outlives its limit is bad (`--hang`): " + t["hang_why"])
    how.append(f"- Sandbox: {t['sandbox'] or 'not needed: nothing was run'}")
    if t.get("versions_said", {}).get("from"):
        how.append("- Versions stated: " + "; ".join(t["versions_said"]["from"]))
    if t.get("versions_fingerprinted"):
        found = t.get("fingerprint") or {}
        every = found.get("matched") == found.get("frames") or not found
        which = ("every quoted line of the traceback's frames" if every else
                 f"the quoted lines of {found['matched']} of the traceback's {found['frames']} frames, the "
                 "most of any release")
        how.append(f"- Versions not stated: the reporter's is {t['versions_fingerprinted']}, the newest "
                   f"release whose source has {which}")
    lines += ["How it was run:", "", *how, ""]
    if t.get("completion"):
        fence, said = _fence(t["completion"]["diff"]), "; ".join(t["completion"]["changes"])
        lines += [f"<details><summary>Completed (assumptions: {said})</summary>", "", f"{fence}diff",
                  t["completion"]["diff"].rstrip(), fence, "", "</details>", ""]
    if t.get("missing") and not t.get("cells"):
        lines += ["What the report does not give:", "", *[f"- {m}" for m in t["missing"]], ""]
    if t.get("port_diff"):
        fence = _fence(t["port_diff"])
        lines += ["<details><summary>CPU port (" + ", ".join(t["port_changes"]) + ")</summary>", "",
                  f"{fence}diff", t["port_diff"].rstrip(), fence, "", "</details>", ""]
    if t.get("cells"):
        lines += ["| cell | Lightning | torch | reproduced | how the runs ended |", "|---|---|---|---|---|"]
        for c in t["cells"]:
            ended = "; ".join(sorted({f"{v}: {r[:100]}".replace("|", "/") for v, r in zip(
                c["verdicts"], c["reasons"], strict=True)}))
            lines.append(f"| {c['label']} | {c['package']} {c['lightning']} | {c['torch']} | {c['rate']} | "
                         f"{ended} |")
        lines.append("")
    if t.get("known"):
        lines += ["Bugs the workspace knows that this matches:", ""]
        for k in t["known"]:
            link = f"#{k['issue']}" if k.get("issue") else k["repro"]
            if "rate" in k:  # its repro, run in the reporter's versions
                ended = "; ".join(sorted(set(k["reasons"])))[:200].replace("|", "/")
                lines.append(f"- {link}: the workspace's repro `{k['repro']}` ({k['script']}) on "
                             f"{k['package']} {k['lightning']} + torch {k['torch']}: bad {k['rate']} "
                             f"({ended})")
            elif k.get("cell"):  # the reporter's script with the series' fix
                why = k.get("after_detail") or ""
                tail = ("" if k["ok"] else ": inconclusive (not bad without them)" if k["before"] != "bad"
                        else f": inconclusive (the run with them could not be judged: {why})"
                        if k["after"] == "skip" else f": not fixed by them ({why})")
                lines.append(f"- {link}: the reporter's script in `{k['cell']}` is {k['before']} without and "
                             f"{k['after']} with the series' patches ({', '.join(k['patches'])}), "
                             f"{runs_made(k)}{tail}")
            elif k.get("why"):
                lines.append(f"- {link}: the series' fix could not be tried: {k['why']}")
            else:
                lines.append(f"- {link}: matches its signature; no patch of the series targets these "
                             "versions")
        lines.append("")
    if t.get("bisect") and t["bisect"].get("markdown"):
        lines += [re.sub(r"^## Bisect result( \(the fix\))?", r"**Bisect\1:**", t["bisect"]["markdown"],
                         count=1).strip(), ""]
    elif t.get("bisect"):
        lines += [f"**Bisect:** no answer: {t['bisect'].get('why') or 'no report'}", ""]
    if t.get("frames"):
        lines += ["Frames of the traceback (Lightning and torch):", "",
                  *[f"- `{f}`" for f in t["frames"][:12]], ""]
    m = t.get("minimized")
    if m and m.get("lines"):
        fence = _fence(m["code"])
        lines += [f"<details><summary>Minimized repro ({m['lines']} of {m.get('of', '?')} lines, bad in "
                  "3/3 fresh runs)</summary>", "", f"{fence}python",
                  m["code"].rstrip(), fence, "", "</details>", ""]
    if t.get("questions"):
        lines += ["Questions:", "", *[f"- {q}" for q in t["questions"]], ""]
    lines += [f"Reproduce with: `nox -s triage -- {t.get('reproduce') or t['input']}`", "",
              "If this triage is wrong, please say so here.", ""]
    return "\n".join(lines)


# -- the program ----------------------------------------------------------------------------------

def parse_args(argv) -> argparse.Namespace:
    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise BadInput(message)

    p = Parser(prog="nox -s triage --", description=__doc__.split("\n\n")[0])
    p.add_argument("issue", help="a GitHub issue URL, or a saved issue (its API JSON, or Markdown)")
    p.add_argument("--signature", help="regex for 'bad' (default: derived from the reported exception)")
    contract.add_check_replicas(p)
    p.add_argument("--trials", default="3",
                   help=f"runs per cell (default 3), or auto: {AUTO_TRIALS} per cell, and the bisect's "
                        "--trials auto (from the rate at its bad end)")
    p.add_argument("--timeout", type=contract.seconds, default=DEFAULT_TIMEOUT,
                   help=f"wall-clock limit of a run (default {DEFAULT_TIMEOUT:g} s; {HANG_TIMEOUT:g} s for a "
                        "report that says it hangs, whose runs are bad when they outlive it)")
    p.add_argument("--repo", default=os.environ.get("LIGHTNING_REPO"),
                   help="a Lightning checkout for the commit bisect (default $LIGHTNING_REPO)")
    p.add_argument("--minimize-budget", type=float, default=5.0, metavar="MIN",
                   help="minutes of minimization (0 skips it; default 5)")
    p.add_argument("--no-bisect", action="store_true", help="run the cells only")
    p.add_argument("--jobs", default="auto", metavar="K",
                   help="the bisect's candidates tested at once per round (nox -s bisect --jobs)")
    p.add_argument("--trust", action="store_true", help="run a script the static check refuses")
    p.add_argument("--allow-network", action="store_true",
                   help="the sandbox with the machine's network (a script that downloads its data)")
    p.add_argument("--allow-unsandboxed", action="store_true",
                   help="run the pasted code without any sandbox, as you (where the machine cannot "
                        "make one; read the script first)")
    p.add_argument("--out", help="results folder (default results/triage/<issue id>)")
    p.add_argument("--state", help="the bisect's verdict cache (default nox -s bisect's, shared: a "
                                   "re-run, or a bisect of the same script, runs no step twice)")
    args = p.parse_args(argv)
    args.auto = args.trials == "auto"
    args.hang = False  # set when the report says it hangs
    args.bad_output = None  # set by the differential: a behaviour the broken release prints
    args.trials = AUTO_TRIALS if args.auto else (int(args.trials) if args.trials.isdigit() else 0)
    if args.trials < 1:
        raise BadInput("--trials takes a number >= 1, or auto")
    if args.jobs != "auto" and not (args.jobs.isdigit() and int(args.jobs) >= 1):
        raise BadInput("--jobs takes a number >= 1, or auto")
    if args.minimize_budget < 0:
        raise BadInput("--minimize-budget takes minutes >= 0")
    contract.check_signature(args.signature)
    return args


def triage(args) -> dict:
    SEEN.clear()  # what this triage's runs showed, not an earlier one's in the same process
    RUNS.clear()
    issue = read_issue(args.issue)
    out = Path(args.out) if args.out else results.kind_dir("triage") / issue.folder
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BadInput(f"--out {out}: cannot write there ({err.strerror})") from None
    text = "\n\n".join([issue.body, *issue.comments])
    script = pick_script(code_blocks(issue.body)) or next(
        (s for c in issue.comments if (s := pick_script(code_blocks(c)))), None)
    tbs = tracebacks(text)
    said = stated_versions(issue)
    # the comment names the URL or the file's name, never a path of this machine
    reproduce = issue.url or (args.issue if ISSUE_URL.match(args.issue) else Path(args.issue).name)
    t: dict = {"input": args.issue, "id": issue.id, "folder": issue.folder, "title": issue.title,
               "url": issue.url, "reproduce": reproduce,
               "versions_said": said, "tracebacks": tbs, "sandbox": None, "out": str(out.resolve()),
               "repo": args.repo}
    progress("read", f"{issue.title!r}: {'a script' if script else 'no script'}, {len(tbs)} traceback(s), "
                     f"versions said: Lightning {said['lightning'] or '?'}, torch {said['torch'] or '?'}")
    signature, site, why = args.signature, None, None
    exc = next((e for e in map(exception_line, reversed(tbs)) if e), None)
    if not signature and exc:
        signature, why = derive_signature(*exc), f"from the reported `{exc[0]}`"
    elif not signature and not tbs and (quoted := prose_exception(text)):
        signature, why = derive_signature(*quoted, quoted=True), f"from the `{quoted[0]}` the report quotes"
        t["quoted_error"] = f"{quoted[0]}: {quoted[1]}"
    if signature and tbs:
        site = _report_site("\n".join(tbs), signature)
    check = args.check_replicas
    drift = DRIFT.search(re.sub(r"(?<!\n)\n(?!\n)", " ", text))  # (a paragraph wrapped over lines)
    if not check and drift and not exc:
        check = "epoch"
        t["replicas_why"] = f"the report says {drift[0]!r} and shows no exception"
    elif check:
        t["replicas_why"] = "asked for"
    hang = None if (exc or check or signature) else hang_said(issue.body)
    if hang:  # a hang is its own signature: a run that outlives the (shorter) limit is bad
        args.hang = True
        if args.timeout == DEFAULT_TIMEOUT:
            args.timeout = HANG_TIMEOUT
        t["hang_why"] = f"the report says {hang[0]!r} and shows no exception"
    args.signature, args.check_replicas = signature, check
    t.update(signature=signature, signature_from=why, check_replicas=check, site=site)
    frames = [f.label for f in fingerprint.parse("\n".join(tbs))] if tbs else []
    t["frames"] = frames
    if script is None:
        script = completed_script(issue, text, t)
    if script is None and not tbs:
        t["status"] = "needs a repro: " + "; ".join(t.get("missing") or ["the report holds no code"])
        if t.get("quoted_error"):
            t["status"] += f"; the error it quotes: `{t['quoted_error'][:200]}`"
        matches = known(text)
        t["questions"] = questions(issue, next((r.issue for r in matches if r.issue), None))
        if matches:
            t["known_said"] = [r.issue or r.name for r in matches]
        return _finish(t, out)
    if script is None:
        t["status"] = (f"no runnable script in the report; {len(frames)} Lightning/torch frames in its "
                       f"traceback, signature `{signature}`")
        matches = known("\n".join(tbs))
        t["questions"] = questions(issue, next((r.issue for r in matches if r.issue), None))
        if matches:
            t["status"] += "; " + traceback_matches(matches, tbs, said, args, out, t)
        return _finish(t, out)
    package = t.get("package") or ("lightning" if re.search(r"^\s*(?:import|from)\s+lightning\b", script.code,
                                                           re.M) else "pytorch-lightning")
    t.update(script_origin=script.origin, package=package)
    if script.problem:
        t["status"] = f"cannot run the script: {script.problem}"
        t["questions"] = questions(issue)
        return _finish(t, out)
    refused = dangerous(script.code)
    if refused and not args.trust:
        t.update(status="not run: the script could reach outside its sandbox", refused=refused)
        return _finish(t, out)
    why = None if args.allow_unsandboxed else sandbox.unavailable()
    if why:
        raise BadInput(f"{why}; nothing was run (--allow-unsandboxed runs the pasted code without it, "
                       "as you)")
    t["sandbox"] = ("none: the pasted code ran as this user, with its network and files (--allow-unsandboxed)"
                    if args.allow_unsandboxed else
                    "bubblewrap: nobody, no capabilities, seccomp, the system read-only, a throwaway HOME, "
                    "TMPDIR and folder on a size-limited tmpfs, " +
                    ("the machine's network (--allow-network)" if args.allow_network else "loopback only"))
    code, changes, diff = cpu_port(script.code)
    nodes = topology(code)
    if nodes[0] > 1:  # the script's own num_nodes, run as that many nodes of one job here
        changes.append(f"num_nodes={nodes[0]}: run as {nodes[0]} nodes of one job on this machine (a "
                       f"torchrun each, c10d rendezvous), {nodes[1]} rank(s) per node")
    args.nodes = nodes
    t.update(port_changes=changes, port_diff=diff, nodes=list(nodes))
    path = out / "script.py"
    results.write_atomic(path, code)
    if not (signature or check or args.hang) and (asserted := _assert_message(code)):  # its own check
        signature, why = derive_signature("AssertionError", asserted), "the script's own `assert`"
        args.signature = signature
        t.update(signature=signature, signature_from=why)
    if not (signature or check or args.hang) and differential(issue, path, args, out, package, said, t):
        signature = args.signature
    if not (signature or check or args.hang or args.bad_output):
        t["status"] = "no signature: the report shows no exception and no drift; give --signature"
        if (t.get("differential") or {}).get("why"):
            t["status"] += f"; the differential: {t['differential']['why']}"
        t["questions"] = questions(issue)
        return _finish(t, out)
    reporter = resolve(package, said["lightning"])
    if reporter is None and tbs:  # not stated: the release whose source has the traceback's lines
        reporter = fingerprinted(fingerprint.parse("\n".join(tbs)), package, args.repo, t)
        if reporter:
            t["versions_fingerprinted"] = reporter
    newest = newest_release(package)
    cells = []
    if reporter:
        torch = said["torch"] if said["torch"] and said["torch"].count(".") == 2 else envs.era_torch(
            index.release(package, reporter).uploaded)
        if (reporter, torch) != (newest, NEWEST_TORCH):  # the newest release on another torch too
            cells.append(Cell("reporter's", package, reporter, torch))
    cells.append(Cell("newest", package, newest, NEWEST_TORCH))
    master = master_cell(args, package, newest)
    if master is not None:
        cells.append(master)
    earlier = _earlier_cells(out, code, args)
    with Launcher(How(nodes=nodes[0], ranks_per_node=nodes[1])) as launcher:
        for i, cell in enumerate(cells):
            if not _resume(cell, earlier, out):
                run_cell(cell, path, args, out, launcher, site, after=(len(cells) - i - 1) * args.trials)
            t["cells"] = [{**asdict(c), "python": str(c.python), "rate": c.rate} for c in cells]
            t["cells_key"] = _cells_key(code, args)
            _save(t, out)
    new = next(c for c in cells if c.label == "newest")
    old = cells[0] if cells[0].label == "reporter's" else None
    where = f"{package} {new.lightning} + torch {new.torch} (CPU)"
    at_master = f"; {master.rate} at {master.lightning}" if master is not None else ""
    unstable = [c for c in cells if 0 < c.bad < c.tested]
    if unstable:  # a rate below 1: a bisect of one run a step can name a wrong culprit
        args.auto = True
    same = old is not None and old.lightning == new.lightning  # one release, two torches
    if new.bad:
        t["status"] = f"reproduced {new.rate} on {where}{at_master}"
        if args.hang and any(r.startswith("it hangs") for r in new.reasons):
            t["status"] += f" (it hangs: each bad run outlived its {args.timeout:g} s limit)"
        if old is not None:
            t["status"] += f"; {old.rate} on the reporter's {old.lightning} + torch {old.torch}"
        t["status"] += _unstable(unstable)
        t["status"] += known_bug(path, package, new, args, out, t)
        if not args.no_bisect and same and old.tested and not old.bad:  # torch brought it
            t["bisect"] = bisect(path, args, out, "2.0.0", package, torch_axis=(new.lightning, old.torch,
                                                                                  new.torch))
            t["status"] += "; " + _bisect_status(t["bisect"])
        elif not args.no_bisect:
            oldest = t.get("worked") or min(["2.0.0", *([old.lightning] if old is not None else [])], key=_v)
            t["bisect"] = bisect(path, args, out, oldest, package, t.get("differential", {}).get("torch")
                                 or NEWEST_TORCH)
            t["status"] += "; " + _bisect_status(t["bisect"])
            if ((t["bisect"] or {}).get("releases") or {}).get("outcome", {}).get("status") == "no-good":
                t["status"] += deliberate(SEEN.get(new.label, ""))
        t["minimized"] = minimize(path, args, out, new.python) if new.python else None
    elif old is not None and old.bad:
        t["status"] = (f"reproduced {old.rate} on the reporter's {old.lightning} + torch {old.torch}, "
                       f"not on {where} ({new.rate}){at_master}{_unstable(unstable)}")
        if args.no_bisect:
            t["status"] += ": fixed since; the fix was not bisected (--no-bisect)"
        elif same:  # the same release, a newer torch: torch fixed it
            t["bisect"] = bisect(path, args, out, "2.0.0", package, fix=(old.torch, new.torch),
                                 torch_axis=(new.lightning, old.torch, new.torch))
            t["status"] += "; " + _bisect_status(t["bisect"])
        else:  # where it went away, on the reporter's torch
            t["bisect"] = bisect(path, args, out, old.lightning, package, old.torch,
                                 fix=(old.lightning, new.lightning))
            t["status"] += "; " + _bisect_status(t["bisect"])
        t["minimized"] = minimize(path, args, out, old.python) if old.python else None
    elif master is not None and master.bad:  # not in a release yet
        t["status"] = (f"reproduced {master.rate} at {master.lightning} only, not in a release: {new.rate} "
                       f"on {where}{_unstable(unstable)}" + (f", {old.rate} on the reporter's {old.lightning}"
                                                              if old is not None else ""))
    elif not any(c.tested for c in cells):
        why = next((r for c in cells for r in c.reasons), "no run ended")
        t["status"] = f"could not test: every run ended without a verdict ({why[:160]})"
        t["questions"] = questions(issue)
    else:
        t["status"] = f"did not reproduce: {', '.join(f'{c.rate} on {c.lightning}' for c in cells)}"
        t["questions"] = questions(issue)
    return _finish(t, out)


def differential(issue: Issue, path: Path, args, out: Path, package: str, said: dict, t: dict) -> bool:
    """A report that names a release that worked and shows no exception: the script run once in
    that release and once in the broken one, and what tells them apart made the predicate
    (``tools/differential.py``). True when it found one (``args.signature`` or
    ``args.bad_output`` set); ``t["differential"]`` says what ran, or why there is none."""
    from tools import bisect_cli
    from tools import differential as diff

    worked = diff.worked_release(issue.body)
    if worked is None:
        return False
    good = resolve(package, worked.release)
    bad = resolve(package, said["lightning"] or worked.broken) or newest_release(package)
    d = t["differential"] = {"said": worked.phrase, "worked": good, "broken": bad}
    if good is None or _v(good) >= _v(bad):
        d["why"] = (f"the release it says worked ({worked.release}) is no {package} release older than "
                    f"{bad}")
        return False
    torch = said["torch"] if said["torch"] and said["torch"].count(".") == 2 else envs.era_torch(
        index.release(package, bad).uploaded)
    d["torch"] = torch
    ran = {}
    with Launcher(How(nodes=args.nodes[0], ranks_per_node=args.nodes[1])) as launcher:
        for label, release in (("broken", bad), ("worked", good)):
            progress("run", f"differential: the {label} {package} {release} + torch {torch}, once")
            try:
                python = bisect_cli.release_env(package, release, torch, ())
            except envs.EnvError as err:
                d["why"] = f"no environment for {release}: {err}"
                return False
            r = launcher.run(Run((str(path),), python, timeout=args.timeout, sandbox=sandbox_mode(args),
                                 log_stem=out / "logs" / f"differential-{label}-{package}-{release}"))
            if r.code >= contract.FAIL and (r.returncode is None or (r.reason or "").startswith("harness")):
                raise HarnessFailure(f"the differential's {label} run: {r.reason}")
            ran[label] = (r.returncode, diff.output(r))
            d[f"{label}_exit"] = r.returncode
    raised = next((e for e in map(exception_line, reversed(tracebacks(ran["broken"][1]))) if e), None)
    found = diff.predicate(ran["broken"], ran["worked"], "\n".join([issue.body, *issue.comments]),
                           derive_signature(*raised) if raised else None)
    if isinstance(found, str):
        d["why"] = f"{found} ({bad} against {good})"
        return False
    setattr(args, found.option, found.regex)
    t["worked"] = good
    t.update(signature=args.signature, bad_output=args.bad_output,
             signature_from=f"the differential of {bad} against {good}: {found.why}")
    return True


def known_bug(script: Path, package: str, cell: Cell, args, out: Path, t: dict) -> str:
    """A reproduced report that shows a bug the workspace has a fix for in its series: the
    reporter's script without and with the series, in the newest cell. The status's words."""
    text = "\n".join([*t.get("tracebacks", []), script.read_text(errors="replace"), SEEN.get(cell.label, "")])
    said = []
    for repro in known(text):
        fixes = patches_for(repro)
        cell_id = series_cell(package, cell.lightning, cell.torch, fixes) if fixes else None
        if cell_id is None:
            t.setdefault("known", []).append({"repro": repro.name, "issue": repro.issue,
                                              "patches": [p.name for p in fixes], "ok": None})
            said.append(f"it looks like #{repro.issue} (no patch of the series to try here)")
            continue
        try:
            row = fixed_by_series(script, repro, cell_id, args, out)
        except (envs.EnvError, OSError, BadInput, subprocess.SubprocessError) as err:
            t.setdefault("known", []).append({"repro": repro.name, "issue": repro.issue, "ok": None,
                                              "patches": [p.name for p in fixes], "why": str(err)[:200]})
            said.append(f"it looks like #{repro.issue}; the series' fix could not be tried "
                        f"({str(err)[:100]})")
            continue
        t.setdefault("known", []).append(row)
        verdicts = f"{row['before']} before, {row['after']} after"
        if row["ok"]:
            said.append(f"it is #{repro.issue}: {verdicts} with the series' fix ({runs_made(row)})")
        elif row["before"] != "bad" or row["after"] == "skip":  # a run that shows nothing either way
            said.append(f"it looks like #{repro.issue}; inconclusive: {verdicts} with the series' fix")
        else:
            said.append(f"it looks like #{repro.issue}, but the series' fix does not change it ({verdicts})")
    return "".join(f"; {x}" for x in said)


def traceback_matches(matches: list, tbs: list[str], said: dict, args, out: Path, t: dict) -> str:
    """A report without a script whose traceback shows a bug the workspace knows: that bug's repro
    in the reporter's versions (stated, else fingerprinted), with its rate."""
    text = "\n".join(tbs)
    package = fingerprint.guess_package(text)
    lightning = resolve(package, said["lightning"])
    how = "stated"
    if lightning is None:
        lightning, how = fingerprinted(fingerprint.parse(text), package, args.repo, t), "fingerprinted"
        found = t.get("fingerprint") or {}
        if lightning and found["matched"] < found["frames"]:
            how = f"fingerprinted: the best match, {found['matched']} of {found['frames']} frames"
    if lightning is None:
        lightning, how = newest_release(package), "unknown: the newest"
    torch = said["torch"] if said["torch"] and said["torch"].count(".") == 2 else envs.era_torch(
        index.release(package, lightning).uploaded)
    t["known_cell"] = {"package": package, "lightning": lightning, "torch": torch, "versions": how}
    with Launcher() as launcher:
        rows = [run_known(r, package, lightning, torch, args, out, launcher) for r in matches]
    t["known"] = rows
    said_rows = [f"it matches #{r['issue']} (the workspace's repro `{r['repro']}`): "
                 + (f"bad {r['rate']}" if r.get("tested") else  # no run could test: no verdict
                    f"could not test ({(r['reasons'] or ['no run'])[0][:100]})")
                 + f" on {package} {lightning} + torch {torch}" for r in rows]
    return "; ".join(said_rows)


def newest_release(package: str) -> str:
    return str(max(v for v, r in index.releases(package).items() if not v.is_prerelease and not r.yanked))


def _v(version: str):
    from packaging.version import Version

    return Version(version)


def _unstable(cells: list) -> str:
    if not cells:
        return ""
    return ("; unstable (" + ", ".join(f"{c.rate} on {c.lightning}" for c in cells) + "): the bisect "
            "ran with --trials auto")


def deliberate(output: str) -> str:
    """A failure Lightning raises on purpose (its last frame a ``raise`` in Lightning's own code,
    a check of the user's input): the status's words quoting that check's message, else ""."""
    tb = "\n".join(tracebacks(output))
    frames = fingerprint.parse(tb) if tb else []
    exc = exception_line(tb) if tb else None
    last = frames[-1] if frames else None
    if not (exc and last and last.package in ("lightning", "fabric")
            and (last.code or "").startswith("raise")):
        return ""
    quoted = f"{exc[0]}: {exc[1][:200]}"
    quoted = f"`` {quoted} ``" if "`" in quoted else f"`{quoted}`"  # (Markdown: a message with backticks)
    return f"; Lightning raises it on purpose ({last.package}:{last.rel}): {quoted}"


def _bisect_status(b: dict | None) -> str:
    if not b:
        return "the bisect gave no report"
    if b.get("markdown") is None:
        return f"the bisect gave no answer ({b.get('why') or 'no report'})"
    fix = b.get("find_fix")
    rel = (b.get("releases") or {}).get("outcome") or {}
    com = (b.get("commits") or {}).get("outcome") or {}
    what = "torch " if b.get("axis") == "torch" else ""
    if rel.get("status") == "found":
        first, last = rel.get("first_bad"), rel.get("last_good")
        text = (f"fixed in {what}{first} (the last with the bug: {last})" if fix
                else f"regressed in {what}{first} (last good {last})")
        if com.get("status") == "found":
            sha = str(com.get("first_bad"))
            from tools.gitrange import Commit

            pr = next((Commit(**c).pr for c in b["commits"].get("commits", []) if c.get("sha") == sha),
                      None)
            text += f", by commit {sha[:12]}" + (f" (#{pr})" if pr else "")
        return text
    if rel.get("status") == "no-good":
        return ("the bug showed in no release the fix bisect tested" if fix else
                f"the same in every release tested since {what}{rel.get('first_bad')}: not a regression")
    return f"bisect: {rel.get('status') or 'no answer'}"


def _save(t: dict, out: Path) -> None:
    results.write_json(out / "triage.json", t)


def _finish(t: dict, out: Path) -> dict:
    if t.get("completion") and not t["status"].startswith(COMPLETED):  # a verdict on an assumption
        t["status"] = COMPLETED + t["status"]
    t["seconds"] = round(time.monotonic() - _started, 1)
    _save(t, out)
    results.write_atomic(out / "comment.md", comment(t))
    progress("done", f"{t['status']}; {out / 'comment.md'}")
    return t


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        triage(args)
    except (contract.Failure, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001  (a crash of the triage itself: never a verdict)
        raise HarnessFailure(f"{type(err).__name__}: {err}") from err
    return 0


if __name__ == "__main__":
    sys.exit(contract.run_main(main))
