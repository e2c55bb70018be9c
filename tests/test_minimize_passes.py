"""The whole-program passes of nox -s minimize (tools/minimize/passes/): value folding from a
recorded run, and dead definitions."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tools.minimize import source as m_source
from tools.minimize.passes.statements import drop_unused
from tools.minimize.passes.values import fold, instrument, read_records

PROGRAM = textwrap.dedent('''
    """A hydra-style config read through a chain of functions."""
    import json
    import os

    CONFIG = {"data": {"size": 6, "names": ["a", "b"], "lr": -0.5},
              "stages": [{"w": 0.0}, {"w": 0.1}], "tag": "run"}


    def unused_helper(x):
        return os.path.join(x, "y")


    def build(cfg, seen):
        d = cfg["data"]
        return [d["size"], d["names"], d["lr"], cfg["tag"]] + [s["w"] for s in cfg["stages"]] + [seen[0]]


    def main(argv):
        config = CONFIG
        print(json.dumps(build(config, argv)))
        print(json.dumps(build(config, ["other"])))


    main(["first"])
''')


def test_recorded_values_fold_into_literals_and_the_program_still_runs(tmp_path):
    sink = tmp_path / "values.jsonl"
    script = tmp_path / "p.py"
    script.write_text(instrument(PROGRAM, sink))
    (tmp_path / "orig.py").write_text(PROGRAM)
    before = subprocess.run([sys.executable, str(tmp_path / "orig.py")], capture_output=True, text=True)
    after = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    assert after.stdout == before.stdout  # recording does not change what the program does
    records = read_records(sink)
    folded, count = fold(PROGRAM, records, m_source.constants(PROGRAM))
    # the scalar reads and the short list fold; the stage weights (two values) and the
    # argument that changes between calls do not; nor the dict-valued reads
    assert "return [6, ['a', 'b'], -0.5, 'run'] + [s['w'] for s in cfg['stages']] + [seen[0]]" in folded
    assert "d = cfg['data']" in folded
    assert count == 4
    (tmp_path / "folded.py").write_text(folded)
    rerun = subprocess.run([sys.executable, str(tmp_path / "folded.py")], capture_output=True, text=True)
    assert rerun.stdout == before.stdout


def test_values_the_original_does_not_have_are_not_folded(tmp_path):
    source = "import time\nx = {'t': time.time_ns() % 7}\nprint(x['t'])\n"
    sink = tmp_path / "v.jsonl"
    (tmp_path / "p.py").write_text(instrument(source, sink))
    subprocess.run([sys.executable, str(tmp_path / "p.py")], check=True, capture_output=True)
    records = read_records(sink)
    assert list(records) == [0]  # the one site gave one plain value (0..6)
    assert fold(source, records, m_source.constants(source))[1] == 0  # not a value the program has
    assert fold(source, records, m_source.constants(source) | {(int, int(records[0]))})[1] == 1


def test_attributes_read_as_values_are_recorded_and_fold_like_config_reads(tmp_path):
    source = textwrap.dedent('''
        import os

        class Encoder:
            def __init__(self):
                self.out_features = 16 * 2
                self.step = 0

            def grow(self):
                self.step += 1
                return self.step

        enc = Encoder()
        print(enc.out_features + 1, enc.grow(), enc.step, os.sep, enc.grow(), enc.step)
        ''')
    sink = tmp_path / "v.jsonl"
    (tmp_path / "p.py").write_text(instrument(source, sink))
    (tmp_path / "o.py").write_text(source)
    before = subprocess.run([sys.executable, str(tmp_path / "o.py")], capture_output=True, text=True)
    after = subprocess.run([sys.executable, str(tmp_path / "p.py")], capture_output=True, text=True,
                           check=True)
    assert after.stdout == before.stdout
    folded, n = fold(source, read_records(sink), m_source.constants(source) | {(int, 32)})
    # each site that gave one value is folded (each enc.step is read once); one that changed
    # (self.step in grow), a method called (enc.grow) and a module's name (os.sep) are not
    assert n == 3 and "print(32 + 1, enc.grow(), 1, os.sep, enc.grow(), 2)" in folded, folded
    assert "return self.step" in folded
    consts = m_source.constants(source)
    assert "enc.out_features" in fold(source, read_records(sink), consts)[0]  # 32 is not in it


def test_a_read_that_changes_between_processes_is_not_folded(tmp_path):
    sink = tmp_path / "v.jsonl"
    sink.write_text('[0, "1"]\n[1, "2"]\n[0, "3"]\n[1, "2"]\n[2, nu')  # two processes, a torn line
    assert read_records(sink) == {1: "2"}


def test_only_one_statement_may_be_folded(tmp_path):
    source = "c = {'a': 1}\ndef f():\n    return c['a']\ndef g():\n    return c['a']\nprint(f(), g())\n"
    records = {0: "1", 1: "1"}
    allowed = m_source.constants(source)
    out, n = fold(source, records, allowed, within={1})
    assert n == 1 and "return 1" in out and "return c['a']" in out


def test_dead_definitions_go_until_none_is_left_and_kept_ones_stay():
    files = {"main.py": textwrap.dedent('''
        import os, sys
        from lib import helper, other
        import torch.nn.functional as F
        X = 1
        Y = X + 1

        def a():
            return b()

        def b():
            return os.sep

        class Kept:  # minimize: keep
            pass

        print(helper(), F)
        '''), "lib.py": "def helper():\n    return 1\n\ndef other():\n    return 2\n\n"
                                                 "def lonely():\n    return 3\n"}
    kept = {"main.py": m_source.kept_statements(files["main.py"])}
    out = drop_unused(files, kept)
    main = out["main.py"]
    assert "def a" not in main and "def b" not in main and "X = 1" not in main and "Y =" not in main
    assert "import os" not in main and "sys" not in main  # b went, so os is unread
    assert "from lib import helper" in main and "other" not in main
    assert "import torch.nn.functional as F" in main and "class Kept" in main
    assert "lonely" not in out["lib.py"] and "def helper" in out["lib.py"]
    # lib.py's other() is imported by main.py, which never calls it: both go (the import first)
    assert "def other" not in out["lib.py"]
    assert drop_unused(out, kept) == out  # a fixpoint


def test_a_future_import_and_the_docstring_stay_first_when_instrumented(tmp_path):
    source = '"""doc"""\nfrom __future__ import annotations\nd = {"k": 3}\nprint(d["k"])\n'
    out = instrument(source, Path(tmp_path / "s.jsonl"))
    compile(out, "x", "exec")
    assert out.splitlines()[1].startswith("from __future__")


def test_unused_parameters_go_with_the_arguments_of_every_call():
    from tools.minimize.passes.calls import drop_unused_params, functions_with_unused_params

    source = textwrap.dedent('''
        def build(config, seed, out_dir="x", *, flag=True):
            return seed + 1

        class Module:
            def __init__(self, cfg, size=3):
                self.size = size

        def passed_around(a, b):
            return a

        print(build({"k": 1}, 2, out_dir="y"), build(cfg := {}, seed=5), Module({}, 4).size)
        print(list(map(passed_around, [1], [2])))
        ''')
    files = {"a.py": source}
    assert functions_with_unused_params(files) == ["Module", "build"]
    out = drop_unused_params(files)["a.py"]
    assert "def build(seed, *, flag=True)" in out and "build(2)" in out and "build(seed=5)" in out
    assert "def __init__(self, size=3)" in out and "Module(4)" in out
    assert "def passed_around(a, b)" in out  # used as a value: left alone
    exec(compile(out, "a.py", "exec"), {})  # still runs


def test_parameters_of_decorated_imported_or_shadowed_functions_stay():
    from tools.minimize.passes.calls import drop_unused_params

    files = {"a.py": textwrap.dedent('''
        import functools

        @functools.lru_cache
        def cached(x, unused):
            return x

        def exported(x, unused):
            return x

        def shadowed(x, unused):
            return x

        def free(x, unused):
            return x

        def user(shadowed):
            return shadowed

        print(cached(1, 2), exported(1, 2), shadowed(1, 2), free(1, 2), user(3))
        '''), "b.py": "from a import exported\nprint(exported(1, 2))\n"}
    out = drop_unused_params(files)
    assert "def cached(x, unused)" in out["a.py"]  # a decorator may call it its own way
    assert "def exported(x, unused)" in out["a.py"] and "exported(1, 2)" in out["b.py"]
    assert "def shadowed(x, unused)" in out["a.py"]  # also a parameter's name elsewhere
    assert "def free(x)" in out["a.py"] and "free(1)" in out["a.py"]


def test_an_assignment_whose_value_calls_something_is_left_to_the_reducer():
    files = {"a.py": "import random\nseed = random.seed(0)\nX = [1, 2]\nprint(random.random())\n"}
    out = drop_unused(files, {})["a.py"]
    assert "seed = random.seed(0)" in out and "X = " not in out


# -- no-ops, inlining, variables -----------------------------------------------------------

def runs_the_same(before: str, after: str) -> None:
    """Both programs print the same (the passes keep what a program does)."""
    outs = [subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=60)
            for src in (before, after)]
    assert outs[1].returncode == 0, outs[1].stderr
    assert outs[0].stdout == outs[1].stdout and outs[0].stdout


INLINE = textwrap.dedent('''
    import json

    CONFIG = {"size": 3, "name": "run"}

    def build_callbacks(x):
        """Docstring."""
        callbacks = [x, "timer"]
        return callbacks

    def build_trainer(n):
        return dict(callbacks=build_callbacks(n), n=n)

    class Model:
        def __init__(self):
            self.values = self._make(3)

        def _make(self, k):
            return [k] * 2

        def run(self):
            out = []
            self.collect(out)
            return out

        def collect(self, out):
            out.append(sum(self.values))

        def set_stage(self, stage):
            self.stage = stage

    def main():
        config = CONFIG
        model = Model()
        model.set_stage(config["name"])
        print(json.dumps([build_trainer(config["size"]), model.run(), model.stage]))

    if __name__ == "__main__":
        main()
''')


def test_functions_and_methods_with_one_caller_are_inlined_and_the_program_does_the_same():
    from tools.minimize.passes.calls import inlinable, inline_all

    files = {"a.py": INLINE}
    assert inlinable(files) == ["Model._make", "Model.collect", "Model.set_stage", "build_callbacks",
                               "build_trainer", "main"]
    out = inline_all(files)["a.py"]
    for name in ("def main", "def build_trainer", "def build_callbacks", "def _make", "def collect",
                 "def set_stage"):
        assert name not in out
    assert "self.values = [3] * 2" in out  # a one-return function became its expression
    assert "stage = config['name']\n    model.stage = stage" in out  # a method on another name
    assert "out.append(sum(self.values))" in out
    runs_the_same(INLINE, out)


@pytest.mark.parametrize("source", [
    # the caller already has a name the function binds
    "def f(a):\n    b = a + 1\n    return b\ndef g():\n    b = 5\n    print(f(1), b)\ng()\n",
    # the caller binds a name the function reads from the module
    "x = 1\ndef f():\n    y = x\n    return y\ndef g():\n    x = 2\n    print(f(), x)\ng()\n",
    # recursive, decorated, a generator, called in a loop's comprehension or under a condition
    "def f(n):\n    k = n\n    return f(n - 1) if k else 0\nprint(f(2))\n",
    "import functools\n@functools.lru_cache\ndef f(n):\n    k = n\n    return k\nprint(f(2))\n",
    "def f(n):\n    yield n\nprint(list(f(2)))\n",
    "def f(n):\n    k = n * 2\n    return k\nprint([f(i) for i in range(3)])\n",
    "import sys\ndef f(n):\n    k = n * 2\n    return k\nprint(len(sys.argv) > 5 and f(2))\n",
    # a method that needs its class cell, called from outside its class
    "class A:\n    def m(self):\n        return super().__repr__()\nprint(A().m()[:3])\n",
    # several calls, or passed as a value
    "def f(n):\n    return n\nprint(f(1), f(2))\n",
    "def f(n):\n    return n\nprint(list(map(f, [1])))\n",
])
def test_inlining_is_refused_where_a_name_would_change_meaning_or_the_call_count(source):
    from tools.minimize.passes.calls import inline

    compile(source, "a.py", "exec")
    assert inline({"a.py": source}, "A.m" if "class A" in source else "f") is None


def test_variables_read_once_move_into_their_read_and_dead_ones_go():
    from tools.minimize.passes.variables import inline_variables, single_use_variables

    source = textwrap.dedent('''
        import json
        CONFIG = {"stages": [1, 2], "unused": 3}

        def run(data):
            blocks, width = 0, len(data)
            total = sum(data)
            scale = 2
            labels = [x * 2 for x in data]
            out = []
            for item in data:
                out.append(item * total + scale)
            print(json.dumps([width, out, labels]))
            data = data + [9]
            later = len(data)
            print(later)

        for stage in CONFIG["stages"]:
            run([stage, 3])
        ''')
    files = {"a.py": source}
    assert ("a.py", "labels") in single_use_variables(files)
    out = inline_variables(files)["a.py"]
    assert "blocks" not in out and "width" not in out and "labels" not in out  # dead, split, moved
    assert "total = sum(data)" in out  # read in a loop: computed once as written
    assert "item * total + 2" in out  # a constant may go into a loop
    assert "print(len(data + [9]))" in out  # data bound again: its second version moved
    assert "for stage in [1, 2]:" in out  # a dict literal read once by a constant key
    runs_the_same(source, out)
    merged = "class C:\n    def m(self, trainer):\n        return trainer\nout = [1]\nout.append(2)\n" \
        "trainer = dict(cbs=out)\nprint(C().m(3), trainer)\n"
    after = inline_variables({"a.py": merged})["a.py"]  # the appends merged, then moved; a
    assert "print(C().m(3), dict(cbs=[1, 2]))" in after  # parameter of the same name is another
    runs_the_same(merged, after)
    built = "import sys\nlayers = []\nlayers += [1, 2]\nlayers.extend([3])\nprint(*layers, file=sys.stdout)\n"
    after = inline_variables({"a.py": built})["a.py"]  # += and extend merged too, then moved
    assert "print(*[1, 2, 3], file=sys.stdout)" in after
    runs_the_same(built, after)
    for stays in ("out.append(len(out))", "out += [len(out)]", "out.extend([out])",  # reads the list
                  "out.append(*more)"):  # one item or several: known only when it runs
        source = f"more = [2, 3]\nout = [1]\n{stays}\nprint(out, more)\n"
        assert stays in inline_variables({"a.py": source})["a.py"]
    closure = "import os\nx = os.getpid()\ndef f():\n    return x\nprint(x == f())\n"
    assert inline_variables({"a.py": closure})["a.py"] == closure  # a function reads it too
    rebound = "def f(a):\n    x = a\n    if a:\n        a = 5\n    print(x, a)\nf(1)\n"
    assert "x = a" in inline_variables({"a.py": rebound})["a.py"]  # its value's name is bound again


def test_no_op_statements_and_constant_conditions_go_but_kept_statements_stay():
    from tools.minimize.passes.statements import drop_noops
    from tools.minimize.source import kept_statements

    source = textwrap.dedent('''
        """Module docstring."""
        import os

        class Kept:  # minimize: keep
            """Stays: inside a kept statement."""
            pass

        def f(x):
            """Goes."""
            0
            pass
            if True:
                y = x if False else x + 1
            else:
                y = 0
            return y

        print(f(1), Kept.__doc__)
        ''')
    out = drop_noops({"a.py": source}, {"a.py": kept_statements(source)})["a.py"]
    assert "Module docstring" not in out and "Goes." not in out and "\n    0\n" not in out
    assert "Stays: inside a kept statement." in out and "if True" not in out
    assert "y = x + 1" in out and "y = 0" not in out
    runs_the_same(source, out)


def test_a_function_another_module_reads_as_an_attribute_is_not_inlined():
    from tools.minimize.passes.calls import inline

    files = {"train.py": "def f(n):\n    k = n\n    return k\nprint(f(1))\n",
             "other.py": "import train as t\nprint(t.f(2))\n"}
    assert inline(files, "f") is None
    files["other.py"] = "class P:\n    def f(self):\n        return 3\nprint(P().f())\n"  # another .f
    assert "def f" not in inline(files, "f")["train.py"]


SUBMODULE = textwrap.dedent('''
    class Module:
        def __init__(self):
            self.hooks = 0

        def __call__(self, *a):
            return self.forward(*a)

    class Head(Module):
        """A head."""
        def __init__(self, width, hidden, classes=3):
            super().__init__()
            scale = 2
            self.fc1 = width * scale
            self.fc2 = hidden + classes

        def forward(self, z):
            return self.fc2 * (self.fc1 + z)

    class Owner(Module):
        def __init__(self):
            super().__init__()
            self.out_features = 4
            self.head = Head(self.out_features, 16)

        def forward(self, x):
            return self.head(x) + 1

    print(Owner()(5))
''')


def test_a_sub_module_class_built_once_is_flattened_into_its_owner():
    from tools.minimize.passes.calls import inline_all
    from tools.minimize.passes.classes import flatten_submodule, flattenable

    files = {"a.py": SUBMODULE}
    assert flattenable(files) == ["Head"]
    out = flatten_submodule(files, "Head")["a.py"]
    assert "class Head" not in out and "self.head_fc1 = width * scale" in out
    assert "return self.head_forward(x) + 1" in out
    runs_the_same(SUBMODULE, out)
    runs_the_same(SUBMODULE, inline_all({"a.py": out})["a.py"])  # then its forward goes inline


@pytest.mark.parametrize("change", [
    ("    def forward(self, z):", "    def extra(self):\n        return 1\n\n    def forward(self, z):"),
    ("return self.head(x) + 1", "return self.head(x) + self.head.fc1"),  # read other than as a call
    ("        scale = 2\n", "        scale = 2\n        print(self)\n"),  # self passed on
    ("        scale = 2\n", "        scale = 2\n        self.register()\n"),  # a base's method
    ("        self.out_features = 4\n", "        self.out_features = 4\n        scale = 1\n"),  # a clash
])
def test_flattening_is_refused_when_the_class_does_more_or_a_name_would_clash(change):
    from tools.minimize.passes.classes import flatten_submodule

    source = SUBMODULE.replace(*change)
    assert source != SUBMODULE
    assert flatten_submodule({"a.py": source}, "Head") is None


@pytest.mark.parametrize("source", [
    # a constant with a backslash cannot be written inside an f-string's braces (Python 3.11)
    'def green(s):\n    return "\\033[92m" + s + "\\033[0m"\nprint(f"status: {green(\'ok\')}")\n',
    'cr = "\\r"\nprint(f"{cr}step")\n',
    # a finally left empty, a dead write to a dict literal's key, an emptied finally by a move
    "def main():\n    print(1)\ntry:\n    main()\nfinally:\n    0\n",
    "def f():\n    x = {'a': 1}\n    x['a'] = 2\n    del x['a']\nf()\n",
    "def main():\n    try:\n        print(1)\n    finally:\n        done = True\nmain()\n",
    # a variable read in a match pattern
    "import enum\nColor = enum.Enum('Color', 'RED')\nmatch 1:\n    case Color.RED:\n        print(1)\n",
])
def test_the_passes_never_fail_or_write_a_program_that_does_not_compile(source):
    from tools.minimize.passes.calls import (
        bind_constant_args,
        functions_with_constant_args,
        inlinable,
        inline_all,
    )
    from tools.minimize.passes.classes import flattenable
    from tools.minimize.passes.literals import fold_literals
    from tools.minimize.passes.statements import drop_noops
    from tools.minimize.passes.variables import inline_variables, single_use_variables

    files = {"a.py": source}
    inlinable(files), flattenable(files), single_use_variables(files), functions_with_constant_args(files)
    for out in (drop_noops(files, {}), inline_all(files), inline_variables(files), bind_constant_args(files),
                fold_literals(files, {})):
        compile(out["a.py"], "a.py", "exec")


@pytest.mark.parametrize(("source", "moved"), [
    ("for b in [1, 2]:\n    out = b * 2\nprint(out)\n", False),  # out of its loop
    ("total = 0\nstart = total\nfor v in [1, 2]:\n    print(start)\n    total += v\n", False),
    ("i = 10\nn = i * 1\nprint([n for i in range(3)])\n", False),  # a comprehension's own i
    ("import os\nn = os.getpid()\nprint(n)\n", True),
    ("def f(v):\n    x = 1\n    match v:\n        case [x]:\n            pass\n    return x\nprint(f([5]))\n",
     False),  # a ``case`` pattern binds it again
])
def test_a_variable_moves_only_where_it_means_the_same(source, moved):
    from tools.minimize.passes.variables import inline_variables

    out = inline_variables({"a.py": source})["a.py"]
    assert (out != source) == moved, out


BUILT = textwrap.dedent('''
    import json

    class Encoder:
        def __init__(self, features, hidden, activation, names=("a", "b")):
            width = features
            for h in hidden:
                layers = [("linear", width, h), {"relu": "R", "gelu": "G"}[activation]]
                width = h
            self.layers = list(*[layers])
            self.out = width
            self.names = names

    def forward(x, scale):
        x = x * scale
        x = x + 1
        x = [x, x][0]
        return x

    encoder = Encoder(16, [32], "gelu")
    print(json.dumps([encoder.layers, encoder.out, encoder.names, forward(2, 3), forward(5, 3)]))
''')


def test_constant_arguments_literals_and_versions_simplify_a_program_that_does_the_same():
    from tools.minimize.passes.calls import bind_constant_args, functions_with_constant_args
    from tools.minimize.passes.literals import fold_literals
    from tools.minimize.passes.variables import inline_variables

    files = {"a.py": BUILT}
    assert functions_with_constant_args(files) == ["Encoder", "forward"]
    out = bind_constant_args(files)
    assert "def __init__(self):" in out["a.py"] and "Encoder()" in out["a.py"]  # all four bound
    assert "def forward(x):" in out["a.py"] and "forward(2)" in out["a.py"]  # the same 3 at each call
    runs_the_same(BUILT, out["a.py"])
    out = fold_literals(out, {})
    assert "for h in" not in out["a.py"] and "h = 32" in out["a.py"]  # a one-item loop unrolled
    assert "'G']" in out["a.py"] and "'relu'" not in out["a.py"]  # a literal dict indexed by a constant
    assert "list(layers)" in out["a.py"] and "x = x + 1" in out["a.py"]  # spread; [x, x][0] -> x
    runs_the_same(BUILT, out["a.py"])
    out = inline_variables(out)
    # width is bound twice, h is a number read three times, x three times: each version moves
    assert "width" not in out["a.py"] and " h" not in out["a.py"]
    assert "self.out = 32" in out["a.py"] and "return x * 3 + 1" in out["a.py"]
    runs_the_same(BUILT, out["a.py"])


@pytest.mark.parametrize("source", [
    # the calls pass different values; a name, not a literal; the body binds the name again
    "def f(n):\n    print(n)\nf(1)\nf(2)\n",
    "k = 3\ndef f(n):\n    print(n)\nf(k)\n",
    "def f(n):\n    n = n + 1\n    print(n)\nf(1)\n",
    # a list read twice would become two lists; passed around as a value
    "def f(v):\n    v.append(1)\n    print(v)\nf([])\n",
    "def f(n):\n    print(n)\nprint(list(map(f, [1])))\n",
    # a shared mutable default; one read, in a loop; a function that reads its own arguments
    "def f(k, cache={}):\n    return cache.setdefault(k, object())\nprint(f(1) is f(1), f(2) is f(1))\n",
    "def f(seen):\n    return [seen.setdefault(c, i) for i, c in enumerate('aba')]\nprint(f({}))\n",
    "class M:\n    def __init__(self, lr=0.1):\n        self.save_hyperparameters()\nM(lr=0.01)\n",
    # a ``case`` pattern binds the parameter again
    "def f(x):\n    match [9]:\n        case [x]:\n            pass\n    return x\nprint(f(1))\n",
])
def test_constant_arguments_are_bound_only_where_the_value_is_the_same_object(source):
    from tools.minimize.passes.calls import bind_constant_args

    assert bind_constant_args({"a.py": source})["a.py"] == source


@pytest.mark.parametrize(("source", "split"), [
    ("def f(a):\n    x = a\n    x = x * 2\n    print(x)\nf(1)\n", True),
    # read before the first assignment; bound in a branch; a closure reads it; a loop rebinds a param
    ("def f():\n    for i in [1, 2]:\n        if i > 1:\n            print(x)\n"
     "        x = i\n        x = 2\nf()\n", False),
    ("def f(a):\n    x = a\n    if a:\n        x = 2\n    print(x)\nf(1)\n", False),
    ("def f(a):\n    x = a\n    g = lambda: x\n    x = 2\n    print(g())\nf(1)\n", False),
    ("def f(x):\n    for i in [1, 2]:\n        print(x)\n        x = i\nf(0)\n", False),
    # a nested function writes it (nonlocal); a ``case`` pattern binds it
    ("def f():\n    x = 1\n    x = 2\n    def g():\n        nonlocal x\n        x = 3\n    g()\n"
     "    print(x)\nf()\n", False),
    ("def f(v):\n    x = 1\n    print(x)\n    x = 2\n    match v:\n        case [x]:\n            pass\n"
     "    print(x)\nf([5])\n", False),
])
def test_a_variable_is_split_in_versions_only_in_straight_code(source, split):
    from tools.minimize.passes.variables import _split_versions

    tree = ast.parse(source)
    assert _split_versions(tree) == split
    if split:
        runs_the_same(source, ast.unparse(tree))


FIT = textwrap.dedent('''
    import json

    class LightningDataModule:  # what Trainer.fit does with a data module, in small
        pass

    class Trainer:
        def fit(self, model, train_dataloaders=None, datamodule=None):
            if isinstance(train_dataloaders, LightningDataModule):
                train_dataloaders, datamodule = None, train_dataloaders
            if datamodule is not None:
                getattr(datamodule, "prepare_data", lambda: None)()
                datamodule.setup("fit")
                train_dataloaders = datamodule.train_dataloader()
            print(json.dumps([model, list(train_dataloaders)]))

    class Data(LightningDataModule):
        """Docstring."""
        def __init__(self):
            super().__init__()

        def setup(self, stage=None):
            size = 3 if stage == "fit" else 0
            self.train_set, self.rest = list(range(size)), None

        def train_dataloader(self):
            return iter(self.train_set)

    data = Data()
    for model in ["a", "b"]:
        Trainer().fit(model, datamodule=data)
    Trainer().fit("c", data)
''')


def test_a_data_module_used_once_becomes_its_loaders_and_the_program_does_the_same():
    from tools.minimize.passes.data import datamodules, loaders_for_datamodule

    files = {"a.py": FIT}
    assert datamodules(files) == ["Data"]
    out = loaders_for_datamodule(files, "Data")["a.py"]
    assert "class Data" not in out and "train_set, rest = (list(range(size)), None)" in out
    assert "fit(model, train_dataloaders=iter(train_set))" in out and "fit('c', iter(train_set))" in out
    runs_the_same(FIT, out)
    inline = FIT.replace("data = Data()\n", "").replace("datamodule=data", "datamodule=Data()") \
        .replace('Trainer().fit("c", data)\n', "")
    out = loaders_for_datamodule({"a.py": inline}, "Data")["a.py"]
    assert "fit(model, train_dataloaders=iter(train_set))" in out


FIT_VAL = FIT.replace(
    "def fit(self, model, train_dataloaders=None, datamodule=None):",
    "def fit(self, model, train_dataloaders=None, val_dataloaders=None, datamodule=None):").replace(
    "            train_dataloaders = datamodule.train_dataloader()\n",
    "            train_dataloaders = datamodule.train_dataloader()\n"
    "            val_dataloaders = datamodule.val_dataloader()\n").replace(
    "print(json.dumps([model, list(train_dataloaders)]))",
    "print(json.dumps([model, list(train_dataloaders), list(val_dataloaders or [])]))").replace(
    "    def train_dataloader(self):",
    "    def val_dataloader(self):\n        return iter(self.rest or [7])\n\n"
    "    def train_dataloader(self):")


def test_a_data_module_with_a_validation_loader_passes_both_loaders():
    from tools.minimize.passes.data import loaders_for_datamodule

    assert all(part in FIT_VAL for part in ("val_dataloaders=None", "datamodule.val_dataloader()",
                                            "list(val_dataloaders", "def val_dataloader"))
    out = loaders_for_datamodule({"a.py": FIT_VAL}, "Data")["a.py"]
    assert "class Data" not in out
    assert "fit(model, train_dataloaders=iter(train_set), val_dataloaders=iter(rest or [7]))" in out
    assert "fit('c', iter(train_set), val_dataloaders=iter(rest or [7]))" in out
    runs_the_same(FIT_VAL, out)
    taken = FIT_VAL.replace('Trainer().fit("c", data)', 'Trainer().fit("c", data, val_dataloaders=[1])')
    assert loaders_for_datamodule({"a.py": taken}, "Data") is None  # both given: not ours to choose


@pytest.mark.parametrize("change", [
    ("    def train_dataloader(self):", "    def test_dataloader(self):\n        return 0\n\n"
     "    def train_dataloader(self):"),  # another hook
    ("    def train_dataloader(self):", "    def val_dataloader(self):\n        self.seen = 1\n"
     "        return 0\n\n    def train_dataloader(self):"),  # a validation loader that is not a return
    ("        return iter(self.train_set)", "        return iter(self.trainer)"),  # Lightning's own state
    ("        size = 3 if", "        print(self.hparams)\n        size = 3 if"),  # in setup too
    ("        size = 3 if", "        pick = lambda stage: stage\n        size = 3 if"),  # another stage
    ("        size = 3 if", "        super().prepare_data()\n        size = 3 if"),  # its base's hook
    ("data = Data()\n", "data = Data()\nprint(type(data).__name__)\n"),  # used as an object
    ("data = Data()\n", "data = Data()\nsize = 1\n"),  # its local would clash
    ("        size = 3 if", "        print(self)\n        size = 3 if"),  # self passed on
])
def test_a_data_module_stays_when_it_is_more_than_its_loaders(change):
    from tools.minimize.passes.data import loaders_for_datamodule

    source = FIT.replace(*change)
    assert source != FIT
    compile(source, "a.py", "exec")
    assert loaders_for_datamodule({"a.py": source}, "Data") is None


WRAPPED = textwrap.dedent('''
    class Module:  # nn.Module, in small
        def __call__(self, *args):
            return self.forward(*args)

    class Scale(Module):
        def __init__(self, k):
            self.k = k

        def forward(self, x):
            return x * self.k

    class Encoder(Module):
        """Docstring."""
        def __init__(self):
            super().__init__()
            self.layers = Scale(3)

        def forward(self, x):
            return self.layers(x)

    class Model(Module):
        def __init__(self):
            self.backbone = Encoder()

        def forward(self, x):
            return self.backbone(x) + 1

    print(Model()(2))
''')


@pytest.mark.parametrize(("change", "unwrapped"), [
    (None, True),
    (("        self.layers = Scale(3)", "        self.layers = Scale(3)\n        self.width = 3"), False),
    (("        return self.layers(x)", "        return self.layers(x) * 2"), False),
    (("print(Model()(2))", "print(Model()(2), Encoder)"), False),  # used as a value too
    (("class Encoder(Module):", "class Encoder(Scale):"), False),  # its base may do more
    (("        self.backbone = Encoder()", "        Scale = 1\n        self.backbone = Encoder()"),
     False),  # a name its value reads means another thing there
])
def test_a_module_that_only_wraps_another_is_replaced_by_it(change, unwrapped):
    from tools.minimize.passes.classes import unwrap_module, wrappers

    source = WRAPPED.replace(*change) if change else WRAPPED
    assert source != WRAPPED or not change
    out = unwrap_module({"a.py": source}, "Encoder")
    assert (out is not None) == unwrapped
    if unwrapped:
        assert wrappers({"a.py": source}) == ["Encoder"]
        assert "self.backbone = Scale(3)" in out["a.py"] and "class Encoder" not in out["a.py"]
        runs_the_same(source, out["a.py"])


def test_a_loop_over_one_item_is_not_unrolled_when_an_inner_loop_breaks_out_of_it():
    from tools.minimize.passes.literals import fold_literals

    source = "for i in range(2):\n    for x in [1]:\n        for y in []:\n            pass\n" \
        "        else:\n            break\n    print('after', i)\n"
    out = fold_literals({"a.py": source}, {})["a.py"]
    assert "for x in [1]" in out
    runs_the_same(source, out)


def test_attributes_in_case_patterns_are_not_recorded(tmp_path):
    source = textwrap.dedent('''
        import enum

        class Mode(enum.Enum):
            TRAIN = 1

        class Box:
            size = 3

        match Mode.TRAIN:
            case Mode.TRAIN:
                print("train", Box.size)
        ''')
    sink = tmp_path / "v.jsonl"
    (tmp_path / "p.py").write_text(instrument(source, sink))
    after = subprocess.run([sys.executable, str(tmp_path / "p.py")], capture_output=True, text=True)
    assert after.returncode == 0 and after.stdout == "train 3\n", after.stderr


def test_the_one_by_one_lists_are_what_each_name_alone_would_change():
    """Found from one pass over all (cheap), checked alone: the same as trying every name."""
    from tools.minimize.passes.calls import (
        bind_constant_args,
        drop_unused_params,
        functions_with_constant_args,
        functions_with_unused_params,
    )

    chained = textwrap.dedent('''
        def g(n, unused):
            return n

        def f(m, k, width):
            return g(m, k) * width

        class Block:
            def __init__(self, size, act):
                self.size = f(size, 0, 4)

        def h(x, y):
            return x + y

        print(f(3, 1, 4), Block(8, "relu").size, h(1, 2), h(1, 5), g(2, None))
    ''')
    fixture = Path(__file__).parent / "fixtures" / "minimize" / "finetune_backbone.py"
    for source in (chained, fixture.read_text()):
        files = {"a.py": source}
        for listed, change in ((functions_with_unused_params, drop_unused_params),
                               (functions_with_constant_args, bind_constant_args)):
            names = {n.name for n in ast.parse(source).body if hasattr(n, "name")}
            alone = sorted(n for n in names if change(files, only=n) != files)
            assert listed(files) == alone
    touched: set[str] = set()
    drop_unused_params({"a.py": chained}, touched=touched)
    assert touched == {"Block", "f", "g"}  # all at once, f's k goes once g lost it: not alone
    assert functions_with_unused_params({"a.py": chained}) == ["Block", "g"]
    assert functions_with_constant_args({"a.py": chained}) == ["Block", "f", "h"]


@pytest.mark.parametrize("source, expected", [
    ('if "train" == "train":\n    f()\n', "if True:\n    f()"),
    ("x = 1 < 2 < 3\n", "x = True"),
    ('x = "a" != "a"\n', "x = False"),
    ("x = None is None and y\n", "x = y"),
    ("x = 2 > 3 or y\n", "x = y"),
    ("x = 2 > 3 and y\n", "x = False"),
    ('x = "a" < 1\n', "x = 'a' < 1"),  # raises at run time: left as it is
    ("x = y == y\n", "x = y == y"),  # not literals
])
def test_comparisons_of_literals_are_folded(source, expected):
    from tools.minimize.passes.literals import fold_literals

    assert fold_literals({"t.py": source}, {})["t.py"].strip() == expected
