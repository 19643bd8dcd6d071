"""``guess`` (``tasks/environments/guess.py``): bisection finds every number, the feedback is right, and the
reward falls with the turns used."""

from __future__ import annotations

import pytest

from gspo_bench.tasks import load_task, make_environment, scripted
from gspo_bench.tasks.environments.guess import bisect, reward
from gspo_bench.tasks.environments.tools import CompactTools


@pytest.fixture(scope="module")
def task():
    return load_task("guess", 0)


def test_bisection_finds_every_number_within_five_guesses():
    for secret in range(1, 17):
        guesses = bisect(1, 16, secret)
        assert guesses[-1] == (secret, None) and len(guesses) <= 5
    assert bisect(1, 16, 5) == [(8, "lower"), (4, "higher"), (6, "lower"), (5, None)]


def test_the_reward_falls_with_the_turns_used():
    # 1 - (t - 1) / T
    assert [reward(t, 6) for t in (1, 2, 4, 6)] == [1.0, pytest.approx(5 / 6), 0.5, pytest.approx(1 / 6)]


def test_an_episode_says_higher_or_lower_and_ends_when_right(task):
    e = make_environment("guess", task, tools=CompactTools(), max_turns=6)
    e.reset({"prompt": "guess 1-16:", "answer": "11"})
    assert e.step("[8]").observation == "=higher\n"
    assert e.step("[14]").observation == "=lower\n"
    bad = e.step("[x]")
    assert bad.observation == "=error\n" and bad.info["tool_error"] and not bad.done
    right = e.step("[11]")
    assert right.done and right.reward == pytest.approx(1 - 3 / 6) and right.info["finish_reason"] == "solved"
    e.reset({"prompt": "guess 1-16:", "answer": "3"})
    stopped = e.step("3")  # no guess: the episode ends with nothing
    assert stopped.done and stopped.reward == 0.0


def test_the_solver_transcripts_are_the_data_targets(task):
    for row in task.eval.select(range(30)):
        env = make_environment("guess", task, tools=CompactTools(), max_turns=6)
        segments, r = scripted(env, row)
        assert "".join(t for _, t in segments) == row["target"] and r > 0
