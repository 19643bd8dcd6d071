"""Environments behind the tasks: the reset/step protocol, its registry, single_turn (gspo_bench.tasks.environments)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gspo_bench.tasks import (ENVIRONMENTS, BatchEnvironment, Environment, SingleTurn, Step, load_task,
                              make_environment, register_environment)


@pytest.fixture(scope="module")
def arith(tmp_path_factory):
    """The built-in arith task's kind and verifier, on few rows."""
    spec = tmp_path_factory.mktemp("task") / "add.yaml"
    spec.write_text("name: add\nkind: arith\nparams: {min_digits: 1, max_digits: 2, n_train: 30, n_eval: 10}\n")
    return load_task(str(spec), seed=0)


class GuessANumber:
    """A toy two-turn environment: guess the row's answer; a wrong first guess hears "higher" or "lower" and
    gets one more try. 1 for a right guess, 0 otherwise."""

    def __init__(self, task, tries: int = 2):
        self.tries = tries
        self.secret: int | None = None

    def reset(self, row: dict):
        self.secret, self.left = int(row["answer"]), self.tries
        return row["prompt"] + " guess:"

    def step(self, action):
        guess = int(action)
        self.left -= 1
        if guess == self.secret:
            return Step(None, 1.0, True, {"finish_reason": "solved"})
        if self.left == 0:
            return Step(None, 0.0, True, {"finish_reason": "out_of_tries"})
        return Step(" higher" if guess < self.secret else " lower", 0.0, False)


@pytest.fixture
def guess():
    register_environment("guess_twice")(GuessANumber)
    try:
        yield
    finally:
        ENVIRONMENTS.pop("guess_twice", None)


def test_a_two_turn_environment_by_hand(guess):
    env = make_environment("guess_twice", task=None)
    assert isinstance(env, Environment) and not isinstance(env, BatchEnvironment)
    assert env.reset({"prompt": "3+4=", "answer": "7"}) == "3+4= guess:"
    assert env.step("5") == Step(" higher", 0.0, False)
    assert env.step("7") == Step(None, 1.0, True, {"finish_reason": "solved"})
    # a new episode, too low then too high: out of tries
    env.reset({"prompt": "9+9=", "answer": "18"})
    assert env.step("20") == Step(" lower", 0.0, False)
    assert env.step("17") == Step(None, 0.0, True, {"finish_reason": "out_of_tries"})
    # params reach the factory
    one = make_environment("guess_twice", task=None, tries=1)
    one.reset({"prompt": "1+1=", "answer": "2"})
    assert one.step("3").done


def test_single_turn_reward_is_the_task_verifier(arith):
    env = make_environment("single_turn", arith)
    assert isinstance(env, SingleTurn) and isinstance(env, BatchEnvironment)
    rows = [{"prompt": p, "answer": a} for p, a in zip(arith.eval["prompt"], arith.eval["answer"])]
    for row, completion in zip(rows, ["wrong", *arith.eval["target"][1:]]):
        assert env.reset(row) == row["prompt"]
        step = env.step(completion)
        assert step == Step(None, arith.verify(completion, row["answer"]), True)
    env.reset(rows[0])
    assert env.step(f" {rows[0]['answer']} \n").reward == 1.0  # the exact verifier strips


def test_single_turn_batch_scores_as_the_per_episode_steps(arith):
    env = SingleTurn(arith)
    answers = list(arith.eval["answer"])
    completions = [a if i % 3 else a + "0" for i, a in enumerate(answers)]  # a third wrong
    one_by_one = []
    for c, a in zip(completions, answers):
        env.reset({"prompt": "", "answer": a})
        one_by_one.append(env.step(c).reward)
    assert 0.0 in one_by_one and 1.0 in one_by_one
    # the sandboxed scorer (a worker process, a time limit) and the in-process one agree
    assert env.score(completions, answers, 1.0) == (one_by_one, 0)
    assert env.score(completions, answers, 0) == (one_by_one, 0)
    assert env.score(completions, answers, 1.0) == arith.score(completions, answers, 1.0)


