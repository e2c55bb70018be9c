import json

import pytest

from tools.core import contract


def line(code, **extra):
    return json.dumps({"repro": "x", "verdict": contract.name(code), "exit_code": code, **extra})


def test_verdict_line_is_the_last_non_empty_stdout_line():
    out = "noise\n" + line(1, signature="sig") + "\n\n"
    assert contract.parse_verdict_line(out)["signature"] == "sig"


def test_a_json_line_followed_by_other_output_is_not_a_verdict():
    assert contract.parse_verdict_line(line(1) + "\nTraceback ...\n") is None
    assert contract.parse_verdict_line('{"foo": 1}\n') is None
    assert contract.parse_verdict_line("") is None


def judge(rc, stdout="", stderr="", why=None, signature=None):
    return contract.judge(rc, stdout, stderr, signature=signature, stopped=why, timeout=10)


def test_exit_1_with_a_bad_verdict_line_is_bad():
    r = judge(1, line(1, signature="replicas out of sync"))
    assert (r.code, r.reason, r.final) == (1, "replicas out of sync", True)


def test_exit_1_without_verdict_line_is_cannot_test():
    # an uncaught exception also exits 1: that is not the bug's signature
    r = judge(1, "", "Traceback...\nValueError: boom")
    assert (r.code, r.final) == (125, False)
    assert "ValueError: boom" in r.reason


def test_user_script_signature_regex_decides_bad():
    assert judge(1, "", "AttributeError: 'NoneType' object has no attribute 'reducer'",
                 signature="has no attribute 'reducer'").code == 1
    assert judge(1, "", "ValueError", signature="reducer").code == 125
    # exit 1 with neither a verdict line nor a signature: an ImportError exits 1 too
    assert judge(1, "", "ImportError: no module named foo").code == 125


@pytest.mark.parametrize("rc, said", [(0, line(1)), (1, line(0)),
                                      (0, json.dumps({"verdict": "bad", "exit_code": 0})),
                                      (1, json.dumps({"verdict": "good", "exit_code": 1}))])
def test_a_verdict_line_disagreeing_with_itself_or_the_exit_code_is_a_harness_failure(rc, said):
    assert judge(rc, said).code == contract.FAIL


def test_only_the_repros_own_verdicts_are_final():
    # a timeout, a kill, an unrelated crash may go away: they must be tried again, not cached
    assert [judge(0).final, judge(1, line(1)).final, judge(125, line(125)).final] == [True] * 3
    assert not any([judge(-9, why="timeout").final, judge(-9).final, judge(1, "", "boom").final,
                    judge(2).final, judge(-9, why="peer").final])


def test_signals_timeouts_and_odd_exit_codes_map_to_the_contract():
    assert judge(-9).code == 125 and "SIGKILL" in judge(-9).reason
    assert judge(-15, why="timeout").code == 125
    assert judge(-15, why="peer").reason.startswith("a rank died")
    assert judge(2).code == 125
    assert judge(130).code == 130
    assert judge(0, line(0)).code == 0
    assert judge(125, line(125, details={"reason": "import failed"})).reason == "import failed"
