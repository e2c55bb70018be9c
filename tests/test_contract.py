import json

from tools import contract, harness


def line(code, **extra):
    return json.dumps({"repro": "x", "verdict": contract.name(code), "exit_code": code, **extra})


def test_verdict_line_is_the_last_non_empty_stdout_line():
    out = "noise\n" + line(1, signature="sig") + "\n\n"
    assert contract.parse_verdict_line(out)["signature"] == "sig"


def test_a_json_line_followed_by_other_output_is_not_a_verdict():
    assert contract.parse_verdict_line(line(1) + "\nTraceback ...\n") is None
    assert contract.parse_verdict_line('{"foo": 1}\n') is None
    assert contract.parse_verdict_line("") is None


def judge(rc, stdout="", stderr="", why=None, require_record=True, signature=None):
    return harness._judge(rc, why, 10, stdout, stderr, require_record, signature)


def test_exit_1_with_a_bad_verdict_line_is_bad():
    r = judge(1, line(1, signature="replicas out of sync"))
    assert (r.code, r.verdict, r.reason) == (1, "bad", "replicas out of sync")


def test_exit_1_without_verdict_line_is_cannot_test():
    # an uncaught exception also exits 1: that is not the bug's signature
    r = judge(1, "", "Traceback...\nValueError: boom")
    assert (r.code, r.verdict) == (125, "skip")
    assert "ValueError: boom" in r.reason


def test_user_script_signature_regex_decides_bad():
    assert judge(1, "", "AttributeError: 'NoneType' object has no attribute 'reducer'",
                 require_record=False, signature="has no attribute 'reducer'").code == 1
    assert judge(1, "", "ValueError", require_record=False, signature="reducer").code == 125
    assert judge(1, "", "", require_record=False).code == 1  # plain git-bisect contract


def test_disagreeing_verdict_line_is_a_harness_failure():
    assert judge(0, line(1)).code == contract.FAIL


def test_signals_timeouts_and_odd_exit_codes_map_to_the_contract():
    assert judge(-9).code == 125 and "SIGKILL" in judge(-9).reason
    assert judge(None, why="timeout").code == 125
    assert judge(None, why="peer").reason.startswith("a rank died")
    assert judge(2).code == 125
    assert judge(130).code == 130
    assert judge(0, line(0)).code == 0
    assert judge(125, line(125, details={"reason": "import failed"})).reason == "import failed"
