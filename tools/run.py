"""Run any repro once through the harness and exit with its contract verdict.

    python -m tools.run [--timeout S] [--signature REGEX] [--log STEM] -- python my_repro.py ...

For a user's own script (for instance the original reporter's, unmodified): exit 1 counts as
bad only when the output matches ``--signature`` (without it, plain ``git bisect run`` rules
apply to scripts that print no verdict line). Prints one JSON verdict line.
"""

from __future__ import annotations

import argparse
import json
import sys

from tools import harness


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.run")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--signature", help="regex that must appear in the output for 'bad'")
    p.add_argument("--log", help="keep stdout/stderr as LOG.stdout / LOG.stderr")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        p.error("give the command to run after --")
    result = harness.run(cmd, timeout=args.timeout, log_stem=args.log, require_record=False,
                         signature=args.signature)
    print(json.dumps(result.to_dict(), default=str))
    return result.code


if __name__ == "__main__":
    sys.exit(main())
