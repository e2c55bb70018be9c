"""The stand-in host for test methods a torch patch adds to an existing torch test class."""

import ast

import pytest

from tools.series import patches, torch_host

SECTION = """diff --git a/test/distributed/test_x.py b/test/distributed/test_x.py
--- a/test/distributed/test_x.py
+++ b/test/distributed/test_x.py
@@ -2,4 +2,5 @@
 import copy
+import gc
 import logging
@@ -40,4 +41,9 @@ class {cls}(
             loss.backward()
{blank}
+    def test_{name}(self):
+        model = nn.Linear(2, 2)
+        self.assertIsNotNone(model)
+
     def test_old(self):
"""


def section(cls="SomeTest", name="new"):
    return SECTION.format(cls=cls, name=name, blank=" ")  # a context line of an empty line


def test_the_added_methods_and_their_class():
    cls, names, source = torch_host.added_methods(section())
    assert (cls, names) == ("SomeTest", ["test_new"])
    assert source.startswith("    def test_new(self):") and "import gc" not in source


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (section().replace("class SomeTest(", "def helper("),
         "outside a class"),
        (section() + section("Other", "two").split("\n", 3)[3],
         "two classes"),
        (section().replace("def test_new", "def helper_new"), "no test method"),
    ],
)
def test_what_cannot_be_hosted_is_a_one_line_error(section, message):
    with pytest.raises(torch_host.HostError, match=message):
        torch_host.added_methods(section)


def test_the_series_torch_patch_is_hosted_as_a_runnable_module():
    (patch,) = [p for p in patches.series() if p.target == "torch"]
    path = next(iter(patch.test_changes()))
    source, ids = torch_host.host(patch, path)
    tree = ast.parse(source)
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    methods = {f"{c.name}.{f.name}" for c in classes for f in c.body if isinstance(f, ast.FunctionDef)}
    assert ids and set(ids) <= methods
    assert "_get_process_group" in {f.name for c in classes for f in c.body if isinstance(f, ast.FunctionDef)}
