"""nox -s minimize: the reducer driven by the harness verdict (tools/minimize/).

Most tests shrink small pure-Python projects whose "library" (``engine.py``) raises the #20706
message the way torch does (a dead weak reference to the wrapper), run with ``--fresh-process``
(each candidate a new interpreter, a few milliseconds). The ``ddp`` test shrinks the real bloated
training program of tests/fixtures/minimize on real torch and Lightning for a short budget.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tools import minimize as m
from tools.core import contract
from tools.minimize import options as m_options
from tools.minimize import oracle as m_oracle
from tools.minimize import search as m_search
from tools.minimize import source as m_source
from tools.stages.bisect import State

ROOT = Path(__file__).resolve().parent.parent
SIGNATURE = "'NoneType' object has no attribute 'reducer'"
OTHER = "Trying to backward through the graph a second time"

ENGINE = f'''
"""Stands for the library: a wrapper, and outputs that hold it by weak reference."""
import weakref


class Wrapper:
    def __init__(self, module):
        self.module = module
        self.reducer = object()


class Output:
    def __init__(self, wrapper):
        self.ref = weakref.ref(wrapper)
        self.used = False

    def backward(self):
        reducer = self.ref().reducer  # the wrapper is gone: {SIGNATURE}
        if self.used:
            raise RuntimeError("{OTHER}")
        self.used = True
        return reducer


def unrelated(x):
    return [i * 2 for i in range(x)]
'''

TRAIN = '''
"""A bloated program hiding the bug behind configuration, logging and bookkeeping."""
import json
import logging
import os
import sys

import engine

CONFIG = {"stages": ["warmup", "finetune"], "log_every": 5, "lr": 0.1, "data": {"size": 6}}
log = logging.getLogger("train")


class Metrics:
    def __init__(self):
        self.values = {}

    def update(self, name, value):
        self.values.setdefault(name, []).append(value)

    def summary(self):
        return {k: sum(v) / len(v) for k, v in self.values.items()}


def setup_logging(level):
    logging.basicConfig(level=level)
    log.info("ready")


def make_data(cfg):
    return list(range(cfg["data"]["size"]))


def stage(model, data, kept, metrics):
    wrapper = engine.Wrapper(model)
    out = engine.Output(wrapper)
    for x in data:
        metrics.update("x", sum(engine.unrelated(x)))
    if kept is not None:
        kept.backward()  # an output of the previous stage, its wrapper freed
    out.backward()
    return out


def main():
    setup_logging(logging.WARNING)
    metrics = Metrics()
    data = make_data(CONFIG)
    kept = None
    for name in CONFIG["stages"]:
        kept = stage(object(), data, kept, metrics)
        print(json.dumps({"stage": name, **metrics.summary()}))
    if os.environ.get("NEVER_SET_IN_TESTS"):
        sys.exit(3)


if __name__ == "__main__":
    main()
'''


def project(tmp_path: Path, train: str = TRAIN, engine: str = ENGINE) -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "engine.py").write_text(textwrap.dedent(engine))
    (folder / "train.py").write_text(textwrap.dedent(train))
    (folder / "data.txt").write_text("a file the program may read\n")
    return folder / "train.py"


def run(args: list[str], **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, "-m", "tools.minimize", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, **kw)
    # what the first run of a process sweeps (files of another test's run that was killed, e.g. by
    # its hang guard) is said on stderr, and is not this program's answer
    proc.stderr = "".join(line for line in proc.stderr.splitlines(keepends=True)
                          if not line.startswith("[sweep] "))
    return proc


# every reduction here ends by launches (its whole reduction takes about 150), however busy the
# machine: a clock never decides what a test sees, and no hang guard trips on a slow machine
MAX_RUNS = "400"


def quick(script: Path, out: Path, *extra: str) -> list[str]:
    return [str(script), "--signature", SIGNATURE, "--python", sys.executable, "--fresh-process",
            "--out", str(out), "--max-runs", MAX_RUNS, *extra]


def lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def shows(path: Path, cwd: Path) -> str:
    proc = subprocess.run([sys.executable, str(path)], cwd=cwd, capture_output=True, text=True, timeout=60)
    return proc.stdout + proc.stderr


# -- end to end on a pure-Python project ---------------------------------------------------

KEPT = "def setup_logging(level):  # minimize: keep"


@pytest.fixture(scope="module")
def reduced(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """One whole reduction (a few hundred candidates), shared by the tests that read it."""
    tmp = tmp_path_factory.mktemp("reduced")
    script = project(tmp, train=TRAIN.replace("def setup_logging(level):", KEPT))
    out = tmp / "out"
    return script, out, run(quick(script, out))


def test_shrinks_the_script_and_its_local_module_and_keeps_the_signature(reduced):
    script, out, proc = reduced
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    minimized = out / "minimized"
    assert lines(minimized / "train.py") <= lines(script) // 2
    assert lines(minimized / "engine.py") < lines(script.parent / "engine.py")  # reduced with it
    # the result stands on its own, next to the user's other files
    (minimized / "data.txt").write_text("")
    assert SIGNATURE in shows(minimized / "train.py", minimized)
    assert (out / "minimized.py").read_text() == (minimized / "train.py").read_text()
    assert "-    for x in data:" in (out / "minimized.diff").read_text()
    report = (out / "report.md").read_text()
    assert "signature in 3 of 3 fresh runs" in report
    assert "`AttributeError` in `engine.py` (`backward`)" in report
    assert "[minimize] test" in proc.stdout  # progress


def test_kept_statements_survive_unchanged(reduced):
    _, out, _ = reduced
    assert "def setup_logging(level):\n    logging.basicConfig(level=level)\n    log.info('ready')" \
        in (out / "best" / "train.py").read_text()


CHECKED = textwrap.dedent("""
    def grads(model):
        return [p for p in model if p]

    def stuck(model, before):
        return [name for name, p in zip(before, grads(model)) if p == before[name]]

    def unrelated():
        return 1

    model, before = [1, 2], {"a": 1, "b": 3}
    left = stuck(model, before)  # minimize: keep
    if left:  # minimize: keep
        raise RuntimeError(f"never trained: {left}")  # minimize: keep
