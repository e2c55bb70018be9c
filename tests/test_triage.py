"""``nox -s triage``: reading an issue (fixtures in tests/fixtures/issues, written for these
tests in the structure of Lightning's bug form), the static check, the CPU port, the sandbox,
the URL path through a local HTTP server with the API's JSON shape, and one real triage of a
two-rank DDP script."""

import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tools import triage
from tools.core import contract
from tools.launch import sandbox
from tools.launch.launcher import Launcher, Run

ROOT = Path(__file__).resolve().parent.parent
ISSUES = ROOT / "tests" / "fixtures" / "issues"


def issue(name: str) -> triage.read.Issue:
    return triage.read.read_issue(str(ISSUES / name))


# -- reading ----------------------------------------------------------------------------------

def test_the_forms_sections_script_versions_and_drift_are_read():
    i = issue("drift_after_unfreeze.md")
    assert i.title == "Ranks disagree after the backbone starts training"
    assert set(triage.read.FORM) <= set(triage.read.sections(i.body))
    script = triage.read.pick_script(triage.read.code_blocks(i.body))
    assert script.problem is None and script.origin == [(16, 26)]
    assert script.code.splitlines()[0] == "import torch"  # the reporter's text, as pasted
    said = triage.read.stated_versions(i)
    assert (said["lightning"], said["torch"]) == ("2.5.0", "2.13.0")
    assert triage.read.tracebacks(i.body) == []
    assert triage.signatures.DRIFT.search(i.body)


def test_a_module_then_a_main_in_two_blocks_are_joined_in_order():
    i = issue("two_blocks.md")
    script = triage.read.pick_script(triage.read.code_blocks(i.body))
    assert len(script.origin) == 2
    assert script.code.index("class Net") < script.code.index('if __name__ == "__main__":')


def test_the_signature_is_the_reported_exception_never_generic():
    (tb,) = triage.read.tracebacks(issue("traceback_only.md").body)
    cls, message = triage.read.exception_line(tb)  # through the [rank5]: prefixes
    assert (cls, message) == ("AttributeError", "'NoneType' object has no attribute 'reducer'")
    signature = triage.signatures.derive_signature(cls, message)
    assert re.search(signature, "AttributeError: 'NoneType' object has no attribute 'reducer'")
    assert not re.search(signature, "AttributeError: 'NoneType' object has no attribute 'module'")
    assert not re.search(signature, "RuntimeError: 'NoneType' object has no attribute 'reducer'")
    (tb,) = triage.read.tracebacks(issue("two_blocks.md").body)
    signature = triage.signatures.derive_signature(*triage.read.exception_line(tb))
    assert re.search(signature, "AssertionError: step is 7 at 0x1b2c, expected 10")  # numbers, addresses


def test_an_assertion_in_the_users_code_is_located_by_function_not_by_path():
    (tb,) = triage.read.tracebacks(issue("two_blocks.md").body)
    signature = triage.signatures.derive_signature(*triage.read.exception_line(tb))
    assert triage.signatures.report_site(tb, signature) == ("AssertionError", "(script)", "<module>")
    (tb,) = triage.read.tracebacks(issue("traceback_only.md").body)
    signature = triage.signatures.derive_signature(*triage.read.exception_line(tb))
    assert triage.signatures.report_site(tb, signature) == (
        "AttributeError", "torch:nn/parallel/distributed.py", "backward")


@pytest.mark.parametrize("text, lightning, torch", [
    ("### What version are you seeing the problem on?\n\nv2.4\n", "2.4", None),
    ("### Environment\n\n- PyTorch Lightning Version: 2.3.3\n- PyTorch Version: 2.1.2\n", "2.3.3", "2.1.2"),
    ("### Environment\n\n```\nlightning==2.5.1\ntorch==2.6.0\n```\n", "2.5.1", "2.6.0"),
    ("It broke since upgrading to 2.5.0 last week.", "2.5.0", None),
])
def test_stated_versions(text, lightning, torch):
    said = triage.read.stated_versions(triage.read.Issue("x", "x", "x", text))
    assert (said["lightning"], said["torch"]) == (lightning, torch)
    assert said["from"]


# -- running it safely ---------------------------------------------------------------------------

def test_downloads_shell_outs_built_code_and_outside_writes_are_refused():
    code = "\n".join([
        "import requests", "import subprocess", "from torchvision.datasets import MNIST",
        "MNIST('data', download=True)", "subprocess.run(['ls'])", "os.system('ls')",
        "exec(open('x').read())", "open('/etc/motd', 'w')", "shutil.rmtree('/data')",
        "Path('~/x').write_text('1')", "torch.hub.load('a', 'b')", "AutoModel.from_pretrained('bert')",
    ])
    found = triage.port.dangerous(code)
    for what in ("imports requests", "runs a command", "download=True", "string built at run time",
                 "outside the working folder", "torch.hub.load() downloads", "from_pretrained() downloads"):
        assert any(what in f for f in found), (what, found)
    assert all(f.startswith("line ") for f in found)
    benign = "import torch\nopen('/etc/hostname').read()\nopen('out.txt', 'w')\neval('1 + 1')\n"
    assert triage.port.dangerous(benign) == []


def test_the_cpu_port_changes_only_the_named_arguments_and_shows_them():
    source = (ISSUES / "two_blocks.md").read_text()
    code = triage.read.pick_script(triage.read.code_blocks(source)).code
    new, changes, diff = triage.port.cpu_port(code)
    assert changes == ["accelerator='cuda' -> 'cpu'", "precision='16-mixed' -> 'bf16-mixed'",
                       "Net().cuda() -> Net()"]  # in the order of the source
    assert ("trainer = pl.Trainer(accelerator='cpu', devices=2, strategy=\"ddp\", "
            "precision='bf16-mixed')") in new
    assert "trainer.fit(Net())" in new
    untouched = [line for line in code.splitlines() if "Trainer" not in line and "fit(" not in line]
    assert all(line in new.splitlines() for line in untouched)
    assert diff.startswith("--- reported.py\n+++ run.py\n")
    new, changes, _ = triage.port.cpu_port("import torch\ntorch.cuda.set_device(0)\n"
                                      "x = torch.ones(1).to('cuda:1')\n")
    assert new == "import torch\npass\nx = torch.ones(1).to('cpu')\n"


