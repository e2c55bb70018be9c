"""``python -m tools.triage``: see ``tools/triage/__init__.py``."""

import sys

from tools.core import contract
from tools.triage import main

sys.exit(contract.run_main(main))
