"""Verifiers (gspo_bench.tasks.verifiers): hand-computed rewards, hostile input, the optional math extra."""

from __future__ import annotations

import sys
import time

import pytest

from gspo_bench.tasks.verifiers import (
    MAX_DEPTH,
    MAX_EXPR_CHARS,
    VERIFIER_REQUIRES,
    VERIFIERS,
    evaluate,
    extract_final_answer,
    format_countdown_answer,
    parse_countdown_answer,
    parse_expression,
    verify_countdown,
    verify_gsm8k,
    verify_math,
    verify_scratchpad,
)


def test_registry_holds_the_new_verifiers():
    assert VERIFIERS["scratchpad"] is verify_scratchpad
    assert VERIFIERS["countdown"] is verify_countdown
    assert VERIFIERS["gsm8k"] is verify_gsm8k
    assert VERIFIERS["math_verify"] is verify_math
    assert VERIFIER_REQUIRES["math_verify"] == ("math_verify", "math")


# ----------------------------------------------------------------------------- scratchpad


@pytest.mark.parametrize("completion,answer,want", [
    ("7+5+0=12 c1\n3+8+1=12 c1\n2+4+1=7 c0\n=722", "722", 1.0),
    ("=722", "722", 1.0),  # the working is not checked, only the outcome
    ("garbage\n= 722 \n\n", "722", 1.0),
    ("7+5+0=12 c1\n=723", "722", 0.0),
    ("7+5+0=12 c1\n722", "722", 0.0),  # the final line must start with "="
    ("=722\n3+8+1=12 c1", "722", 0.0),  # and be the last one
    ("=0722", "722", 0.0),
    ("=722 c0", "722", 0.0),
    ("==722", "722", 0.0),
    ("", "722", 0.0),
    ("=", "", 0.0),  # an empty answer never matches
    ("\n\n", "722", 0.0),
])
def test_verify_scratchpad(completion, answer, want):
    got = verify_scratchpad(completion, answer)
    assert isinstance(got, float) and got == want


# ----------------------------------------------------------------------------- countdown


def test_countdown_answer_round_trip():
    assert format_countdown_answer([12, 5, 3], 41) == "12 5 3|41"
    assert parse_countdown_answer("12 5 3|41") == ([12, 5, 3], 41)
    assert parse_countdown_answer(" 7 7|49\n") == ([7, 7], 49)
    with pytest.raises(ValueError):
        parse_countdown_answer("12 5 3 41")


@pytest.mark.parametrize("text,value,used", [
    ("12*3+5", 41, [12, 3, 5]),
    ("12+3*5", 27, [12, 3, 5]),
    ("(12+3)*5", 75, [12, 3, 5]),
    ("12-5-3", 4, [12, 5, 3]),  # left-associative
    ("12-(5-3)", 10, [12, 5, 3]),
    ("12/4/3", 1, [12, 4, 3]),
    ("12/(4/2)", 6, [12, 4, 2]),
    ("7/2*2", 7, [7, 2, 2]),  # exact: 7/2 is 3.5, not 3
    (" ( 3 + 4 ) * 2 ", 14, [3, 4, 2]),
    ("((((5))))", 5, [5]),
])
def test_parse_and_evaluate(text, value, used):
    tree, got_used = parse_expression(text)
    assert evaluate(tree) == value
    assert got_used == used


def test_evaluate_is_exact():
    tree, _ = parse_expression("1/3+1/3+1/3")
    assert evaluate(tree) == 1


@pytest.mark.parametrize("completion,want", [
    ("12*3+5", 1.0),
    ("5+12*3", 1.0),
    ("3*12+5", 1.0),
    (" 12*3+5 \n", 1.0),
    ("(12*3)+(5)", 1.0),
    ("12*3+5+0", 0.0),  # 0 is not on offer
    ("12*3", 0.0),  # a subset is allowed, but 36 is not 41
    ("12+5+3", 0.0),
    ("12*3+5=41", 0.0),
    ("41", 0.0),  # the target is not one of the numbers
    ("12*3+05", 0.0),  # integers as given, no leading zeros
    ("", 0.0),
    ("12*3+5\nthat is it", 0.0),
])
def test_verify_countdown(completion, want):
    got = verify_countdown(completion, "12 5 3|41")
    assert isinstance(got, float) and got == want


def test_countdown_subsets_and_multiplicity():
    # each number at most as often as given; unused numbers are fine
    assert verify_countdown("12*2", "12 2 7|24") == 1.0
    assert verify_countdown("12+12", "12 2 7|24") == 0.0  # 12 used twice, given once
    assert verify_countdown("5*5-1", "5 1 3|24") == 0.0
    assert verify_countdown("5*5-1", "5 5 1|24") == 1.0  # given twice, used twice
    assert verify_countdown("5*5*5", "5 5 1|125") == 0.0


def test_countdown_division():
    assert verify_countdown("(9-3)/2", "9 3 2|3") == 1.0
    assert verify_countdown("9/(3-3)", "9 3 3|1") == 0.0  # division by zero scores 0 ...
    assert verify_countdown("9/(3-3)", "9 3 3|1", partial_credit=0.1) == 0.0  # ... even with partial credit
    assert verify_countdown("7/2+7/2", "7 2 7 2|7") == 1.0  # fractional intermediates are fine


def test_countdown_partial_credit():
    answer = "12 5 3|41"
    assert verify_countdown("12+5+3", answer, partial_credit=0.1) == pytest.approx(0.1)
    assert verify_countdown("12*3+5", answer, partial_credit=0.1) == 1.0
    # malformed, or numbers not on offer: no format reward
    for bad in ("12+5+", "12+5+7", "12+12", "hello", ""):
        assert verify_countdown(bad, answer, partial_credit=0.1) == 0.0