""")


def test_what_a_marked_statement_calls_is_kept_whole():
    # a reduction once emptied the function a marked line called (``stuck`` -> ``return [name
    # for name in before]``): the marked raise then fired without the bug
    kept = {"a.py": m_source.kept_statements(CHECKED)}
    assert len(kept["a.py"]) == 5  # the three marked, ``stuck`` and, through it, ``grads``
    hollow = CHECKED.replace("[name for name, p in zip(before, grads(model)) if p == before[name]]",
                             "[name for name in before]")
    inner = CHECKED.replace("[p for p in model if p]", "model")
    for candidate in (hollow, inner):
        assert candidate != CHECKED
        assert m_source.missing_kept({"a.py": candidate}, kept).startswith("a statement marked")
    free = CHECKED.replace("def unrelated():\n    return 1\n", "")
    assert m_source.missing_kept({"a.py": free}, kept) is None


def test_a_rerun_of_a_finished_reduction_only_confirms(reduced, tmp_path):
    script, out, _ = reduced
    proc = run(quick(script, out))
    assert proc.returncode == 0
    assert "[minimize] resuming from" in proc.stdout
    report = (out / "report.md").read_text()
    assert int(report.split("- Reduction: ")[1].split(" launches")[0]) == 3  # the confirmation runs


def test_never_trades_the_bug_for_another_error(tmp_path):
    # Dropping `del wrapper` gives a shorter program that fails too, with "backward through the
    # graph a second time": a reducer driven by "any error" takes it; this one must not.
    train = '''
    import engine


    def main():
        wrapper = engine.Wrapper(None)
        out = engine.Output(wrapper)
        out.backward()
        del wrapper
        out.backward()


    main()
    '''
    script = project(tmp_path, train=train)
    assert SIGNATURE in shows(script, script.parent)
    out = tmp_path / "out"
    proc = run(quick(script, out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = (out / "minimized.py").read_text()
    assert "del wrapper" in result
    assert SIGNATURE in shows(out / "minimized" / "train.py", out / "minimized")
    # the candidate itself, judged: refused (whether the reduction's path tried it depends on
    # what went before it)
    cfg = m_options.parse_args(quick(script, tmp_path / "judge"))
    original = m_source.project_files(script)
    oracle = m_oracle.Oracle(cfg, original, State(tmp_path / "judge" / "state.json"), log=lambda msg: None)
    oracle.check_original()
    other = {**original, "train.py": original["train.py"].replace("    del wrapper\n", "")}
    assert OTHER in shows_source(other, tmp_path / "other")
    assert oracle(other) is False
    assert "skip (RuntimeError)" in oracle.stats.outcomes


def test_the_same_message_raised_elsewhere_is_not_the_bug(tmp_path):
    # A candidate that fails with the very same message from another function (engine.probe)
    # prints the signature: the crash site (AttributeError in engine.py, backward) refuses it.
    engine = ENGINE + "\n\ndef probe():\n    return None.reducer\n"
    script = project(tmp_path, engine=engine)
    cfg = m_options.parse_args(quick(script, tmp_path / "out"))
    original = m_source.project_files(script)
    oracle = m_oracle.Oracle(cfg, original, State(tmp_path / "out" / "state.json"), log=lambda msg: None)
    oracle.check_original()
    assert oracle.site == ("AttributeError", "engine.py", "backward")
    elsewhere = {**original, "train.py": "import engine\nengine.probe()\n"}
    assert SIGNATURE in shows_source(elsewhere, tmp_path / "elsewhere")
    assert oracle(elsewhere) is False
    assert any(kind.startswith("the signature raised elsewhere") for kind in oracle.stats.outcomes)
    same_place = {**original, "train.py": TRAIN.replace("    out.backward()\n", "")}
    assert oracle(same_place) is True  # still the bug, where it was


def test_a_candidate_that_shows_the_bug_much_slower_is_refused(tmp_path):
    # Without ``steps = 1`` the program still fails the same way, but only after 15 s: like a
    # training program without its max_epochs, every later launch would pay for it.
    train = """
    import time
    import engine

    steps = 300
    steps = 1
    time.sleep(steps * 0.05)
    wrapper = engine.Wrapper(None)
    out = engine.Output(wrapper)
    del wrapper
    out.backward()
    """
    script = project(tmp_path, train=train)
    cfg = m_options.parse_args(quick(script, tmp_path / "out"))
    original = m_source.project_files(script)
    oracle = m_oracle.Oracle(cfg, original, State(tmp_path / "out" / "state.json"), log=lambda msg: None)
    oracle.check_original()
    assert oracle.slow < 15  # (the original may take up to 10 s on a busy machine)
    fast = {**original, "train.py": original["train.py"].replace("steps = 300\n", "")}
    assert oracle(fast) is True
    slow = {**original, "train.py": original["train.py"].replace("steps = 1\n", "")}
    assert oracle(slow) is False
    assert any(kind.startswith("slower") for kind in oracle.stats.outcomes), oracle.stats.outcomes


def shows_source(files: dict, folder: Path) -> str:
    folder.mkdir()
    for name, source in files.items():
        (folder / name).write_text(source)
    return shows(folder / "train.py", folder)


def test_budget_end_leaves_the_best_so_far_and_the_next_run_resumes(tmp_path):
    script = project(tmp_path)
    out = tmp_path / "out"
    sizes, known = [], []
    for _ in range(3):
        proc = run(quick(script, out, "--max-runs", "3"))  # three launches each, on any machine
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "the budget was spent" in (out / "report.md").read_text()
        assert SIGNATURE in shows(out / "minimized" / "train.py", out / "minimized")
        sizes.append(m_source.size({"t": (out / "best" / "train.py").read_text()}))
        known.append(len(json.loads((out / "state.json").read_text())))
    assert "run 1/1" not in proc.stdout  # the original's verdict came from the state
    assert sizes[2] <= sizes[1] <= sizes[0] <= m_source.size({"t": script.read_text()})  # never back up
    assert known[0] < known[1] < known[2]  # each run judged candidates the earlier ones had not


def test_a_passed_deadline_ends_the_reduction_before_the_next_launch(tmp_path):
    script = project(tmp_path)
    cfg = m_options.parse_args(quick(script, tmp_path / "out"))
    original = m_source.project_files(script)
    oracle = m_oracle.Oracle(cfg, original, State(tmp_path / "out" / "state.json"), log=lambda msg: None)
    oracle.check_original()
    launched = oracle.stats.tests
    smaller = {**original, "train.py": original["train.py"].replace("import json\n", "")}
    oracle.deadline = time.monotonic() - 1
    with pytest.raises(m_options.BudgetSpent):
        oracle(smaller)
    assert oracle.stats.tests == launched
    assert m_search.reduce(oracle, original) == "the budget was spent"


def test_the_whole_program_passes_run_again_after_the_reducer_improved(tmp_path, monkeypatch, capsys):
    """Restarts after every 3 improvements: the simplifying passes run again from the best so far
    (a function inlined once the reducer has removed its other caller), and the result still
    shows the bug."""
    script = project(tmp_path, train=TRAIN.replace(
        "def main():", "def report(metrics):\n    print(json.dumps(metrics.summary()))\n\n\ndef main():\n"
        "    report(Metrics())").replace("print(json.dumps({\"stage\": name, **metrics.summary()}))",
                                       "report(metrics)"))
    monkeypatch.setattr(m_search, "RESTART_AFTER", 3)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "out"
    assert m.main(quick(script, out)) == 0
    log = capsys.readouterr().out
    assert "3 shrinks since the whole-program passes ran: running them again" in log
    result = (out / "minimized" / "train.py").read_text()
    assert SIGNATURE in shows(out / "minimized" / "train.py", out / "minimized")
    assert "def report" not in result and "def main" not in result  # inlined, or gone


def test_the_remedy_is_refused_at_the_start(tmp_path):
    script = project(tmp_path, train=TRAIN.replace("kept.backward()  #", "pass  #"))
    proc = run(quick(script, tmp_path / "out"))
    assert proc.returncode == 2
    assert "train.py is not bad" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_signature_the_script_can_print_needs_keep_markers(tmp_path):
    train = TRAIN.replace("    main()\n", f"    main()\n    print({SIGNATURE!r})\n")
    script = project(tmp_path, train=train)
    proc = run(quick(script, tmp_path / "out"))
    assert proc.returncode == 2
    assert "could print the signature itself (train.py, line" in proc.stderr


HOLD = """def main():
    best = os.environ.get("HOLD_BEST", "")  # minimize: keep
    saved = json.load(open(best))["train.py"] if os.path.exists(best) else None  # minimize: keep
    if saved and saved != open(os.environ["HOLD_ORIGINAL"]).read():  # minimize: keep
        __import__("time").sleep(600)
