"""``single_turn``: today's rollout as an environment: the row's prompt, one completion, the task's verifier as
the reward, done after one step. Its ``score`` is ``Task.score``, the verifier in its sandbox under a time limit
per completion, so the rollouts' rewards through it are the verifier's, value for value."""

from __future__ import annotations

from gspo_bench.tasks.environments.base import Observation, Step, register_environment
from gspo_bench.tasks.task import Task


@register_environment("single_turn")
class SingleTurn:
    """One prompt, one completion, the task's verifier as the reward; done after the first step."""

    def __init__(self, task: Task):
        self.task = task
        self.row: dict | None = None  # the episode's row, None between episodes

    def reset(self, row: dict) -> Observation:
        self.row = row
        return row["prompt"]

    def step(self, action: str | list[int]) -> Step:
        """``action``: the completion's text (the verifier reads text; decode token ids first). The reward is
        ``Task.verify``: in this process, without a time limit (a batch goes through ``score``)."""
        if self.row is None:
            raise RuntimeError("single_turn: step() before reset(), or after the episode ended")
        if not isinstance(action, str):
            raise TypeError("single_turn scores text: decode the completion's token ids before step()")
        answer, self.row = self.row["answer"], None
        return Step(None, self.task.verify(action, answer), True)

    def score(self, completions: list[str], answers: list[str], timeout: float) -> tuple[list[float], int]:
        """``Task.score``: the verifier in its sandbox, ``timeout`` seconds per completion (0: in this process,
        without a limit)."""
        return self.task.score(completions, answers, timeout)