HOSTILE = [
    "__import__('os')",
    "__import__('os').system('echo hi')",
    "2**100",
    "12**3",
    "1e9",
    "12.0*3+5",
    "x",
    "x+12",
    "abs(12)",
    "int(12)*3+5",
    "(12).__class__",
    "12 .real",
    "[12]",
    "-12+53",  # no unary minus
    "12*3+-5",
    "+12",
    "12 5",
    "12*3+5;",
    "12*3+5 # comment",
    "lambda: 41",
    "12//3",
    "12%5",
    "(12*3+5",
    "12*3+5)",
    "()",
    "(" * 40 + "12" + ")" * 40,  # nested deeper than MAX_DEPTH
    "(" * 5000 + "12" + ")" * 5000,
    "12+" * 10000 + "5",
    "9" * 100000,
    "1" * 10 + "+5",
    "\x00",
    "\uff11\uff12*3+5",  # full-width digits are not ASCII digits
]


@pytest.mark.parametrize("completion", HOSTILE, ids=range(len(HOSTILE)))
def test_countdown_hostile_input_scores_zero_without_raising(completion):
    t0 = time.perf_counter()
    assert verify_countdown(completion, "12 5 3|41") == 0.0
    assert verify_countdown(completion, "12 5 3|41", partial_credit=0.5) == 0.0
    assert time.perf_counter() - t0 < 1.0


def test_parse_expression_limits():
    assert MAX_EXPR_CHARS >= 64 and MAX_DEPTH >= 8
    tree, _ = parse_expression("(" * MAX_DEPTH + "3" + ")" * MAX_DEPTH)
    assert evaluate(tree) == 3
    with pytest.raises(ValueError):
        parse_expression("(" * (MAX_DEPTH + 1) + "3" + ")" * (MAX_DEPTH + 1))
    with pytest.raises(ValueError):
        parse_expression("1+" * MAX_EXPR_CHARS + "1")


# ----------------------------------------------------------------------------- gsm8k


@pytest.mark.parametrize("text,want", [
    ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "72"),
    ("#### 1,000", "1000"),
    ("#### $1,000.", "1000"),
    ("#### 72 dollars\nmore text 5", "72"),
    ("first #### 3 then #### 4", "4"),  # the last ####
    ("#### -5", "-5"),
    ("#### 0.25", "0.25"),
    ("#### yes", "yes"),
    ("So she has 5 apples and 7 pears, 12 in all.", "12"),
    ("It costs $1,250.50 total.", "1250.50"),
    ("5-3=2", "2"),
    ("from 5-3 we get", "3"),  # "5-3" is 5 and 3, not -3
    ("the change is -4", "-4"),
    ("no numbers here", None),
    ("", None),
    ("####", None),
])
def test_extract_final_answer(text, want):
    assert extract_final_answer(text) == want


@pytest.mark.parametrize("completion,answer,want", [
    ("so the total is 72", "72", 1.0),
    ("#### 72", "72", 1.0),
    ("#### 72", "She sold 48+24 = <<48+24=72>>72 clips.\n#### 72", 1.0),
    ("#### 1,000", "1000", 1.0),
    ("1000.0", "1,000", 1.0),
    ("The answer is $1000.", "#### 1,000", 1.0),
    ("#### 0.5", ".5", 1.0),
    ("#### 0.50", "0.5", 1.0),
    ("#### 71", "72", 0.0),
    ("72 was wrong, it is 73", "72", 0.0),  # the last number counts
    ("#### 72\nthen 5", "72", 1.0),  # #### wins over later numbers
    ("no idea", "72", 0.0),
    ("", "72", 0.0),
    ("#### yes", "yes", 1.0),
    ("#### Yes", "yes", 0.0),
    ("72", "", 0.0),
])
def test_verify_gsm8k(completion, answer, want):
    got = verify_gsm8k(completion, answer)
    assert isinstance(got, float) and got == want


@pytest.mark.parametrize("completion", ["1," * 100000, "9" * 100000, "#### " + "9" * 100000, "-" * 100000,
                                        "$" * 100000 + "5", "\n" * 100000, "#### \x00", "\uff17\uff12"])
def test_gsm8k_and_scratchpad_hostile_input(completion):
    t0 = time.perf_counter()
    assert verify_gsm8k(completion, "72") == 0.0
    assert verify_scratchpad(completion, "72") == 0.0
    assert time.perf_counter() - t0 < 1.0


def test_verifiers_are_pure():
    # same inputs, same output, and repeated calls do not change later ones
    calls = [(verify_countdown, "12*3+5", "12 5 3|41"), (verify_gsm8k, "#### 72", "72"),
             (verify_scratchpad, "=722", "722")]
    for fn, c, a in calls:
        assert {fn(c, a) for _ in range(5)} == {1.0}


# ----------------------------------------------------------------------------- math_verify (optional extra)


def test_math_verify_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` raise ImportError
    with pytest.raises(ImportError, match=r"pip install 'gspo-bench\[math\]'"):
        verify_math("72", "72")


@pytest.mark.parametrize("completion,answer,want", [
    ("The answer is $\\frac{1}{2}$", "0.5", 1.0),
    ("\\boxed{72}", "reasoning <<3*24=72>>\n#### 72", 1.0),
    ("x = 1000", "1,000", 1.0),
    ("\\boxed{\\sqrt{4}}", "2", 1.0),
    ("so 71", "72", 0.0),
    ("", "72", 0.0),
    ("garbage", "72", 0.0),
])
def test_verify_math(completion, answer, want):
    pytest.importorskip("math_verify")
    got = verify_math(completion, answer)
    assert isinstance(got, float) and got == want