@pytest.mark.skipif(bool(sandbox.unavailable()), reason=str(sandbox.unavailable()))
def test_in_the_sandbox_only_loopback_answers_and_home_is_a_throwaway(tmp_path):
    tmp_path.chmod(0o755)  # the run is nobody, when the suite is root
    probe = tmp_path / "probe.py"
    marker = f"triage-sandbox-{os.getpid()}"
    probe.write_text(
        "import os, socket, pathlib\n"
        f"pathlib.Path(os.environ['HOME'], {marker!r}).write_text('written')\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); port = s.getsockname()[1]\n"
        "socket.create_connection(('127.0.0.1', port), timeout=5).close()\n"
        "print('loopback ok', os.getcwd(), os.environ['HOME'])\n"
        "try:\n"
        "    socket.create_connection(('192.0.2.1', 80), timeout=5)\n"
        "except OSError as err:\n"
        "    print('outside blocked:', err)\n"
        "    raise SystemExit(1)\n")
    r = Launcher().run(Run((str(probe),), Path(sys.executable), sandbox=True, signature="outside blocked",
                           log_stem=tmp_path / "log"))
    out = (tmp_path / "log.stdout").read_text()
    assert r.verdict == "bad", (r, out)
    assert "loopback ok" in out
    assert not (Path.home() / marker).exists()
    home = out.split("loopback ok ", 1)[1].split()[1]
    assert home != str(Path.home()) and not Path(home).exists()  # removed afterwards


# -- the triage, without runs ---------------------------------------------------------------------

def run_triage(tmp_path, *args) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "tools.triage", *args, "--out", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "REPRO_RESULTS": str(tmp_path / "results")})
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.ddp
@pytest.mark.timeout(900)
def test_a_traceback_without_a_script_is_matched_to_a_known_bug_and_its_repro_run(tmp_path):
    """The report of a #20706-like crash, with no script: its frames, the workspace's own #20706
    repro run in the stated versions (set to the newest here, whose environment is the CPU
    build), that bug's questions."""
    report = tmp_path / "crash.md"
    report.write_text((ISSUES / "traceback_only.md").read_text().replace("v2.5", "v2.6").replace(
        "Lightning Version: 2.5.0", "Lightning Version: 2.6.6").replace(
        "PyTorch Version: 2.6.0", "PyTorch Version: 2.13.0"))
    code, out, err = run_triage(tmp_path, str(report), "--trials", "1")
    assert code == 0, err[-3000:]
    comment = (tmp_path / "out" / "comment.md").read_text()
    first = comment.splitlines()[0]
    assert first.startswith("**Triage:** no runnable script in the report; 2 Lightning/torch frames")
    assert first.endswith("it matches #20706 (the workspace's repro `20706-stress`): bad 1/1 on "
                          "pytorch-lightning 2.6.6 + torch 2.13.0"), first
    assert "`torch:nn/parallel/distributed.py:263`" in comment
    assert "Questions:" in comment and "_DDPSink" in comment  # #20706's own questions
    data = json.loads((tmp_path / "out" / "triage.json").read_text())
    assert data["signature"].startswith("AttributeError: ")
    assert data["known_cell"]["versions"] == "stated"
    (row,) = data["known"]
    assert row["verdicts"] == ["bad"] and "'reducer' in" in row["reasons"][0]


@pytest.mark.parametrize("after, detail, said, listed", [
    ("skip", "killed by SIGSEGV", "it looks like #20340; inconclusive: bad before, skip after",
     ": inconclusive (the run with them could not be judged: killed by SIGSEGV)"),
    ("bad", "replicas diverged at step 12", "it looks like #20340, but the series' fix does not change it",
     ": not fixed by them (replicas diverged at step 12)"),
], ids=["could-not-be-judged", "still-bad"])
def test_only_a_bad_run_with_the_series_says_the_fix_does_not_work(tmp_path, monkeypatch, after, detail,
                                                                    said, listed):
    """The reporter's script is bad without the series. With it, every run died of a signal before
    a verdict (as torch 2.13 + gloo now and then aborts at exit): inconclusive, not "not fixed";
    that is said only when a run with the series is bad."""
    script = tmp_path / "script.py"
    script.write_text("from lightning.pytorch.callbacks import BackboneFinetuning\n")
    row = {"repro": "20340", "issue": 20340, "cell": "pl2_6_6_torch2_13_0", "patches": ["a.patch"],
           "before": "bad", "after": after, "after_detail": detail, "runs": [1, 3], "ok": False}
    monkeypatch.setattr(triage.locate, "fixed_by_series", lambda *args: dict(row))
    t = {"tracebacks": ["replicas diverged at step 12 (epoch 2): 4 of 6 parameters differ"]}
    cell = triage.runs.Cell("newest", "pytorch-lightning", "2.6.6", "2.13.0")
    status = triage.locate.known_bug(script, "pytorch-lightning", cell, None, tmp_path, t)
    assert status.startswith(f"; {said}"), status
    text = triage.comment.comment({**t, "status": "reproduced", "sandbox": "yes", "input": "x.md"})
    (line,) = [x for x in text.splitlines() if x.startswith("- #20340:")]
    assert line.endswith(f"1 run(s) without, 3 with: a run that died of a signal before a verdict was made "
                         f"again{listed}"), line


def test_a_traceback_of_a_bug_the_workspace_does_not_know_gets_the_template_questions(tmp_path):
    report = tmp_path / "other.md"
    report.write_text((ISSUES / "traceback_only.md").read_text().replace(
        "'NoneType' object has no attribute 'reducer'", "'NoneType' object has no attribute 'bucket'"))
    code, out, err = run_triage(tmp_path, str(report))
    assert code == 0, err
    comment = (tmp_path / "out" / "comment.md").read_text()
    assert comment.splitlines()[0].endswith("signature `AttributeError: ['\"]NoneType['\"]\\ object\\ "
                                            "has\\ no\\ attribute\\ ['\"]bucket['\"]`")
    assert "Questions:" in comment and "self-contained script" in comment
    assert "known" not in json.loads((tmp_path / "out" / "triage.json").read_text())
    assert not (tmp_path / "out" / "logs").exists()  # nothing ran


def test_a_script_that_downloads_is_reported_not_run(tmp_path):
    code, out, err = run_triage(tmp_path, str(ISSUES / "downloads_dataset.md"))
    assert code == 0, err
    comment = (tmp_path / "out" / "comment.md").read_text()
    assert comment.startswith("**Triage:** not run: the script could reach outside its sandbox")
    assert "MNIST(download=True) downloads a dataset" in comment
    assert not (tmp_path / "out" / "logs").exists()  # nothing ran
    assert not (tmp_path / "out" / "script.py").exists()


