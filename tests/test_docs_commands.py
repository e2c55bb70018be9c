"""The commands the README and docs/ show are ones today's programs take: every ``nox -s X -- ...``
line of a program with options is parsed by that program's own parser (nothing runs), and none
uses an option's old, deprecated name. A renamed option that the docs still spell the old way, or
an option that no longer exists, fails here."""

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from tools import fingerprint, triage, validate_patches
from tools.core import contract
from tools.minimize import options as minimize_options
from tools.stages import bisect_options, cells

ROOT = Path(__file__).resolve().parent.parent
PARSERS = {"bisect": bisect_options.parser, "minimize": minimize_options.parser, "triage": triage.parser,
           "patches": validate_patches.parser, "fingerprint": fingerprint.parser, "repro": cells.parser}
PLACEHOLDER = re.compile(r"<|\.\.\.|\[|\b(SCRIPT|REGEX|ISSUE|NAME|ID|K|N)\b|\$\(|--help")


def commands(text: str) -> list[str]:
    """``nox -s`` commands of a Markdown text: the lines of its code blocks (a ``\\`` joins the
    next line) and its inline code spans."""
    found = []
    for block in re.findall(r"(?ms)^```[a-z]*\n(.*?)^```", text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            found += [part.strip() for part in re.split(r"&&|;", line) if part.strip().startswith("nox -s ")]
    found += re.findall(r"`(nox -s [^`]+)`", re.sub(r"(?ms)^```.*?^```", "", text).replace("\n", " "))
    return found


def docs_commands() -> list[tuple[str, str]]:
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for command in commands(path.read_text()):
            try:
                words = shlex.split(command, comments=True)
            except ValueError:  # a span cut inside a quoted argument: not a whole command
                continue
            mention = words[-1].startswith("-")  # "`nox -s X -- --jobs`"
            if (len(words) > 3 and words[2] in PARSERS and "--" in words and not mention
                    and not PLACEHOLDER.search(command)):
                out.append((path.relative_to(ROOT).as_posix(), command))
    return out


CASES = docs_commands()


def test_the_docs_show_commands_of_every_program():
    shown = {shlex.split(command)[2] for _, command in CASES}
    assert shown >= {"bisect", "minimize", "triage", "patches", "repro"}, shown


@pytest.mark.parametrize("where, command", CASES, ids=[f"{w}:{c[:60]}" for w, c in CASES])
def test_a_docs_command_parses_and_uses_no_old_name(where, command):
    words = shlex.split(command, comments=True)
    session, args = words[2], words[words.index("--") + 1:]
    if session == "bisect" and "--" in args:  # what follows goes to the script
        args = args[:args.index("--")]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            if session == "repro":
                PARSERS[session]().parse_known_args(args)
            else:
                PARSERS[session]().parse_args(args)
        except (contract.BadInput, SystemExit) as failure:
            pytest.fail(f"{where}: {command}: {failure}")
    assert "deprecated" not in err.getvalue(), f"{where}: {command}: {err.getvalue()}"
    if session == "bisect":
        assert "--script" in args, f"{where}: {command}: the bisect's --script is required"


def test_an_old_name_is_caught():
    """The check itself: a command with a deprecated spelling is reported."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        bisect_options.parser().parse_args(["--repro", "x.py"])
    assert "--repro is deprecated, use --script" in err.getvalue()
