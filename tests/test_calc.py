"""``calc`` (``tasks/environments/calc.py``): the calculator's arithmetic, the data's transcripts, and an
episode step by step: calls answered with results or errors, the answer scored, the turn cap."""

from __future__ import annotations

import pytest

from gspo_bench.tasks import load_task, make_environment, scripted
from gspo_bench.tasks.environments.calc import calculate, problem, steps
from gspo_bench.tasks.environments.tools import CompactTools


@pytest.fixture(scope="module")
def task():
    return load_task("calc", 0)


def env(task, max_turns=4):
    return make_environment("calc", task, tools=CompactTools(), max_turns=max_turns)


def test_the_calculator_is_exact_and_refuses_what_is_not_arithmetic():
    assert calculate("12*34") == "408"
    assert calculate("7/2") == "7/2" and calculate("(1+2)*3") == "9" and calculate("3-10") == "-7"
    for bad in ("1/0", "2**3", "__import__('os')", "1+", "9" * 30 + "*" + "9" * 30):
        with pytest.raises(ValueError):
            calculate(bad)


def test_the_solver_works_products_first_one_operation_at_a_time():
    assert steps("24+99*13") == [("99*13", "1287"), ("24+1287", "1311")]
    assert steps("55*36-59") == [("55*36", "1980"), ("1980-59", "1921")]
    assert problem("<|im_start|>user\n24+99*13=<|im_end|>") == "24+99*13"


def test_the_data_holds_disjoint_splits_and_solver_transcripts(task):
    row = task.train[0]
    assert row == {"prompt": "24+99*13=", "answer": "1311", "target": "[99*13]=1287\n[24+1287]=1311\n1311"}
    assert not set(task.train["prompt"]) & set(task.eval["prompt"])
    assert all("*" in p for p in task.eval["prompt"])  # a product in every problem
    for r in task.eval.select(range(50)):
        segments, reward = scripted(env(task), r)
        assert reward == 1.0 and "".join(t for _, t in segments) == r["target"]


def test_an_episode_answers_calls_and_errors_and_scores_the_answer(task):
    e = env(task)
    assert e.reset({"prompt": "24+99*13=", "answer": "1311"}) == "24+99*13="
    s = e.step("[99*13]")
    assert (s.observation, s.reward, s.done, s.info) == ("=1287\n", 0.0, False, {"tool_call": True,
                                                                                 "tool_error": False})
    s = e.step("[99*]")
    assert (s.observation, s.done, s.info["tool_error"]) == ("=error\n", False, True)
    s = e.step("1311")
    assert (s.reward, s.done, s.info["finish_reason"]) == (1.0, True, "stop")
    with pytest.raises(RuntimeError):
        e.step("1")
    e.reset({"prompt": "1+2*3=", "answer": "7"})
    assert e.step("8").reward == 0.0


def test_a_call_in_the_last_turn_ends_the_episode_without_reward(task):
    e = env(task, max_turns=2)
    e.reset({"prompt": "1+2*3=", "answer": "7"})
    assert not e.step("[2*3]").done
    last = e.step("[1+6]")
    assert last.done and last.reward == 0.0 and last.info["finish_reason"] == "max_turns"
