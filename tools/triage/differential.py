"""The differential: a report that names a release that worked, and shows no exception.

"Since upgrading from 2.3 to 2.4 ...", "it worked in 2.0.9", "going back to 2.3 solves it":
the report names a release that behaved and one that does not, and often only prints what went
wrong. The script runs once in each (``run``); what the broken release prints and the working
one does not is the bug's predicate (``predicate``), and the bisect then tells them apart:

- the broken release exits 1 and the working one 0: bad is exit 1 with a line it printed
  (``--signature``), or with its exception when the report quotes none of its lines;
- both exit 0: bad is a run that exits 0 and prints the broken release's line (``--bad-output``,
  the launcher's ``Run.bad_output``).

Only a line the report itself shows counts (its logs, its text): a new warning of a newer
release also differs, and is not the bug. Numbers in a line are generalized when the working
release's output still does not match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

VERSION = r"v?(\d+\.\d+(?:\.\d+)?(?:\.post\d+|rc\d+)?)"
_NAME = r"(?:(?:pytorch[ _-]?)?lightning(?: version)?[ =]=?|pl |version |release )?"
_WELL = r"(?:(?:fine|well|ok|okay|correctly|perfectly|as expected|before|previously) )?"
# "worked" sayings, each with the working release as its first group and, where it says it,
# the broken one as the second
WORKED = [re.compile(p, re.I) for p in (
    rf"\b(?:since|after) (?:upgrading|updating|moving|bumping|going|switching) (?:\w+ )?from {_NAME}{VERSION}"
    rf"(?: to {_NAME}{VERSION})?",
    rf"\b(?:worked|works|was fine|was ok|is fine|passed|passes) {_WELL}(?:in|on|with|under) {_NAME}{VERSION}",
    rf"\b(?:going|rolling|reverting|downgrading) back to {_NAME}{VERSION}",
    rf"\b(?:downgrad\w*|pinning) (?:\w+ ){{0,2}}?to {_NAME}{VERSION}",
    rf"\b(?:on|in|with) {_NAME}{VERSION},? (?:it|this|the same script|everything) (?:works|worked|is fine|"
    rf"was fine|prints|printed)",
    rf"\bafter (?:upgrading|updating) to {_NAME}{VERSION} \(from {_NAME}{VERSION}\)",  # broken first
)]
BROKEN_FIRST = WORKED[-1]
# another package's version (torch's, CUDA's, Python's): "upgrading torch from 2.1 to 2.2"
OTHER = re.compile(r"\b(?:torch|pytorch(?![ _-]?lightning)|cuda|cudnn|python|numpy|nccl)\b", re.I)
# the saying denied: "stopped working in 2.4", "not working in 2.3 either", "never worked in"
DENIED = re.compile(r"\b(?:not|never|no longer|nothing|stopped|neither|nor)\b|n't\b", re.I)
# lines every run of a release prints whatever the bug: never the predicate
NOISE = re.compile(r"^(?:GPU available|TPU available|HPU available|IPU available|LOCAL_RANK|"
                   r"(?:Trainable|Non-trainable|Total) params|Total estimated|Modules in (?:train|eval) mode|"
                   r"\|?\s*(?:\||Name\b|-{3,})|-{3,}|.*(?:Warning|warnings\.warn|rank_zero_warn)\b)", re.I)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
# a path: its folders differ from machine to machine and run to run (a temporary folder); what
# stays is its last part
_PATH = re.compile(r"\S*/(\S+)")


@dataclass
class Worked:
    release: str  # the version the report says worked, as said ("2.3")
    broken: str | None  # the one it says broke, where the same sentence says it ("to 2.4")
    phrase: str


def worked_release(text: str) -> Worked | None:
    """The Lightning release a report says worked, from its prose (never from code, logs, or a
    sentence about torch's, CUDA's or Python's version, or one that denies it worked)."""
    prose = re.sub(r"(?ms)^(```|~~~).*?^\1", " ", text)  # fenced blocks
    prose = re.sub(r"(?m)^(?: {4}|\t).*$", " ", prose)  # indented code
    prose = re.sub(r"(?<!\n)\n(?!\n)", " ", prose)  # a paragraph wrapped over lines
    for pattern in WORKED:
        for m in pattern.finditer(prose):
            before = prose[max(0, m.start() - 30):m.start()]
            if OTHER.search(m[0]) or DENIED.search(before.split(".")[-1] + m[0]):
                continue
            if pattern is BROKEN_FIRST:  # "after upgrading to 2.4 (from 2.3)"
                return Worked(m[2], m[1], m[0])
            return Worked(m[1], m.group(2) if pattern.groups > 1 else None, m[0])
    return None


@dataclass
class Predicate:
    option: str  # "signature": bad is exit 1 and this; "bad_output": bad is exit 0 and this printed
    regex: str
    why: str


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _shape(line: str) -> str:
    return _NUMBER.sub("#", _PATH.sub(r"\1", line))


def _numbers_loose(text: str) -> str:
    return "".join(r"\d+(?:\.\d+)?" if _NUMBER.fullmatch(part) else _escape(part)
                   for part in re.split(r"(\d+(?:\.\d+)?)", text) if part)


def line_regex(line: str, others: str) -> str | None:
    """``line`` as a regex for a whole line (``(?m)^...$``): its numbers generalized, and its paths'
    folders, unless that would match a line of ``others`` (the working release's output), then as
    it is; None when even that matches there ("saved" against "saved to model.ckpt" is refused by
    the anchors)."""
    pieces, end = [], 0
    for path in _PATH.finditer(line):
        pieces += [_numbers_loose(line[end:path.start()]), r"(?:\S*/)?" + _numbers_loose(path.group(1))]
        end = path.end()
    loose = "".join(pieces) + _numbers_loose(line[end:])
    for body in (loose, _escape(line)):
        regex = rf"(?m)^\s*{body}\s*$"
        if not re.search(regex, others):
            return regex
    return None


def _escape(text: str) -> str:
    """``re.escape`` that leaves spaces as they are (a regex a reader can read in a comment)."""
    return re.escape(text).replace("\\ ", " ")


def predicate(broken: tuple[int | None, str], worked: tuple[int | None, str], report: str,
              exception: str | None = None) -> Predicate | str:
    """What tells the broken release's run from the working one's: ``broken`` and ``worked`` are
    (exit code, output); ``report`` the report's text; ``exception``: the broken run's signature
    from its traceback, if it raised. A ``str``: why there is none."""
    (rc_bad, out_bad), (rc_good, out_good) = broken, worked
    if rc_good != 0:  # a release that crashed, or could not run the script, did not "work"
        return (f"no predicate: the release said to work exited {rc_good} (the broken one {rc_bad}): it "
                "did not run the script as the report says it did")
    if rc_bad not in (0, 1):
        return f"no predicate: the broken release exited {rc_bad}; only exits 0 and 1 can be told apart"
    printed = set(_lines(out_good))
    shown = {line.strip() for line in [*_lines(report), *re.findall(r"`([^`\n]+)`", report)]}
    shapes = {_shape(line) for line in shown}
    new = [line for line in _lines(out_bad) if line not in printed and not NOISE.match(line)]
    # a line the report shows as it is, or in its shape (numbers differ from run to run), that the
    # working release does not print: the last such line, as a script prints its verdict last
    quoted = [(line, regex) for line in new if (line in shown or _shape(line) in shapes)
              and (regex := line_regex(line, out_good))]
    option = "signature" if rc_bad == 1 else "bad_output"
    if quoted:
        line, regex = quoted[-1]
        return Predicate(option, regex, f"the line `{line[:160]}` the report shows: the broken release "
                                        f"prints it (exit {rc_bad}), the working one does not (exit 0)")
    if rc_bad == 1 and exception:
        return Predicate("signature", exception, "the broken release raises it (exit 1), the working "
                                                 "one exits 0; the report quotes none of its lines")
    if rc_bad == 0 and not new:
        return "no predicate: both releases exit 0 and print the same lines"
    return (f"no predicate: the releases differ ({len(new)} line(s) only the broken one prints, exit "
            f"{rc_bad} against 0), but the report shows none of those lines")


def output(result, stem: Path | None = None) -> str:
    """A run's output from its logs: both streams, and each node's of a job of several nodes
    (``stem``: the run's ``log_stem``)."""
    paths = [p for p in (getattr(result, "stdout_path", None), getattr(result, "stderr_path", None)) if p]
    if stem is not None:
        paths += sorted(Path(stem).parent.glob(f"{Path(stem).name}.node*"))
    parts = []
    for path in paths:
        try:
            parts.append(Path(path).read_text(errors="replace")[-8_000_000:])
        except OSError:
            continue
    return "\n".join(parts)