"""


WAIT_FOR_GO = """def main():
    while not os.path.exists(os.environ.get("HOLD_GO", "/")):  # minimize: keep
        __import__("time").sleep(0.05)
"""


def test_an_interrupt_while_a_candidates_folder_is_made_leaves_no_folder(tmp_path, monkeypatch, capsys):
    """The interrupt comes after the script is written into the run's folder, before its local
    module is (seen once in a fresh-clone run of the signal test below: a folder was left)."""
    script = project(tmp_path)
    out = tmp_path / "out"
    write_text = Path.write_text

    def interrupted(path, *args, **kwargs):
        if path.name == "engine.py" and (out / "work") in path.parents:
            raise KeyboardInterrupt
        return write_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", interrupted)
    assert m.main(quick(script, out)) == 130
    assert (out / "work").is_dir() and not any((out / "work").iterdir())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_as_the_best_is_saved_lands_after_both_of_its_writes(tmp_path, monkeypatch, sig):
    """best.json (what a resume reads) and best/ (what the interrupt's message points at) agree:
    a signal that comes between the two writes waits for the second (seen in a warm run of the
    signal test below, which sends its signal as soon as best.json shows an improvement)."""
    from tools.core import results

    real = results.write_json

    def written_then_interrupted(path, data):
        real(path, data)
        os.kill(os.getpid(), sig)

    monkeypatch.setattr(results, "write_json", written_then_interrupted)
    # the handlers of `python -m tools.minimize` (contract.run_main)
    handler = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: contract._terminate}[sig]
    before = signal.signal(sig, handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            m_oracle.save_best(tmp_path, {"train.py": "print(1)\n", "engine.py": None})
    finally:
        signal.signal(sig, before)
    assert json.loads((tmp_path / "best.json").read_text())["train.py"] == "print(1)\n"
    assert (tmp_path / "best" / "train.py").read_text() == "print(1)\n"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_keeps_the_best_so_far_and_the_same_command_resumes(tmp_path, sig):
    # once a first improvement is saved, every candidate that follows waits (until its time limit)
    # instead of running: the reduction cannot end before the signal comes, however fast it is
    train = TRAIN.replace("def main():\n", HOLD)
    script = project(tmp_path, train=train)
    original = tmp_path / "original.py"
    original.write_text(script.read_text())
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "HOLD_BEST": str(out / "best.json"), "HOLD_ORIGINAL": str(original)}
    logs = tmp_path / "stdout", tmp_path / "stderr"  # files: a pipe would wait for any helper holding it
    with open(logs[0], "w") as out_log, open(logs[1], "w") as err_log:
        proc = subprocess.Popen([sys.executable, "-m", "tools.minimize", *quick(script, out)], cwd=ROOT,
                                env=env, stdout=out_log, stderr=err_log, text=True)
    original = m_source.size({"t": script.read_text()})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the first improvement is saved
        time.sleep(0.2)
        saved = json.loads((out / "best.json").read_text()) if (out / "best.json").exists() else None
        if saved and m_source.size({"t": saved["train.py"]}) < original:
            break
    proc.send_signal(sig)
    proc.wait(timeout=60)
    stdout, stderr = (path.read_text() for path in logs)
    assert proc.returncode == 130, stderr
    assert "the same command resumes from it" in stdout
    assert not any((out / "work").iterdir())  # no candidate folder left behind
    best = out / "best" / "train.py"
    assert m_source.size({"t": best.read_text()}) < original
    assert SIGNATURE in shows(best, out / "best")
    again = run(quick(script, out, "--budget", "0.01"))
    assert f"[minimize] resuming from {out / 'best'}" in again.stdout


def test_a_fresh_confirmation_gets_the_originals_limit_not_the_forks(tmp_path, monkeypatch, capsys):
    """The candidates' limit comes from the original's runs as forks of the preloaded runner; a
    fresh run also starts its interpreter and imports. Under the candidates' limit a result that
    shows the bug timed out in its fresh confirmation, and the reduction failed (seen on a busy
    machine with the real #20706 program): here a fresh interpreter takes a few seconds longer."""
    train = TRAIN.replace("\ndef main():\n", (
        "\nif 'torch' not in sys.modules:  # minimize: keep\n"
        "    __import__('time').sleep(4)  # a fresh interpreter: what a fork has imported already\n"
        "\n\ndef main():\n"), 1)
    assert "minimize: keep" in train
    script = project(tmp_path, train=train)
    # 2 s, however long the original's forks took on this machine (a busy one included)
    monkeypatch.setattr(m_oracle, "CANDIDATE_TIMEOUT", (0, 2.0))  # where the oracle reads it
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "out"
    code = m.main([str(script), "--signature", SIGNATURE, "--python", sys.executable, "--out", str(out),
                   "--max-runs", "3", "--confirm", "1"])
    log = capsys.readouterr().out
    assert "each limited to 2 s" in log  # the forks' limit
    assert code == 0, log[-2000:]
    assert "signature in 1 of 1 fresh runs" in (out / "report.md").read_text()


@pytest.mark.parametrize(("args", "message"), [
    (["missing.py", "--signature", "x"], "missing.py: not found"),
    (["--script", "missing.py", "--signature", "x"], "missing.py: not found"),  # every session's name
    (["--signature", "x"], "no script"),
    (["tests", "--signature", "x"], "a directory, not a script"),
    (["README.md", "--signature", "x"], "not a .py file"),
    (["tests/test_minimize.py"], "give --signature REGEX"),
    (["tests/test_minimize.py", "--signature", "("], "is not a valid regex"),
    (["tests/test_minimize.py", "--signature", "x", "--trials", "0"], "--trials takes a number"),
    (["tests/test_minimize.py", "--signature", "x", "--cell", "pl0_0_torch0"], "unknown cell 'pl0_0_torch0'"),
    (["tests/test_minimize.py", "--signature", "x", "--python", "/nonexistent/python"], "not an executable"),
    (["tests/test_minimize.py", "--signature", "x", "--budget", "0"], "--budget must be > 0"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    proc = run(args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_an_out_folder_of_another_script_is_refused(tmp_path):
    script = project(tmp_path)
    out = tmp_path / "out"
    (out).mkdir()
    (out / "original.json").write_text('{"sha256": "0"}')
    proc = run(quick(script, out))
    assert proc.returncode == 2
    assert "holds the reduction of another script" in proc.stderr


def test_a_second_run_on_the_same_out_folder_is_refused_while_the_first_goes_on(tmp_path):
    # the first run's launches wait for a file the test makes only once the second was refused:
    # the first cannot have ended (and freed the folder) before, however fast it is
    train = TRAIN.replace("def main():\n", WAIT_FOR_GO)
    script = project(tmp_path, train=train)
    out = tmp_path / "out"
    go = tmp_path / "go"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "HOLD_GO": str(go)}
    with open(tmp_path / "first.log", "w") as log:
        args = quick(script, out, "--budget", "0.2")
        first = subprocess.Popen([sys.executable, "-m", "tools.minimize", *args], cwd=ROOT, env=env,
                                 stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (out / "original.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # written once the first run holds the folder
        second = run(quick(script, out))
        go.write_text("")
        assert second.returncode == 2, second.stderr
        assert "is being reduced by another run now" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
        assert first.poll() is None  # it was waiting for the file, holding the folder
        assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()
    finally:
        first.kill()
    assert SIGNATURE in shows(out / "minimized" / "train.py", out / "minimized")
    assert run(quick(script, out, "--budget", "0.01")).returncode == 0  # free again afterwards


def test_an_out_folder_that_cannot_be_written_is_one_line_and_exit_2(tmp_path):
    script = project(tmp_path)
    out = tmp_path / "out"
    (out / ".running").mkdir(parents=True)  # where the run's lock goes (root may write anywhere)
    proc = run(quick(script, out))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: --out {out}: cannot write there (Is a directory)"]


# -- the pieces ------------------------------------------------------------------------------

TRACEBACK = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/home/alice/proj/train.py", line 9, in <module>
[rank1]:     main()
[rank1]:   File "/env/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 270, in backward
[rank1]:     reducer = ddp_weakref.reducer
[rank1]:               ^^^^^^^^^^^^^^^^^^^
[rank1]: AttributeError: 'NoneType' object has no attribute 'reducer'
"""


def test_crash_site_reads_rank_prefixed_tracebacks():
    assert m_source.crash_site(TRACEBACK, SIGNATURE, ("/home/alice/proj",)) == (
        "AttributeError", "torch/nn/parallel/distributed.py", "backward")
    own = TRACEBACK.replace("/env/lib/python3.11/site-packages/torch/nn/parallel/distributed.py",
                            "/home/alice/proj/train.py")
    crash_site = m_source.crash_site
    assert crash_site(own, SIGNATURE, ("/home/alice/proj",)) == ("AttributeError", "train.py", "backward")
    assert crash_site("printed: 'NoneType' object has no attribute 'reducer'\n", SIGNATURE, ()) is None


def test_static_checks_reject_without_a_launch():
    original = "import os\nx = os.getcwd()\nprint(x, undefined_in_original)\n"
    known = {"a.py": (m_source.unbound_names(original), m_source.constants(original), set())}
    assert m_source.unbound_names(original) == {"undefined_in_original"}
    assert m_source.static_rejection({"a.py": original}, "a.py", {}, known) is None
    assert "bound nowhere: os" in m_source.static_rejection({"a.py": "x = os.getcwd()\n"}, "a.py", {}, known)
    assert "changed value" in m_source.static_rejection({"a.py": original.replace("x = ", "x = 'ab' or ")},
                                                 "a.py", {}, known)
    assert m_source.static_rejection({"a.py": None}, "a.py", {}, known) == "the script itself is gone"
    kept = {"a.py": m_source.kept_statements("import os  # minimize: keep\nx = 1\n")}
    assert m_source.static_rejection({"a.py": "x = 1\n"}, "a.py", kept,
                              {"a.py": (set(), {(int, 1)}, set())}).startswith("a statement marked")


# -- the real thing --------------------------------------------------------------------------

FIXTURES = ROOT / "tests" / "fixtures" / "minimize"


@pytest.mark.ddp
@pytest.mark.timeout(900)
def test_a_real_bloated_ddp_program_shrinks_and_the_remedy_is_refused(tmp_path):
    """The #20706 fixture on real torch and Lightning (two ranks, two stages, a hydra-style config),
    candidates as forks of the preloaded runner, for a budget of a few launches (it ends at the
    same point on any machine, however busy): what it reached still shows the signature, raised
    in torch's DDP backward, in a fresh run."""
    script = FIXTURES / "two_stage_anchor.py"
    out = tmp_path / "out"
    args = [str(script), "--signature", SIGNATURE, "--python", sys.executable, "--out", str(out),
            "--max-runs", "3", "--confirm", "1"]
    proc = run(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = (out / "report.md").read_text()
    assert "`AttributeError` in `torch/nn/parallel/distributed.py`" in report
    assert "signature in 1 of 1 fresh runs" in report
    # tokens, not lines: ruff's formatting of what is left may take more lines than the original
    size = m_source.size
    assert size({"t": (out / "minimized.py").read_text()})[1] < size({"t": script.read_text()})[1]
    control = run([*args, "--out", str(tmp_path / "control"), "--", "anchor.detach=true"])
    assert control.returncode == 2, control.stdout[-2000:] + control.stderr[-2000:]
    assert "two_stage_anchor.py is not bad" in control.stderr


def test_calls_that_cannot_bind_are_found_and_only_new_ones_count():
    source = textwrap.dedent('''
        def f(a, b, c=1, *, d, e=2): pass
        class K:
            def __init__(self, x, y=0): pass
        f(1, 2, d=3)
        f(1, d=3, b=2)
        K(1)
        f(*[1, 2], d=3)
    ''')
    assert m_source.call_mismatches(source) == set()
    for bad in ("f(1, d=3)", "f(1, 2, 3, 4, d=1)", "f(1, 2)", "f(1, 2, d=1, z=2)", "K()", "K(1, 2, 3)"):
        assert m_source.call_mismatches(source + bad + "\n") == {bad[0]}, bad
    assert m_source.call_mismatches(source + "f = print\nf()\n") == set()  # rebound: not that def
    known = {"a.py": (set(), m_source.constants(source), {"K"})}
    assert m_source.static_rejection({"a.py": source + "K()\n"}, "a.py", {}, known) is None
    why = m_source.static_rejection({"a.py": source + "f()\n"}, "a.py", {}, known)
    assert "a call with arguments its function cannot take (f())" in why


def test_the_coarse_pass_admits_only_whole_statement_removals():
    current = {"a.py": textwrap.dedent('''
        import os
        def f(x, y=1):
            z = x + y
            if z:
                print(z)
            return z
        class K:
            def m(self):
                return f(1)
        f(2)
    ''')}
    removed = {"a.py": current["a.py"].replace("class K:\n    def m(self):\n        return f(1)\n", "")}
    emptied = {"a.py": current["a.py"].replace("        print(z)\n", "        pass\n")}
    assert m_source.only_removes_statements(removed, current)
    assert m_source.only_removes_statements(emptied, current)
    changes = {"z = x + y": "z = x", "def f(x, y=1):": "def f(x):", "f(2)": "f(3)", "return z": "return 0"}
    for old, new in changes.items():
        assert not m_source.only_removes_statements({"a.py": current["a.py"].replace(old, new)}, current), new


@pytest.mark.parametrize("full_at", ["original.json", "best.json"])
def test_a_full_disk_under_out_is_one_line_never_a_traceback(tmp_path, monkeypatch, capsys, full_at):
    # before anything was reduced it is bad input (exit 2); once the reduction has begun it is a
    # harness failure (128) that says where the best so far is
    import errno

    from tools.core import results

    script = project(tmp_path)
    out = tmp_path / "out"
    real = results.write_json

    def full(path, data):
        if Path(path).name == full_at and (full_at != "best.json" or (out / "best.json").exists()):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(results, "write_json", full)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    code = m.main(quick(script, out))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0], err
    assert code == (2 if full_at == "original.json" else 128)


@pytest.mark.parametrize("statement", [
    f"sys.stdout.buffer.write({SIGNATURE.encode()!r})",  # a bytes literal
    "name = 'reducer'\nprint(f\"'NoneType' object has no attribute '{name}'\")",  # an f-string
    "print(\"'NoneType' object has no \" + 'attribute ' + \"'reducer'\")",  # a concatenation
    "print(\"'NoneType' object has no attribute '%s'\" % 'reducer')",  # %-formatting
])
def test_a_signature_the_script_can_print_in_any_literal_form_needs_keep_markers(tmp_path, statement):
    # a bytes literal once went through: the reduction then kept the print line, failing with a
    # TypeError whose traceback quoted it, and called that "the signature in 3/3 fresh runs"
    train = TRAIN.replace("    main()\n", "    main()\n" + textwrap.indent(statement, "    ") + "\n")
    script = project(tmp_path, train=train)
    proc = run(quick(script, tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert "could print the signature itself (train.py, line" in proc.stderr


def test_a_traceback_quoting_a_line_with_the_signature_is_not_the_signature():
    quoted = (f'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n'
              f'    sys.stdout.write({SIGNATURE.encode()!r})\n'
              "TypeError: write() argument must be str, not bytes\n")
    assert SIGNATURE not in m_source.outside_source_lines(quoted)
    raised = (f'Traceback (most recent call last):\n  File "engine.py", line 9, in backward\n'
              f"    reducer = self.wrapper().reducer\nAttributeError: {SIGNATURE}\n")
    assert f"AttributeError: {SIGNATURE}" in m_source.outside_source_lines(raised)
    assert m_source.crash_site(quoted, re.escape(SIGNATURE), ()) is None  # not raised anywhere


def test_the_cheap_passes_run_once_more_whatever_the_budget_and_the_counts_agree(tmp_path):
    # a budget spent at once: a configuration nothing reads, a flag nothing uses and a comparison
    # of two literals must still go before the result is written; the progress line and the
    # report count its lines the same way
    train = TRAIN.replace('log = logging.getLogger("train")\n', 'log = logging.getLogger("train")\n'
                          'SETTINGS = {"epochs": 3, "stages": ["a", "b"], "notes": {"x": 1}}\n'
                          'REMEDY = False\n').replace(
        "    for name in CONFIG[\"stages\"]:\n", "    if \"train\" == \"train\":\n        pass\n"
        "    for name in CONFIG[\"stages\"]:\n")
    script = project(tmp_path, train=train)
    out = tmp_path / "out"
    proc = run(quick(script, out, "--budget", "0.001"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = (out / "minimized.py").read_text()
    assert "SETTINGS" not in result and "REMEDY" not in result and '"train" == "train"' not in result
    assert "[minimize] last clean-up:" in proc.stdout
    best = re.findall(r"\| best (\d+) lines", proc.stdout)[-1]
    report = (out / "report.md").read_text()
    assert best == re.search(r"\| minimized \| (\d+) \|", report).group(1)
    of = re.findall(r"\(of (\d+), (\d+)\)", proc.stdout)[-1]
    assert of == re.search(r"\| original \| (\d+) \| (\d+) \|", report).groups()  # the original too


# -- a control: where the bug is fixed ------------------------------------------------------

STEP_ENGINE = '''
"""Stands for the library: its step skips a layer that was unfrozen after it began (the bug),
unless ENGINE_FIXED=1 (the fix)."""
import os


class Layer:
    def __init__(self):
        self.weight = 1.0
        self.trainable = False


def step(layer, lr):
    if layer.trainable and os.environ.get("ENGINE_FIXED") == "1":
        layer.weight -= lr


def verify(layer, before):
    if layer.weight == before:  # minimize: keep
        raise AssertionError("the unfrozen layer did not move")  # minimize: keep
'''

STEP_TRAIN = '''
"""Trains a layer frozen for an epoch, then unfrozen; it checks a symptom (the layer moved)."""
import json

import engine

CONFIG = {"lr": 0.5, "epochs": 3, "unfreeze_at": 1, "name": "two-phase"}


def log_epoch(epoch, layer):
    print(json.dumps({"epoch": epoch, "weight": layer.weight, "run": CONFIG["name"]}))


def main():
    layer = engine.Layer()
    before = None
    for epoch in range(CONFIG["epochs"]):
        if epoch == CONFIG["unfreeze_at"]:
            layer.trainable = True
            before = layer.weight
        engine.step(layer, CONFIG["lr"])
        log_epoch(epoch, layer)
    engine.verify(layer, before)


if __name__ == "__main__":
    main()
'''


@pytest.mark.timeout(1200)  # a hang guard: two reductions bounded by launches, on a busy machine
def test_a_control_where_the_bug_is_fixed_keeps_the_reduction_from_faking_the_symptom(tmp_path):
    # the check tests a symptom: without a control the reducer drops the training step (the
    # layer then never moves, fix or no fix); with one, a candidate must also be good where the
    # fix is on, so the step and the library's code path that the fix changes stay
    results = {}
    for name, extra in (("plain", ()), ("control", ("--control-env", "ENGINE_FIXED=1"))):
        (tmp_path / name).mkdir()
        script = project(tmp_path / name, train=STEP_TRAIN, engine=STEP_ENGINE)
        out = tmp_path / name / "out"
        proc = run([str(script), "--signature", "the unfrozen layer did not move", "--python",
                    sys.executable, "--fresh-process", "--out", str(out), "--confirm", "1",
                    "--max-runs", MAX_RUNS, *extra])
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        results[name] = [(out / f).read_text() for f in ("minimized/train.py", "minimized/engine.py",
                                                          "report.md")]
    assert "engine.step(" not in results["plain"][0]  # a false repro: what the control is for
    train, engine, report = results["control"]
    assert "engine.step(" in train and "ENGINE_FIXED" in engine, train + engine
    assert "where the bug is fixed, it is good in a fresh run" in report
    assert "not good on the control" in report  # candidates were refused for it


@pytest.mark.parametrize("extra, why", [
    (("--control-env", "UNRELATED=1"), "is not good on the control"),  # the bug is still there
    (("--control-env", "ENGINE_FIXED"), "give NAME=VALUE"),
    (("--control-cell", "no-such-cell"), "unknown cell 'no-such-cell'"),
])
def test_a_control_that_does_not_fix_the_bug_or_cannot_be_made_is_bad_input(tmp_path, extra, why):
    script = project(tmp_path, train=STEP_TRAIN, engine=STEP_ENGINE)
    proc = run([str(script), "--signature", "the unfrozen layer did not move", "--python", sys.executable,
                "--fresh-process", "--out", str(tmp_path / "out"), "--max-runs", MAX_RUNS, *extra])
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert why in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.timeout(1800)  # a hang guard: two bounded reductions of a real program, on a busy machine
def test_the_series_patch_as_the_control_on_a_real_program(tmp_path, monkeypatch):
    """Real Lightning: the equal-params finetuning program is bad as installed and good with the
    series' fix applied to a copy; a patch that fixes something else is refused as the control."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the program makes its own folder there
    script = FIXTURES / "fusion_phases.py"
    args = [str(script), "--signature", "unfrozen but never trained", "--python", sys.executable,
            "--max-runs", "2", "--confirm", "1"]
    proc = run([*args, "--out", str(tmp_path / "fixed"), "--control-patch",
                "lightning-finetuning-equal-params.patch"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "good on the control" in proc.stdout
    report = (tmp_path / "fixed" / "report.md").read_text()
    assert "where the bug is fixed, it is good in a fresh run" in report
    copy = tmp_path / "fixed" / "control" / "pytorch_lightning" / "callbacks" / "finetuning.py"
    assert "id(p)" in copy.read_text()  # the fix, in the copy only
    other = run([*args, "--out", str(tmp_path / "other"), "--control-patch",
                 "lightning-last-batch-resume.patch"])
    assert other.returncode == 2, other.stdout[-2000:] + other.stderr[-2000:]
    assert "fusion_phases.py is not good on the control" in other.stderr


@pytest.mark.parametrize("name, why", [
    ("no-such.patch", "no patch 'no-such.patch' in the series"),
    ("torch-ddpsink-freed-module-error.patch", "a torch patch"),
])
def test_a_control_patch_that_is_not_a_lightning_patch_of_the_series_is_bad_input(tmp_path, name, why):
    script = project(tmp_path, train=STEP_TRAIN, engine=STEP_ENGINE)
    proc = run([str(script), "--signature", "the unfrozen layer did not move", "--python", sys.executable,
                "--fresh-process", "--out", str(tmp_path / "out"), "--control-patch", name])
    assert proc.returncode == 2 and why in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
