"""The whole-program passes of nox -s minimize (tools/minimize_passes.py): value folding from a
recorded run, and dead definitions."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tools import minimize as m
from tools.minimize_passes import drop_unused, fold, instrument, read_records

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
    folded, count = fold(PROGRAM, records, m.constants(PROGRAM))
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
    assert fold(source, records, m.constants(source))[1] == 0  # not a value the program has
    assert fold(source, records, m.constants(source) | {(int, int(records[0]))})[1] == 1


def test_a_read_that_changes_between_processes_is_not_folded(tmp_path):
    sink = tmp_path / "v.jsonl"
    sink.write_text('[0, "1"]\n[1, "2"]\n[0, "3"]\n[1, "2"]\n[2, nu')  # two processes, a torn line
    assert read_records(sink) == {1: "2"}


def test_only_one_statement_may_be_folded(tmp_path):
    source = "c = {'a': 1}\ndef f():\n    return c['a']\ndef g():\n    return c['a']\nprint(f(), g())\n"
    records = {0: "1", 1: "1"}
    allowed = m.constants(source)
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
    kept = {"main.py": m.kept_statements(files["main.py"])}
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
    from tools.minimize_passes import drop_unused_params, functions_with_unused_params

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
    from tools.minimize_passes import drop_unused_params

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