def test_single_turn_steps_once_per_episode_and_on_text(arith):
    env = SingleTurn(arith)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("1")
    env.reset({"prompt": "1+1=", "answer": "2"})
    with pytest.raises(TypeError, match="decode"):
        env.step([5, 6])
    assert env.step("2").done
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("2")


def test_an_unknown_environment_names_the_registered_ones(arith):
    with pytest.raises(ValueError) as e:
        make_environment("chess", arith)
    assert str(e.value) == "unknown environment 'chess' (allowed: calc, guess, single_turn)"
    with pytest.raises(ValueError, match="'single_turn' is registered already"):
        register_environment("single_turn")(SingleTurn)


def test_a_new_environment_is_one_file_in_the_package(capsys):
    # the package imports every module beside base.py: a file dropped there registers itself, and `list` names it
    import importlib
    import sys

    from gspo_bench.cli.main import main
    from gspo_bench.tasks import environments

    folder = Path(environments.__file__).parent
    mine = folder / "toy_countdown_env.py"
    mine.write_text('from gspo_bench.tasks.environments.base import Step, register_environment\n\n\n'
                    '@register_environment("toy_countdown")\nclass ToyCountdown:\n'
                    '    """Says done after three turns."""\n\n'
                    '    def __init__(self, task):\n        self.turns = 0\n\n'
                    '    def reset(self, row):\n        self.turns = 0\n        return row["prompt"]\n\n'
                    '    def step(self, action):\n        self.turns += 1\n'
                    '        return Step(None if self.turns == 3 else "go on", float(self.turns == 3), self.turns == 3)\n')
    saved = dict(environments.ENVIRONMENTS)
    try:
        environments.ENVIRONMENTS.pop("toy_countdown", None)
        importlib.reload(environments)
        env = environments.make_environment("toy_countdown", None)
        env.reset({"prompt": "count"})
        assert [env.step("x").done for _ in range(3)] == [False, False, True]
        assert main(["list"]) == 0
        assert "toy_countdown (Says done after three turns)" in capsys.readouterr().out
    finally:
        mine.unlink()
        sys.modules.pop("gspo_bench.tasks.environments.toy_countdown_env", None)
        environments.ENVIRONMENTS.clear()
        environments.ENVIRONMENTS.update(saved)


@pytest.mark.parametrize("sets, needle", [
    (["env.max_turns=0"], "env.max_turns=0 must be an int >= 1"),
    (["env.name=maze"], "unknown environment 'maze'"),
    (["env.tool_format=xml"], "env.tool_format='xml' is not allowed"),
    (["env.max_tool_tokens=0"], "env.max_tool_tokens=0 must be an int >= 1"),
    (["rollout.max_staleness=1", "rollout.partial=true"], "rollout.partial=true is not supported with the "
                                                            "multi-turn environment 'calc'"),
])
def test_bad_environment_settings_are_one_line_exit_2(sets, needle, tmp_path, capsys):
    from gspo_bench.cli.main import main

    args = ["run", "--task", "calc", "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--no-progress"]
    for s in sets:
        args += ["--set", s]
    code = main(args)
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert code == 2 and len(text.splitlines()) == 1 and needle in text, text
    assert not (tmp_path / "m.db").exists()


def test_a_tool_environment_with_a_tokenizer_that_cannot_write_a_call_is_exit_2(tmp_path, capsys):
    """A checkpoint whose vocabulary has digits and + * = only: it could never write ``[`` or ``]``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from gspo_bench.cli.main import main
    from gspo_bench.models.builtin import _one_char_per_token

    tok = _one_char_per_token(["<pad>", "<bos>", "<eos>", *"0123456789+-*="])
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         head_dim=16, max_position_embeddings=128, pad_token_id=0,
                                         bos_token_id=1, eos_token_id=2))
    folder = tmp_path / "digits"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    code = main(["run", "--task", "calc", "--model", str(folder), "--tracking-uri", f"sqlite:///{tmp_path}/m.db",
                 "--no-progress"])
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert code == 2 and len(text.splitlines()) == 1, text
    assert "environment 'calc'" in text and "cannot write a compact tool call" in text
    assert not (tmp_path / "m.db").exists()
