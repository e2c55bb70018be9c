"""``python -m tools.nodes``: the program of ``tools/launch/nodes.py`` (the executor, on its floor)."""

import sys

from tools.core import contract
from tools.launch.nodes import main

if __name__ == "__main__":
    sys.exit(contract.bisect_entry(main))
