"""What counts as bad: the signature from a traceback's last exception, an exception quoted in
prose, the script's own ``assert``, a hang, ranks that drift apart; where the report's exception
was raised, and when a run's is the same one; a check Lightning makes on purpose."""

from __future__ import annotations

import ast
import re

from tools import fingerprint
from tools.triage import read

_APART = r"(?:diverg\w*|drift\w*|out of sync|differ\w*|disagree\w*|not (?:the same|identical))"
_RANKS = r"(?:ranks?|replicas?|gpus|processes|devices|workers|nodes)\b"
HANG = re.compile(r"\b(?:hangs?|hanging|hung|stuck|deadlock\w*|never (?:finishes|returns|ends|completes))\b"
                  r"(?!\s+(?:at|around|near)\s+[\d.]+)", re.I)  # not "loss stuck at 0.69"
NOT_A_HANG = re.compile(r"\b(?:loss|accuracy|acc|metric|lr|learning rate|value|score)\w*\W+(?:\w+\W+){0,3}$",
                        re.I)
DRIFT = re.compile(rf"\b{_APART}\b[^.\n]{{0,80}}\b{_RANKS}|\b{_RANKS}[^.\n]{{0,80}}\b{_APART}", re.I)


def assert_message(code: str) -> str | None:
    """The message of the script's own ``assert`` (a constant one): its failure is what the
    script shows. A bare ``assert`` says too little (torch's own asserts raise the same class)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    return next((n.msg.value for n in ast.walk(tree) if isinstance(n, ast.Assert)
                 and isinstance(n.msg, ast.Constant) and isinstance(n.msg.value, str)
                 and n.msg.value.strip()), None)


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


def report_site(traceback: str, signature: str) -> tuple[str, ...] | None:
    """Where the report raised the signature: within one rank's lines (interleaved ranks would
    give one rank's exception another's frame)."""
    from tools.minimize.source import crash_site

    for rank, stream in fingerprint.streams(traceback).items():
        # "[rank5]: File" keeps the space after the prefix: one less gives the original indent
        text = "\n".join(line[1:] if rank and line.startswith(" ") else line for _, line in stream)
        site = crash_site(text, signature, ())
        if site:
            return normal_site(site)
    return None


def same_exception_in_own_code(here, site) -> bool:
    """Both raised in the reporter's own code (not a library frame), the same exception class:
    the report's function may have been renamed or inlined since its traceback."""
    return bool(here and site and here[1] == site[1] == "(script)" and here[0] == site[0])


def failing_line(traceback: str, signature: str) -> str | None:
    """The source line a traceback shows under the frame that raised ``signature`` (its innermost
    frame), or None when it shows none."""
    from tools.minimize.source import EXCEPTION, FRAME

    lines = traceback.splitlines()
    for i, line in enumerate(lines):
        if EXCEPTION.match(line) and re.search(signature, line):
            frames = [k for k in range(i) if FRAME.match(lines[k])]
            if frames and frames[-1] + 1 < i and not FRAME.match(lines[frames[-1] + 1]):
                return re.sub(r"^\s*(?:\[rank\d+\]:\s*)?", "", lines[frames[-1] + 1]).strip() or None
            return None
    return None


def posted_without(line: str | None, code: str) -> bool:
    """The report's failing line is not in the code that was run (white space aside)."""
    return bool(line) and " ".join(line.split()) not in " ".join(code.split())


def normal_site(site: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """(class, where, function) with a library path as fingerprint names it, a user's file as
    its function only (the reporter's path is not ours)."""
    if site is None:
        return None
    cls, where, func = site
    located = fingerprint.locate(where if where.startswith("/") else f"/x/site-packages/{where}")
    return (cls.rsplit(".", 1)[-1], f"{located[0]}:{located[1]}" if located else "(script)", func)


def deliberate(output: str) -> str:
    """A failure Lightning raises on purpose (its last frame a ``raise`` in Lightning's own code,
    a check of the user's input): the status's words quoting that check's message, else ""."""
    tb = "\n".join(read.tracebacks(output))
    frames = fingerprint.parse(tb) if tb else []
    exc = read.exception_line(tb) if tb else None
    last = frames[-1] if frames else None
    if not (exc and last and last.package in ("lightning", "fabric")
            and (last.code or "").startswith("raise")):
        return ""
    quoted = f"{exc[0]}: {exc[1][:200]}"
    quoted = f"`` {quoted} ``" if "`" in quoted else f"`{quoted}`"  # (Markdown: a message with backticks)
    return f"; Lightning raises it on purpose ({last.package}:{last.rel}): {quoted}"