def test_a_paste_that_does_not_parse_cannot_run_and_says_why(tmp_path):
    code, out, err = run_triage(tmp_path, str(ISSUES / "syntax_error.md"))
    assert code == 0, err
    comment = (tmp_path / "out" / "comment.md").read_text()
    assert comment.startswith("**Triage:** cannot run the script: a syntax error at line 5")


@pytest.mark.parametrize("args, message", [
    (["no-such-issue.md"], "no-such-issue.md: neither a GitHub issue URL nor a file"),
    (["README.md", "--trials", "0"], "--trials takes a number >= 1"),
    (["README.md", "--jobs", "0"], "--jobs takes a number >= 1, or auto"),
    (["README.md", "--signature", "("], "--signature '(' is not a valid regex"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    code, out, err = run_triage(tmp_path, *args)
    assert code == 2
    assert err.strip().splitlines()[-1].startswith(f"error: {message}")


def test_a_report_with_nothing_to_run_gets_a_needs_a_repro_comment(tmp_path):
    """Every readable report gets a comment (exit 0): what is missing, the facts, the questions."""
    plain = tmp_path / "plain.md"
    plain.write_text("# Docs typo\n\n### Bug description\n\nThe word 'recieve' in the docs.\n")
    code, out, err = run_triage(tmp_path, str(plain))
    assert code == 0, err
    comment = (tmp_path / "out" / "comment.md").read_text()
    assert comment.splitlines()[0] == "**Triage:** needs a repro: the report holds no Python code"
    assert "Questions:" in comment and "self-contained script" in comment


@pytest.mark.parametrize("fixture, first", [
    ("proposed_fix_only.md", "needs a repro: the report holds no Python code (only a diff of a proposed "
                             "change)"),
    ("no_code.md", "needs a repro: the report holds no Python code; the error it quotes: `RuntimeError: "
                   "Detected mismatch between collectives on ranks`"),
])
def test_reports_without_a_program_say_what_is_missing_and_what_they_show(tmp_path, fixture, first):
    code, out, err = run_triage(tmp_path, str(ISSUES / fixture))
    assert code == 0, err
    comment = (tmp_path / "out" / "comment.md").read_text()
    assert comment.splitlines()[0] == f"**Triage:** {first}", comment.splitlines()[0]
    assert not (tmp_path / "out" / "logs").exists()  # nothing ran


def test_a_traceback_pasted_without_its_header_is_read_as_one():
    text = (ISSUES / "headerless_traceback.md").read_text()
    (tb,) = triage.read.tracebacks(text)
    said = triage.read.exception_line(tb)
    assert said == ("AttributeError", "'NoneType' object has no attribute 'reducer'")
    assert [f.label for f in triage.fingerprint.parse(tb)][-1].startswith("torch:nn/parallel/distributed.py")
    assert triage.read.tracebacks("see `File \"x.py\", line 3` in the docs") == []  # no exception after it


@pytest.mark.parametrize("text, exc", [
    ("It fails with `ValueError: the batch is empty` after a while.", ("ValueError", "the batch is empty")),
    ("Rank 1 prints RuntimeError: Timed out waiting for peers. Then it hangs.",
     ("RuntimeError", "Timed out waiting for peers")),
    ("No error, just wrong numbers.", None),
    ("It fails with **ValueError: the batch is empty** after a while.", ("ValueError", "the batch is empty")),
    ("In 2.3 this raised `ValueError: x`, now it silently passes.", None),  # a mention in passing
    ("Looks like #1234 (`KeyError: 'state_dict'`).", None),
    ("```\nValueError: inside a block is not prose\n```\n", None),
])
def test_an_exception_quoted_in_a_sentence_is_read(text, exc):
    assert triage.signatures.prose_exception(text) == exc


def test_a_snippet_without_imports_is_completed_and_run(tmp_path, monkeypatch):
    """Lightning's names used without imports, a module with no data of its own: completed
    against the release's exports, shown as a diff, run, and the verdict labelled as on a
    completed snippet."""
    from tools.stages import bisect_tiers

    monkeypatch.setattr(triage.runs, "newest_release", lambda package: "2.6.6")
    monkeypatch.setattr(triage.runs, "resolve", lambda package, version: version)
    monkeypatch.setattr(bisect_tiers, "release_env", lambda *a, **k: Path(sys.executable))
    monkeypatch.setattr(triage.sandbox, "unavailable", lambda: None)
    ran = {}

    def run_cell(cell, script, args, out, launcher, site, after=0):
        ran.setdefault("code", script.read_text())
        ran["check"] = args.check_replicas
        cell.verdicts, cell.reasons = ["bad"] * args.trials, ["replicas diverged at step 9"] * args.trials

    monkeypatch.setattr(triage.runs, "run_cell", run_cell)
    monkeypatch.setattr(triage.locate, "bisect", lambda *a, **k: None)
    monkeypatch.setattr(triage.locate, "known_bug", lambda *a, **k: "")
    t = triage.triage(triage.parse_args([str(ISSUES / "snippet_without_imports.md"), "--trials", "1",
                                         "--budget", "0", "--repo", "",
                                         "--out", str(tmp_path / "out")]))
    assert "from pytorch_lightning.callbacks import BackboneFinetuning" in ran["code"]
    assert "from pytorch_lightning import LightningModule" in ran["code"]
    # (its module has no data of its own)
    assert "trainer.fit(Finetuned(), train_dataloaders=DataLoader(RandomDataset(32, 64)" in ran["code"]
    assert "accelerator='cpu'" in ran["code"] or 'accelerator="cpu"' in ran["code"]  # then the CPU port
    assert ran["check"] == "epoch"  # "different after" the unfreeze, across ranks, no exception
    assert t["status"].startswith(triage.comment.COMPLETED + "reproduced 1/1 on"), t["status"]
    comment = (tmp_path / "out" / "comment.md").read_text()
    said = "<details><summary>Completed (assumptions: `from pytorch_lightning import LightningModule`"
    assert said in comment
    assert "+from pytorch_lightning.callbacks import BackboneFinetuning" in comment


def test_the_same_exception_in_the_reporters_own_code_counts_though_the_function_moved():
    assert triage.signatures.same_exception_in_own_code(("AssertionError", "(script)", "on_train_epoch_end"),
                                             ("AssertionError", "(script)", "check_replicas"))
    assert not triage.signatures.same_exception_in_own_code(("AssertionError", "(script)", "f"),
                                                 ("ValueError", "(script)", "f"))
    assert not triage.signatures.same_exception_in_own_code(("AttributeError", "torch:x.py:3", "backward"),
                                                 ("AttributeError", "torch:x.py:9", "backward"))


class _Api(http.server.BaseHTTPRequestHandler):
    issue = {"number": 7, "title": "A crash in DDP's backward", "html_url": "https://github.com/o/r/issues/7",
             "comments": 1, "body": (ISSUES / "traceback_only.md").read_text()}

    def do_GET(self):  # noqa: N802
        body = {"/repos/o/r/issues/7": self.issue,
                "/repos/o/r/issues/7/comments": [{"body": "Same here on 2.5.1."}]}.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(json.dumps(body or {"message": "Not Found"}).encode())

    def log_message(self, *args):
        pass


def test_an_issue_url_is_read_through_the_api_and_then_works_offline(tmp_path, monkeypatch):
    monkeypatch.setattr(triage.read, "CACHE", tmp_path / "cache")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("GITHUB_API_URL", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        i = triage.read.read_issue("https://github.com/o/r/issues/7")
    finally:
        server.shutdown()
        server.server_close()
    assert (i.id, i.title, i.url) == ("o-r-7", "A crash in DDP's backward", "https://github.com/o/r/issues/7")
    assert i.comments == ["Same here on 2.5.1."]
    with socket.socket() as s:  # a port nothing listens on: the API is gone
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("GITHUB_API_URL", f"http://127.0.0.1:{s.getsockname()[1]}")
    again = triage.read.read_issue("https://github.com/o/r/issues/7")
    assert (again.title, again.comments) == (i.title, i.comments)
    monkeypatch.setattr(triage.read, "CACHE", tmp_path / "empty")
    with pytest.raises(contract.BadInput, match="no copy is cached"):
        triage.read.read_issue("https://github.com/o/r/issues/7")


# -- one real triage ----------------------------------------------------------------------------

@pytest.mark.ddp
@pytest.mark.timeout(1500)
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
@pytest.mark.skipif(bool(sandbox.unavailable()), reason=str(sandbox.unavailable()))
def test_a_silent_divergence_report_is_reproduced_in_the_sandbox_with_the_replica_check(tmp_path):
    """The #20340-style report (a GPU script, no exception, "drift" in the text), its version
    set to the newest so one cell runs: ported to the CPU, the replica check turned on by the
    text, reproduced in the sandbox, and known as #20340: the series' fix makes it good."""
    text = (ISSUES / "drift_after_unfreeze.md").read_text().replace("v2.5", "v2.6").replace(
        "Version: 2.5.0", "Version: 2.6.6")
    report = tmp_path / "drift.md"
    report.write_text(text)
    code, out, err = run_triage(tmp_path, str(report), "--trials", "1", "--no-bisect",
                                "--budget", "0", "--repo", "")  # no master cell
    assert code == 0, err[-3000:]
    data = json.loads((tmp_path / "out" / "triage.json").read_text())
    assert data["check_replicas"] == "epoch" and data["signature"] is None
    assert data["port_changes"] == ["batch[0].cuda() -> batch[0]", "accelerator='gpu' -> 'cpu'"]
    (cell,) = data["cells"]
    assert (cell["lightning"], cell["torch"], cell["verdicts"]) == ("2.6.6", "2.13.0", ["bad"]), cell
    assert cell["reasons"][0].startswith("replicas diverged at step 12 (epoch 2)")
    comment = (tmp_path / "out" / "comment.md").read_text()
    (known,) = data["known"]
    # the replica check's line is what #20340's repro is known by: the series' fix is tried on the
    # reporter's own script, without and with the patches, in the cell they target (a run that
    # aborted as it exited, as torch 2.13 + gloo now and then does, is made again and said)
    assert comment.splitlines()[0] == ("**Triage:** reproduced 1/1 on pytorch-lightning 2.6.6 + torch "
                                       "2.13.0 (CPU); it is #20340: bad before, good after with the "
                                       f"series' fix ({triage.locate.runs_made(known)})"), \
        comment.splitlines()[0]
    assert (known["cell"], known["before"], known["after"]) == ("pl2_6_6_torch2_13_0", "bad", "good")
    assert "lightning-ddp-rewrap-on-trainable-change.patch" in known["patches"]
    assert "the reporter's script in `pl2_6_6_torch2_13_0` is bad without and good with" in comment


@pytest.mark.timeout(1500)
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
@pytest.mark.skipif(bool(sandbox.unavailable()), reason=str(sandbox.unavailable()))
def test_a_bug_fixed_since_the_reporters_release_gets_its_fix_bisected(tmp_path):
    """A report on 2.5.0 of a crash that a later release fixed: reproduced in the reporter's
    versions, not in the newest, so the bisect looks for the fix, over real releases (and, with
    a Lightning checkout in ``LIGHTNING_REPO``, its commits and a master cell)."""
    code, out, err = run_triage(tmp_path, str(ISSUES / "fixed_later.md"), "--trials", "1",
                                "--budget", "0")
    assert code == 0, err[-3000:]
    data = json.loads((tmp_path / "out" / "triage.json").read_text())
    assert [(c["label"], c["lightning"], c["verdicts"]) for c in data["cells"][:2]] == [
        ("reporter's", "2.5.0", ["bad"]), ("newest", data["cells"][1]["lightning"], ["good"])]
    status = data["status"]
    assert status.startswith("reproduced 1/1 on the reporter's 2.5.0 + torch 2.13.0, not on "
                             "pytorch-lightning "), status
    assert "fixed in 2.5.0.post0 (the last with the bug: 2.5.0)" in status, status
    assert data["bisect"]["find_fix"] and data["bisect"]["releases"]["outcome"]["first_bad"] == "2.5.0.post0"
    comment = (tmp_path / "out" / "comment.md").read_text()
    assert "**Bisect (the fix):**" in comment
    assert "First fixed pytorch-lightning release: **2.5.0.post0**" in comment
    if os.environ.get("LIGHTNING_REPO"):  # the fix's commit, upstream's #20514
        assert "by commit 58a749a1dde8 (#20514)" in status, status
        master = data["cells"][2]
        assert master["label"] == "master" and master["verdicts"] == ["good"], master


@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
@pytest.mark.skipif(bool(sandbox.unavailable()), reason=str(sandbox.unavailable()))
def test_a_script_report_without_its_lightning_version_runs_in_the_fingerprinted_release(tmp_path):
    """No Lightning version stated: the reporter's cell is the release whose source has every
    quoted line of the traceback's frames (real wheels or tags), and the script is bad there."""
    code, out, err = run_triage(tmp_path, str(ISSUES / "no_version.md"), "--trials", "1",
                                "--no-bisect", "--budget", "0")
    assert code == 0, err[-3000:]
    data = json.loads((tmp_path / "out" / "triage.json").read_text())
    assert data["versions_said"]["lightning"] is None and data["versions_fingerprinted"] == "2.5.0"
    assert [(c["label"], c["lightning"], c["torch"], c["verdicts"]) for c in data["cells"][:2]] == [
        ("reporter's", "2.5.0", "2.13.0", ["bad"]),
        ("newest", data["cells"][1]["lightning"], "2.13.0", ["good"])]
    assert "- Versions not stated: the reporter's is 2.5.0" in (tmp_path / "out" / "comment.md").read_text()


# -- what a cold review found ---------------------------------------------------------------------

def test_the_cause_is_chosen_over_a_peers_consequence_and_short_messages_are_extended():
    tb = ("[rank1]: Traceback (most recent call last):\n"
          "[rank0]: Traceback (most recent call last):\n"
          '[rank1]:   File "/x/site-packages/lightning/pytorch/loops/fit_loop.py", line 9, in run\n'
          "[rank1]:     self.advance()\n"
          "[rank1]: ValueError: the batch has 3 items, expected 2\n"
          '[rank0]:   File "/x/site-packages/torch/distributed/distributed_c10d.py", line 5, in all_reduce\n'
          "[rank0]:     work.wait()\n"
          "[rank0]: torch.distributed.DistBackendError: Connection closed by peer [127.0.0.1]:123\n")
    assert triage.read.exception_line(tb) == ("ValueError", "the batch has 3 items, expected 2")
    signature = triage.signatures.derive_signature(*triage.read.exception_line(tb))
    site = triage.signatures.report_site(tb, signature)
    assert site == ("ValueError", "lightning:loops/fit_loop.py", "run")
    assert triage.signatures.derive_signature("RuntimeError",
                                              "CUDA error: an illegal memory access was encountered") \
        .startswith("RuntimeError: CUDA\\ error:\\ an\\ illegal")


@pytest.mark.parametrize("text, drift", [
    ("After the unfreeze, rank 1's loss drifts away from rank 0's.", True),
    ("The weights on the two GPUs end up not identical after an epoch.", True),
    ("The replicas are out of sync after resuming.", True),
    ("My loss diverges to NaN on a single GPU.", False),
])
def test_drift_needs_ranks_or_replicas_nearby(text, drift):
    assert bool(triage.signatures.DRIFT.search(text)) is drift


def test_the_forms_template_line_and_a_conda_list_are_read():
    text = ("### Environment\n\n#- PyTorch Lightning Version (e.g., 1.5.0): 2.2.1\n"
            "#- PyTorch Version (e.g., 2.0): 2.1.2\n")
    said = triage.read.stated_versions(triage.read.Issue("x", "x", "x", text))
    assert (said["lightning"], said["torch"]) == ("2.2.1", "2.1.2")
    conda = ("### Environment\n\n```\npytorch                   2.3.1   py3.11_cuda12.1\n"
             "lightning   2.3.3   pyhd8ed1ab_0\n```\n")
    said = triage.read.stated_versions(triage.read.Issue("x", "x", "x", conda))
    assert (said["lightning"], said["torch"]) == ("2.3.3", "2.3.1")


@pytest.mark.parametrize("bad_in, expect", [
    # the same Lightning release: bad on the reporter's older torch, good on the newest: torch
    # fixed it, so torch's releases are bisected for the fix, that release held
    ({"2.6.0"}, ("fix", "fixed in torch 2.8.0 (the last with the bug: 2.7.1)")),
    # good on the reporter's torch, bad on the newest: torch brought it
    ({"2.13.0"}, ("regression", "regressed in torch 2.8.0 (last good 2.7.1)")),
])
def test_one_release_on_two_torches_bisects_torch(tmp_path, monkeypatch, bad_in, expect):
    report = tmp_path / "torch.md"
    report.write_text((ISSUES / "fixed_later.md").read_text().replace(
        "Lightning Version: 2.5.0", "Lightning Version: 2.6.6").replace("v2.5", "v2.6").replace(
        "PyTorch Version: 2.13.0", "PyTorch Version: 2.6.0"))
    monkeypatch.setattr(triage.runs, "newest_release", lambda package: "2.6.6")
    monkeypatch.setattr(triage.runs, "resolve", lambda package, version: version)
    monkeypatch.setattr(triage.sandbox, "unavailable", lambda: None)

    def run_cell(cell, script, args, out, launcher, site, after=0):
        cell.verdicts = ["bad" if cell.torch in bad_in else "good"] * args.trials
        cell.reasons = [""] * args.trials

    asked = {}

    def bisect(script, args, out, oldest, package, torch="2.13.0", fix=None, torch_axis=None):
        asked.update(fix=fix, torch_axis=torch_axis, auto=args.auto)
        return {"markdown": "## Bisect result\n", "find_fix": bool(fix), "axis": "torch",
                "releases": {"outcome": {"status": "found", "first_bad": "2.8.0", "last_good": "2.7.1"}}}

    monkeypatch.setattr(triage.runs, "run_cell", run_cell)
    monkeypatch.setattr(triage.locate, "bisect", bisect)
    t = triage.triage(triage.parse_args([str(report), "--budget", "0", "--repo", "",
                                         "--out", str(tmp_path / "out")]))
    assert [(c["lightning"], c["torch"]) for c in t["cells"]] == [("2.6.6", "2.6.0"), ("2.6.6", "2.13.0")]
    assert asked["torch_axis"] == ("2.6.6", "2.6.0", "2.13.0")
    assert asked["fix"] == (("2.6.0", "2.13.0") if expect[0] == "fix" else None)
    assert expect[1] in t["status"], t["status"]
    assert not asked["auto"] and "unstable" not in t["status"]


def test_a_bug_only_master_shows_is_said_so_and_not_bisected(tmp_path, monkeypatch):
    monkeypatch.setattr(triage.runs, "newest_release", lambda package: "2.6.6")
    monkeypatch.setattr(triage.runs, "resolve", lambda package, version: version)
    monkeypatch.setattr(triage.sandbox, "unavailable", lambda: None)
    monkeypatch.setattr(triage.runs, "master_cell", lambda args, package, newest: triage.runs.Cell(
        "master", package, "master abc123", "2.13.0", source="/nowhere", base=newest))

    def run_cell(cell, script, args, out, launcher, site, after=0):
        cell.verdicts, cell.reasons = ["bad" if cell.label == "master" else "good"], [""]

    monkeypatch.setattr(triage.runs, "run_cell", run_cell)
    monkeypatch.setattr(triage.locate, "bisect", lambda *a, **k: pytest.fail("nothing to bisect"))
    t = triage.triage(triage.parse_args([str(ISSUES / "fixed_later.md"), "--trials", "1",
                                         "--budget", "0", "--out", str(tmp_path / "out")]))
    assert t["status"].startswith("reproduced 1/1 at master abc123 only, not in a release: 0/1 on "
                                  "pytorch-lightning 2.6.6"), t["status"]
    assert "questions" not in t


def test_a_divergence_is_taken_for_20340_only_where_trainability_changes():
    line = "replicas diverged at step 12 (epoch 2): 2 of 4 parameters differ"
    assert [r.issue for r in triage.locate.known(line + "\ncallbacks=[BackboneFinetuning(2)]")] == [20340]
    assert triage.locate.known(line + "\nopt = SGD(model.parameters(), lr=rank + 1)") == []
    assert [r.issue for r in triage.locate.known("AttributeError: 'NoneType' object has no attribute "
                                          "'reducer'")] == [20706]


def test_an_unstable_repro_is_said_and_bisected_with_auto_trials(tmp_path, monkeypatch):
    monkeypatch.setattr(triage.runs, "newest_release", lambda package: "2.6.6")
    monkeypatch.setattr(triage.runs, "resolve", lambda package, version: version)
    monkeypatch.setattr(triage.sandbox, "unavailable", lambda: None)

    def run_cell(cell, script, args, out, launcher, site, after=0):
        cell.verdicts, cell.reasons = ["bad", "good", "good"], ["", "", ""]

    asked = {}
    monkeypatch.setattr(triage.runs, "run_cell", run_cell)
    monkeypatch.setattr(triage.locate, "bisect", lambda *a, **k: asked.update(auto=a[1].auto) or None)
    t = triage.triage(triage.parse_args([str(ISSUES / "fixed_later.md"), "--budget", "0",
                                         "--repo", "", "--out", str(tmp_path / "out")]))
    assert "; unstable (1/3 on 2.5.0, 1/3 on 2.6.6): the bisect ran with --trials auto" in t["status"]
    assert asked["auto"] is True


@pytest.mark.parametrize("code, nodes", [
    ("Trainer(num_nodes=2, devices=4)", (2, 4)),
    ("pl.Trainer(accelerator='cpu', num_nodes=3)", (3, 1)),
    ("Trainer(num_nodes=1, devices=2)", (1, 1)),
    ("Trainer(num_nodes=n, devices=2)", (1, 1)),  # not a constant: not guessed
    ("Trainer(num_nodes=2, devices=[0, 1])", (2, 1)),  # the port makes a list a count first
])
def test_the_nodes_a_script_is_written_for(code, nodes):
    assert triage.port.topology(code) == nodes


@pytest.mark.ddp
@pytest.mark.timeout(900)
@pytest.mark.skipif(bool(sandbox.unavailable()), reason=str(sandbox.unavailable()))
def test_a_script_for_two_nodes_runs_as_two_nodes_in_the_sandbox(tmp_path):
    code, out, err = run_triage(tmp_path, str(ISSUES / "two_nodes.md"), "--trials", "1", "--no-bisect",
                                "--budget", "0", "--repo", "")
    assert code == 0, err[-3000:]
    data = json.loads((tmp_path / "out" / "triage.json").read_text())
    assert data["nodes"] == [2, 1]
    assert any(c.startswith("num_nodes=2: run as 2 nodes of one job") for c in data["port_changes"])
    assert data["signature"].startswith("RuntimeError: node")  # the cause, not the peer's gloo error
    (cell,) = data["cells"]
    assert cell["verdicts"] == ["bad"], cell  # raised where the report says, on the second node
    logs = tmp_path / "out" / "logs"  # each node's output, copied out of the sandbox's own folder
    assert "lost its shard" in "".join(p.read_text() for p in logs.glob("*.node*.stderr"))
    assert data["status"].startswith("reproduced 1/1 on pytorch-lightning 2.6.6 + torch 2.13.0")


def test_the_cpu_port_covers_devices_device_ids_and_f_strings():
    src = ("m = Net().cuda(non_blocking=True)\nd = torch.cuda.device_count()\nz = w.to(f'cuda:{rank}')\n"
           "ddp = DDP(m, device_ids=[rank])\nT(devices=[0, 1], precision='16-true', accelerator='gpu')\n"
           "s = torch.load('a.pt', map_location='cuda:0')\n")
    new, changes, _ = triage.port.cpu_port(src)
    assert new == ("m = Net()\nd = 2\nz = w.to('cpu')\nddp = DDP(m, device_ids=None)\n"
                   "T(devices=2, precision='bf16-true', accelerator='cpu')\n"
                   "s = torch.load('a.pt', map_location='cpu')\n")
    assert len(changes) == 8


def test_the_static_check_sees_through_the_usual_detours():
    code = "\n".join([
        "from subprocess import run", "import ctypes", "__import__('os').system('x')",
        "exec('import os; os.system(\"ls\")')", "open(os.path.join('/', 'etc', 'x'), 'w')",
        "torch.save(model, '/data/model.pt')", "open('a/../../x', 'w')",
    ])
    found = " | ".join(triage.port.dangerous(code))
    for what in ("imports subprocess", "imports ctypes", "__import__", "in exec(): line 1: os.system",
                 "open() on a path outside", "torch.save() on a path outside"):
        assert what in found, (what, found)
    assert triage.port.dangerous("from pathlib import Path\nPath('/etc/hostname').open().read()\n") == []


@pytest.mark.skipif(bool(sandbox.unavailable()), reason=str(sandbox.unavailable()))
def test_the_sandbox_is_read_only_outside_its_folders_and_keeps_secrets_out(tmp_path, monkeypatch):
    tmp_path.chmod(0o755)  # the run is nobody, when the suite is root
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_not_a_real_token_0123")
    probe = tmp_path / "probe.py"
    target = tmp_path / "outside.txt"
    probe.write_text("import os\n"
                     "print('token', os.environ.get('GITHUB_TOKEN'))\n"
                     "open(os.path.join(os.environ['HOME'], 'inside.txt'), 'w').write('ok')\n"
                     f"open({str(target)!r}, 'w').write('escaped')\n")
    r = Launcher().run(Run((str(probe),), Path(sys.executable), sandbox=True, log_stem=tmp_path / "log"))
    out, err = (tmp_path / "log.stdout").read_text(), (tmp_path / "log.stderr").read_text()
    assert "token None" in out
    assert "Read-only file system" in err and not target.exists(), (r, err)


def test_an_api_json_without_a_body_text_is_bad_input(tmp_path):
    bad = tmp_path / "issue.json"
    bad.write_text(json.dumps({"title": "t", "body": 123}))
    code, out, err = run_triage(tmp_path, str(bad))
    assert code == 2
    assert err.strip().splitlines()[-1] == (f"error: {bad}: not an issue as GitHub's API gives it "
                                            "(no 'body' text)")


# -- what goes public, and where the results go -----------------------------------------------------

def test_the_comment_caps_what_runs_said_redacts_secrets_and_names_no_path(tmp_path):
    """A script's exception quotes a file it read (a password file, a key): none of it reaches
    the comment, whose first line is capped, and "Reproduce with" names the file, not its path."""
    leaked = ("root:x:0:0:root:/root:/bin/bash daemon:*:20228:0:99999:7::: "
              "token=hunter2hunter2 ghp_abcdefghijklmnopqrstuvwxyz0123 AKIAABCDEFGHIJKLMNOP "
              "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----")
    reason = f"exit 1 without the signature: RuntimeError: {leaked} " + "x" * 2000
    report = tmp_path / "some folder" / "issue.md"
    t = {"status": f"could not test: every run ended without a verdict ({reason})", "sandbox": "yes",
         "input": str(report), "reproduce": "issue.md", "id": "issue",
         "cells": [{"label": "newest", "package": "pytorch-lightning", "lightning": "2.6.6",
                    "torch": "2.13.0", "rate": "0/0 (1 could not test)", "verdicts": ["skip"],
                    "reasons": [reason]}]}
    text = triage.comment.comment(t)
    first = text.splitlines()[0]
    assert len(first) <= triage.comment.STATUS_CAP + len("**Triage:** "), len(first)
    for secret in ("root:x:0:0", "daemon:*:", "hunter2", "ghp_abc", "AKIAABC", "b3BlbnNzaC1rZXk"):
        assert secret not in text, secret
    assert "[redacted]" in first
    assert "Reproduce with: `nox -s triage -- issue.md`" in text
    assert str(tmp_path) not in text


def test_two_reports_of_the_same_name_get_two_folders_and_one_triaged_again_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(triage.runs, "newest_release", lambda package: "2.6.6")
    monkeypatch.setattr(triage.runs, "resolve", lambda package, version: version)
    monkeypatch.setattr(triage.sandbox, "unavailable", lambda: None)
    runs = []

    def run_cell(cell, script, args, out, launcher, site, after=0):
        runs.append((str(out), cell.label))
        cell.verdicts, cell.reasons = ["good"] * args.trials, [""] * args.trials

    monkeypatch.setattr(triage.runs, "run_cell", run_cell)
    monkeypatch.setattr(triage.locate, "bisect", lambda *a, **k: None)
    folders = []
    for name in ("a", "b", "a"):
        (tmp_path / name).mkdir(exist_ok=True)
        report = tmp_path / name / "issue.md"
        report.write_text((ISSUES / "fixed_later.md").read_text())
        t = triage.triage(triage.parse_args([str(report), "--trials", "1", "--budget", "0",
                                             "--repo", ""]))
        folders.append(t["out"])
        assert (Path(t["out"]) / "comment.md").is_file()
    assert folders[0] != folders[1] and folders[0] == folders[2], folders
    assert all(re.fullmatch(r"issue-[0-9a-f]{8}", Path(f).name) for f in folders), folders  # one hash
    assert [o for o, _ in runs].count(folders[0]) == 2  # the first triage's two cells, not again
    assert [o for o, _ in runs].count(folders[1]) == 2


def test_no_sandbox_here_means_nothing_runs_unless_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(triage.sandbox, "unavailable", lambda: "no sandbox here: bwrap not installed")
    monkeypatch.setattr(triage.runs, "run_cell", lambda *a, **k: pytest.fail("ran without a sandbox"))
    with pytest.raises(contract.BadInput) as err:
        triage.triage(triage.parse_args([str(ISSUES / "fixed_later.md"), "--budget", "0",
                                         "--repo", "", "--out", str(tmp_path / "out")]))
    assert str(err.value) == ("no sandbox here: bwrap not installed; nothing was run (--allow-unsandboxed "
                              "runs the pasted code without it, as you)")
    args = triage.parse_args([str(ISSUES / "fixed_later.md"), "--allow-unsandboxed"])
    assert triage.runs.sandbox_mode(args) == "none" and triage.runs.sandbox_flag(args) == []
    args = triage.parse_args([str(ISSUES / "fixed_later.md"), "--allow-network"])
    assert triage.runs.sandbox_mode(args) == "network"
    assert triage.runs.sandbox_flag(args) == ["--sandbox=network"]


def test_a_lossy_traceback_gets_the_release_that_matches_the_most_frames(monkeypatch):
    """No release has every quoted line (a frame from an edited file, a line cut short): the
    newest of those matching the most frames, as ``nox -s fingerprint`` ranks them, and how many."""
    from packaging.version import Version

    frames = [triage.fingerprint.Frame("lightning", "a.py", 3, "x = 1", ()),
              triage.fingerprint.Frame("lightning", "b.py", 5, "y = 2", ()),
              triage.fingerprint.Frame("lightning", "c.py", 7, "edited by the reporter", ())]
    sources = {"2.4.0": {"a.py": "x = 1", "b.py": "old"}, "2.5.0": {"a.py": "x = 1", "b.py": "y = 2"},
               "2.5.1": {"a.py": "x = 1", "b.py": "y = 2"}, "2.6.0": {"a.py": "new", "b.py": "y = 2"}}

    class Source:
        def __init__(self, package, version):
            self.files = sources[str(version)]

        def read(self, package, rel):
            return self.files.get(rel)

    monkeypatch.setattr(triage.fingerprint, "releases_since", lambda *a: [Version(v) for v in sources])
    monkeypatch.setattr(triage.fingerprint, "WheelSources", Source)
    monkeypatch.setattr(triage.fingerprint, "matches", lambda source, frame: source == frame.code)
    t = {}
    assert triage.locate.fingerprinted(frames, "pytorch-lightning", None, t) == "2.5.1"
    assert t["fingerprint"] == {"matched": 2, "frames": 3, "releases": ["2.5.0", "2.5.1"]}


# -- the corpus of report shapes (bench/triage_corpus.py runs every one) ----------------------------

EXPECTED = __import__("tomllib").loads((ISSUES / "expected.toml").read_text())


def test_every_report_of_the_corpus_has_its_expected_first_line():
    assert sorted(EXPECTED) == sorted(p.stem for p in ISSUES.glob("*.md"))
    assert len(EXPECTED) >= 20
    for case in EXPECTED.values():
        re.compile(case["first"])


@pytest.mark.parametrize("name", ["downloads_dataset", "fix_as_code", "no_code", "proposed_fix_only",
                                  "syntax_error", "worked_before_no_code"])
def test_the_reports_that_need_no_run_give_their_expected_first_line(tmp_path, name):
    code, out, err = run_triage(tmp_path, str(ISSUES / f"{name}.md"), "--trials", "1",
                                "--budget", "0")
    assert code == 0, err[-2000:]
    first = (tmp_path / "out" / "comment.md").read_text().splitlines()[0].removeprefix("**Triage:** ")
    assert re.match(EXPECTED[name]["first"], first), first
    assert not (tmp_path / "out" / "logs").exists()  # nothing ran


def test_a_failure_in_every_release_is_not_a_regression_and_a_check_of_lightnings_is_quoted():
    bisected = {"markdown": "## Bisect result\n", "releases": {"outcome": {"status": "no-good",
                                                                            "first_bad": "2.0.0"}}}
    said = triage.comment.bisect_status(bisected)
    assert said == "the same in every release tested since 2.0.0: not a regression"
    output = ("Traceback (most recent call last):\n"
              '  File "/home/u/run.py", line 9, in <module>\n    trainer.validate(model, ckpt_path="best")\n'
              '  File "/venv/lib/python3.11/site-packages/pytorch_lightning/trainer/connectors/'
              'checkpoint_connector.py", line 190, in _parse_ckpt_path\n'
              '    raise ValueError(\n'
              'ValueError: `.validate(ckpt_path="best")` is set but `ModelCheckpoint` is not configured.\n')
    said = triage.signatures.deliberate(output)
    assert said == ("; Lightning raises it on purpose (lightning:trainer/connectors/"
                    "checkpoint_connector.py): `` ValueError: `.validate(ckpt_path=\"best\")` is set "
                    "but `ModelCheckpoint` is not configured. ``"), said
    assert triage.signatures.deliberate(output.replace("    raise ValueError(\n", "    x = y.z\n")) == ""


def test_a_report_that_says_it_hangs_is_reproduced_by_a_run_that_outlives_its_limit(tmp_path):
    """No exception, "it hangs": the hang is the signature (``--hang`` for the bisect), and a run
    that outlives its limit reproduces it."""
    report = tmp_path / "hangs.md"
    report.write_text("# Fit never returns\n\n### Bug description\n\nThe script is stuck forever at the "
                      "start, no error.\n\n### What version are you seeing the problem on?\n\nv2.6\n\n"
                      "### How to reproduce the bug\n\n```python\nimport time\nimport torch\n"
                      "from pytorch_lightning import Trainer\n\nif torch.__version__ == 'never':\n"
                      "    Trainer()\ntime.sleep(600)\n```\n")
    code, out, err = run_triage(tmp_path, str(report), "--trials", "1", "--timeout", "3", "--no-bisect",
                                "--budget", "0", "--repo", "")
    assert code == 0, err[-3000:]
    data = json.loads((tmp_path / "out" / "triage.json").read_text())
    assert data["hang_why"] == "the report says 'never returns' and shows no exception"
    assert data["status"].startswith("reproduced 1/1 on pytorch-lightning 2.6.6 + torch 2.13.0 (CPU) "
                                     "(it hangs: each bad run outlived its 3 s limit)"), data["status"]


@pytest.mark.parametrize("text, said", [
    ("Training gets stuck at epoch 2 and never continues.", "stuck"),
    ("The fit hangs forever after the first epoch.", "hangs"),
    ("It never returns from `trainer.fit`.", "never returns"),
    ("The model's frozen layers get updated anyway.", None),
    ("The loss is stuck at 0.69 from the start.", None),
    ("My validation accuracy got stuck.", None),
    ("```python\n# the loader was stuck here once\n```\n", None),  # code, not the report's words
])
def test_a_hang_is_what_the_report_says_of_its_run_not_of_a_value(text, said):
    found = triage.signatures.hang_said(text)
    assert (found[0] if found else None) == said


def test_a_scripts_own_assert_is_its_signature_only_with_a_message():
    assert triage.signatures.assert_message("x = 1\nassert x == 2, 'ranks hold different weights'\n") == \
        "ranks hold different weights"
    assert triage.signatures.assert_message("assert x == 2\n") is None  # torch's asserts raise the same class


def test_a_traceback_line_the_posted_code_lacks_is_found_white_space_aside():
    """The report's failing line, read under the frame that raised; when the posted code lacks it,
    no run of that code can reach it (the triage then asks for the script that made it)."""
    from tools.triage import signatures

    tb = ('Traceback (most recent call last):\n  File "train.py", line 12, in <module>\n'
          '    assert step == 10, f"step is {step}"\nAssertionError: step is 12, expected 10\n')
    line = signatures.failing_line(tb, r"AssertionError: step is \d+")
    assert line == 'assert step == 10, f"step is {step}"'
    assert signatures.posted_without(line, "import torch\n\nclass Net:\n    pass\n")
    assert not signatures.posted_without(line, 'if True:\n    assert  step == 10,  f"step is {step}"\n')
    assert signatures.failing_line("AssertionError: step is 12\n", r"AssertionError") is None  # no frame
    assert not signatures.posted_without(None, "anything")


@pytest.mark.ddp
@pytest.mark.timeout(900)
@pytest.mark.skipif(bool(sandbox.unavailable()), reason=str(sandbox.unavailable()))
def test_a_traceback_from_code_the_report_does_not_show_asks_for_that_code(tmp_path):
    """The posted module and main run, and stop before anything the traceback shows (no training
    step): not "could not test", but the line that raised, which the posted code does not hold."""
    code, out, err = run_triage(tmp_path, str(ISSUES / "two_blocks.md"), "--trials", "1", "--no-bisect",
                                "--budget", "0", "--repo", "")
    assert code == 0, err[-3000:]
    data = json.loads((tmp_path / "out" / "triage.json").read_text())
    assert data["failing_line"] == 'assert step == 10, f"step is {step} at 0x7f3a"'
    assert data["status"].startswith("needs a repro: the line that raised in the report's traceback "
                                     '(`assert step == 10, f"step is {step} at 0x7f3a"`) is not in the '
                                     "posted code, which stops before it ("), data["status"]
