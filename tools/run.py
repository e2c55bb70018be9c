"""Run any repro once through the harness and exit with its contract verdict.

    python -m tools.run [--timeout S] [--signature REGEX] [--log STEM] [--check-replicas[=EVERY]] \
        -- python my_repro.py ...

Made for ``git bisect run``: exit 0 good, 1 bad, 125 cannot test, and >= 128 for anything that
is not a verdict (bad options 129, the harness or the repro failed 128, interrupted 130), so a
problem of the harness is never read as "bad". For a user's own script (for instance the
original reporter's, unmodified) exit 1 counts as bad only when the output matches
``--signature``; a script that prints the contract's verdict line needs none. With
``--check-replicas`` the workspace's replica check is injected (bad when DDP replicas diverge).
Prints one JSON line with the result.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tools.core import contract
from tools.launch.launcher import Launcher, Run


def main(argv=None) -> int:
    p = contract.Parser(prog="python -m tools.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--timeout", type=contract.seconds, default=600.0, metavar="SECONDS",
                   help="wall-clock limit of the run")
    p.add_argument("--signature", help="regex that must appear in the output for 'bad'")
    p.add_argument("--log", help="keep stdout/stderr as LOG.stdout / LOG.stderr")
    contract.add_check_replicas(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command to run (after --)")
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise contract.BadInput("give the command to run after --")
    if args.timeout <= 0:
        raise contract.BadInput("--timeout must be > 0")
    contract.check_signature(args.signature)
    if args.log:
        try:
            Path(args.log).parent.mkdir(parents=True, exist_ok=True)
            Path(f"{args.log}.stdout").touch()
        except OSError as err:
            raise contract.BadInput(f"--log {args.log}: cannot write there ({err.strerror})") from None
    result = Launcher().run(Run(tuple(cmd), kind="exec", timeout=args.timeout,
                                log_stem=Path(args.log) if args.log else None, signature=args.signature,
                                check_replicas=args.check_replicas))
    print(json.dumps(result.to_dict(), default=str))
    return result.code


def entry(argv=None, program=None) -> int:
    """``program`` (default ``main``) under ``git bisect run``'s rules (``contract.bisect_entry``)."""
    return contract.bisect_entry(program or main, argv)


if __name__ == "__main__":
    sys.exit(entry())
