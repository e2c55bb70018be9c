"""Run the test methods a torch patch adds to one of torch's existing test classes.

torch's test files are not in its wheels, torch publishes no source distribution, and its git
repository is far larger than what can be brought to this machine, so the file a torch patch adds
its test to (e.g. ``test/distributed/test_c10d_gloo.py``) is not here to patch. What the wheel
does ship is torch's distributed test machinery (``torch.testing._internal.common_distributed``).
So the added methods are taken from the patch (the ``+`` lines of each hunk that sit inside a
class) and run in a stand-in of their class: a ``MultiProcessTestCase`` with two ranks and the one
helper the gloo DDP tests use, ``_get_process_group`` (a ``FileStore`` gloo group). The test body
is the patch's own, unchanged; what is not torch's own is the class around it, and docs/patches.md says
so.
"""

from __future__ import annotations

import re
import textwrap

from tools.series import patches

HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@ ?(.*)$")
METHOD = re.compile(r"^    def (test_\w+)\(self")

HOST = '''\
"""Stand-in host for test methods added by {patch} to {path} (generated)."""

import copy  # noqa: F401 - names the added tests may use, as in torch's test files
import gc  # noqa: F401
import os  # noqa: F401

import torch
import torch.distributed as c10d
import torch.nn as nn  # noqa: F401
from torch.nn.parallel import DistributedDataParallel  # noqa: F401
from torch.testing._internal.common_distributed import MultiProcessTestCase, requires_gloo  # noqa: F401
from torch.testing._internal.common_utils import run_tests


class {cls}(MultiProcessTestCase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def tearDown(self):
        super().tearDown()
        try:
            os.remove(self.file_name)
        except OSError:
            pass

    @property
    def world_size(self):
        return 2

    def _get_process_group(self):
        store = c10d.FileStore(self.file_name, self.world_size)
        c10d.init_process_group(backend="gloo", store=store, rank=self.rank, world_size=self.world_size)
        return c10d.distributed_c10d._get_default_group()

{methods}

if __name__ == "__main__":
    run_tests()
'''


class HostError(patches.PatchError):
    """The patch's test changes cannot be hosted (one line, exit 2)."""


def added_methods(section: str) -> tuple[str, list[str], str]:
    """The class the patch adds test methods to, their names, and their source (dedented to
    class level): from the ``+`` lines of hunks whose header names ``class X(``."""
    cls, names, body = None, [], []
    for hunk in re.split(r"(?m)^(?=@@ )", section)[1:]:
        header = HUNK.match(hunk.splitlines()[0])
        owner = re.match(r"class (\w+)\(", header.group(1)) if header else None
        added = [line[1:] for line in hunk.splitlines()[1:] if line.startswith("+")]
        tests = [m.group(1) for m in map(METHOD.match, added) if m]
        if not tests:
            continue
        if not owner:
            raise HostError(f"a hunk adds {tests[0]} outside a class the hunk header names")
        if cls not in (None, owner.group(1)):
            raise HostError(f"test methods added to two classes ({cls}, {owner.group(1)})")
        cls = owner.group(1)
        names += tests
        body += added
    if not cls:
        raise HostError("the patch adds no test method to an existing torch test class")
    return cls, names, "\n".join(body).rstrip() + "\n"


def host(patch: patches.Patch, path: str) -> tuple[str, list[str]]:
    """The source of a runnable stand-in for ``path`` holding the added methods, and their
    unittest ids (``Class.method``)."""
    cls, names, methods = added_methods(patch.sections()[path])
    source = HOST.format(patch=patch.name, path=path, cls=cls, methods=textwrap.indent(
        textwrap.dedent(methods), "    "))
    return source, [f"{cls}.{name}" for name in names]
