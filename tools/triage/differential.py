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
_NAME = r"(?:(?:pytorch[ _-]?)?lightning |pl |version |release )?"
# "worked" sayings, each with the working release as its first group and, where it says it,
# the broken one as the second
WORKED = [re.compile(p, re.I) for p in (
    rf"\b(?:since|after) (?:upgrading|updating|moving|bumping|going|switching) (?:\w+ )?from {_NAME}{VERSION}"
    rf"(?: to {_NAME}{VERSION})?",
    rf"\b(?:worked|works|working|was fine|was ok|is fine|passed|passes) (?:\w+ ){{0,3}}?(?:in|on|with|under) "
    rf"{_NAME}{VERSION}",
    rf"\b(?:going|rolling|reverting|downgrading) back to {_NAME}{VERSION}",
    rf"\b(?:downgrad\w*|pinning) (?:\w+ ){{0,2}}?to {_NAME}{VERSION}",
    rf"\b(?:on|in|with) {_NAME}{VERSION},? (?:it|this|the same script|everything) (?:works|worked|is fine|"
    rf"was fine|prints|printed)",
)]
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


@dataclass
class Worked:
    release: str  # the version the report says worked, as said ("2.3")
    broken: str | None  # the one it says broke, where the same sentence says it ("to 2.4")
    phrase: str


def worked_release(text: str) -> Worked | None:
    """The release a report says worked, from its prose (never from code or logs)."""
    prose = re.sub(r"```.*?```", " ", text, flags=re.S)
    prose = re.sub(r"(?<!\n)\n(?!\n)", " ", prose)  # a paragraph wrapped over lines
    for pattern in WORKED:
        m = pattern.search(prose)
        if m and not re.search(r"\btorch\W*$", prose[max(0, m.start(1) - 12):m.start(1)], re.I):
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
    return _NUMBER.sub("#", line)


def line_regex(line: str, others: list[str]) -> str:
    """``line`` as a regex: its numbers generalized, unless that would match a line of ``others``
    (the working release's output), then as it is."""
    loose = "".join(r"\d+(?:\.\d+)?" if _NUMBER.fullmatch(part) else _escape(part)
                    for part in re.split(r"(\d+(?:\.\d+)?)", line) if part)
    if not any(re.search(loose, o) for o in others):
        return loose
    return _escape(line)


def _escape(text: str) -> str:
    """``re.escape`` that leaves spaces as they are (a regex a reader can read in a comment)."""
    return re.escape(text).replace("\\ ", " ")


def predicate(broken: tuple[int | None, str], worked: tuple[int | None, str], report: str,
              exception: str | None = None) -> Predicate | str:
    """What tells the broken release's run from the working one's: ``broken`` and ``worked`` are
    (exit code, output); ``report`` the report's text; ``exception``: the broken run's signature
    from its traceback, if it raised. A ``str``: why there is none."""
    (rc_bad, out_bad), (rc_good, out_good) = broken, worked
    if rc_good not in (0, 1) or rc_bad not in (0, 1):
        return (f"no predicate: the runs exited {rc_bad} (broken) and {rc_good} (worked); only exits 0 "
                "and 1 can be told apart")
    good_lines = _lines(out_good)
    printed = set(good_lines)
    shown = {line.strip() for line in [*_lines(report), *re.findall(r"`([^`\n]+)`", report)]}
    shapes = {_shape(line) for line in shown}
    new = [line for line in _lines(out_bad) if line not in printed]
    # a line the report shows as it is, or in its shape when the working release prints nothing of
    # that shape (numbers differ from run to run: "took 3.2 s" is not the bug)
    quoted = [line for line in new if line in shown or
              _shape(line) in shapes and line_regex(line, good_lines) != _escape(line)]
    option = "signature" if rc_bad == 1 else "bad_output"
    if rc_bad == 1 and rc_good == 1:
        return "no predicate: both releases exit 1"
    if quoted:
        line = quoted[-1] if rc_bad == 1 else quoted[0]
        return Predicate(option, line_regex(line, good_lines),
                         f"the line `{line[:160]}` the report shows: the broken release prints it "
                         f"(exit {rc_bad}), the working one does not (exit {rc_good})")
    if rc_bad == 1 and rc_good == 0 and exception:
        return Predicate("signature", exception, "the broken release raises it (exit 1), the working "
                                                 "one exits 0; the report quotes none of its lines")
    if rc_bad == rc_good and not new:
        return f"no predicate: both releases exit {rc_bad} and print the same lines"
    return (f"no predicate: the releases differ ({len(new)} line(s) only the broken one prints, exit "
            f"{rc_bad} against {rc_good}), but the report shows none of those lines")


def output(result) -> str:
    """A run's output, both streams, from its logs."""
    parts = []
    for path in (result.stdout_path, result.stderr_path):
        try:
            parts.append(Path(path).read_text(errors="replace")[-200_000:] if path else "")
        except OSError:
            continue
    return "\n".join(parts)
