"""``python -m tools.findings``: the program of ``tools/records/findings.py``, where it lives on its floor."""

import sys

from tools.records.findings import main

if __name__ == "__main__":
    sys.exit(main())
