"""Multi-turn episodes: a model and an environment take turns, token in and token out.

``play`` runs a batch of episodes of a multi-turn environment (``calc``, ``guess``) with any engine. Each
round, every episode still going is sampled as one row: its context is the prompt's ids and every segment
so far (the model's sampled ids, the environment's appended ids), never decoded and encoded again. A
model's turn ends at the first eos, or at the tool format's closing marker (``]``, ``</tool_call>``): the
engine may have sampled on past the marker, and those tokens are dropped, as a stop string would drop
them. The turn's text goes to the environment's ``step``; its observation, encoded once and cut to
``env.max_tool_tokens``, is appended as an environment segment, which the loss never sees
(``trajectory.Segment``). An episode ends when the environment says so (an answer, a solved puzzle, its
``env.max_turns``), or when its response reaches ``rollout.max_new_tokens`` tokens, the model's and the
environment's together (``length``: the one cap Dr. GRPO's constant and DAPO's overlong shaping read).

A truncated model turn is still handed to the environment, which scores it as the answer it is (a cut call
is no call), so a truncated episode's reward is what single-turn truncation gets: the verifier's.

Randomness. Every round is one engine call. Under ``rollout.seeding: request`` a completion's generator is
keyed by its row; round ``k`` keys row ``r`` as ``r + k * TURN_STRIDE``, so the turns of an episode draw
from generators of their own and an episode's tokens do not depend on the other episodes beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from gspo_bench.config import EnvConfig
from gspo_bench.rollout.engine import Generation, prompt_ids
from gspo_bench.rollout.trajectory import Segment, Trajectory, collate
from gspo_bench.tasks import Environment, Task, make_environment
from gspo_bench.tasks.environments import build_kwargs, environment_name, is_multi_turn, uses_tool
from gspo_bench.tasks.environments.tools import tool_format

TURN_STRIDE = 1 << 24
"""Round ``k`` of an episode keys its completion generator at ``row + k * TURN_STRIDE`` (request seeding)."""

Sample = Callable[[list[list[int]], list[int], int, int], Generation]
"""``sample(contexts, rows, round, max_new_tokens)``: one engine call on ``contexts`` (token ids), those of the
episodes ``rows`` (their indices among ``play``'s rows), in round ``round`` of the episodes."""


@dataclass
class Episodes:
    """How a multi-turn environment is played: which, over which task, with which tool format and bounds."""

    environment: str
    """The environment's registered name."""
    task: Task
    """The task it is played over (its verifier scores answers)."""
    tools: object
    """The tool format (``tasks.environments.tools``: compact or chat); None for an environment without a tool
    (its turns end at an eos only)."""
    max_turns: int
    """``env.max_turns``: the model's turns per episode at most."""
    max_tool_tokens: int
    """``env.max_tool_tokens``: an environment answer's tokens at most."""
    params: dict = field(default_factory=dict)
    """More of the environment's own constructor arguments."""

    def make(self) -> Environment:
        """A fresh environment for one episode."""
        offered = build_kwargs(self.environment, tools=self.tools, max_turns=self.max_turns)
        return make_environment(self.environment, self.task, **offered, **self.params)


def episodes_for(task: Task, env: EnvConfig, tokenizer) -> Episodes | None:
    """How ``task`` is played under ``env`` with ``tokenizer``'s model: None for a single-turn environment (one
    completion per prompt, the verifier's reward), else its ``Episodes``, the tool format chosen and checked
    for the tokenizer (``tools.tool_format``: a ValueError where it cannot write a call)."""
    name = environment_name(task, env.name)
    if not is_multi_turn(name):
        return None
    tools = tool_format(tokenizer, env.tool_format) if uses_tool(name) else None
    return Episodes(name, task, tools, env.max_turns, env.max_tool_tokens)


def turn_end(tokenizer, ids: list[int], close: str | None, eos: set[int]) -> int | None:
    """How many of ``ids`` (one turn's sample) the turn keeps when it calls a tool: up to and including the
    token that completes ``close`` in the decoded text; None when the text holds no ``close`` before an eos.
    Whether a prefix's text holds ``close`` only ever turns from no to yes as the prefix grows, so the shortest
    one is found by bisection."""
    if close is None:  # an environment without a tool: a turn ends at an eos only
        return None
    body = ids[:-1] if ids and ids[-1] in eos else ids

    def holds(k: int) -> bool:
        return close in tokenizer.decode(body[:k], skip_special_tokens=False)

    if not body or not holds(len(body)):
        return None
    lo, hi = 1, len(body)
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def play(episodes: Episodes, tokenizer, rows: list[dict], sample: Sample, *, max_new_tokens: int,
         eos: list[int], version: int = 0) -> list[Trajectory]:
    """One episode per row of ``rows`` (``prompt``, ``answer``), played to its end (module docstring). Each
    trajectory's ``reward`` is its episode's return and its ``info`` counts ``turns``, ``tool_calls``,
    ``tool_errors`` and each model turn's tokens (``turn_lengths``). ``version``: the tokens' version when the
    engine records none."""
    envs = [episodes.make() for _ in rows]
    first = [env.reset(row) for env, row in zip(envs, rows)]
    texts = [o for o in first if isinstance(o, str)]
    encoded = iter(prompt_ids(tokenizer, texts) if texts else [])
    prompts = [next(encoded) if isinstance(o, str) else list(o) for o in first]
    trajs = [Trajectory(tuple(p), [], 0.0, "stop", {"turns": 0, "tool_calls": 0, "tool_errors": 0,
                                                    "turn_lengths": []}) for p in prompts]
    stop, close = set(eos), None if episodes.tools is None else episodes.tools.close
    active, round_ = list(range(len(rows))), 0
    while active:
        budget = {i: max_new_tokens - len(trajs[i].response_ids) for i in active}
        gen = sample([list(trajs[i].prompt_ids) + trajs[i].response_ids for i in active], active, round_,
                     max(budget.values()))
        P = gen.prompt_len
        going = []
        for j, i in enumerate(active):
            t, env = trajs[i], envs[i]
            n = int(gen.response_mask[j].sum())
            ids = gen.input_ids[j, P:P + n].tolist()
            keep = turn_end(tokenizer, ids, close, stop)  # a call: up to its closing marker
            ended = keep is not None or (bool(ids) and ids[-1] in stop)  # a call, or an eos
            keep = n if keep is None else keep
            if keep > budget[i]:  # past this episode's own cap (the call's is the largest of the episodes')
                keep, ended = budget[i], False
            if gen.routes is not None:  # this round's context held every token before: its routes are the record's
                n_ctx = len(t.prompt_ids) + len(t.response_ids)
                t.routes = gen.routes[:, j, P - n_ctx:P + keep].clone()
            logp = None if gen.rollout_logp is None else gen.rollout_logp[j, :keep].tolist()
            vers = version if gen.versions is None else gen.versions[j, :keep].tolist()
            t.segments.append(Segment.model(ids[:keep], logp, vers))
            t.info["turns"] += 1
            t.info["turn_lengths"].append(keep)
            step = env.step(tokenizer.decode(ids[:keep], skip_special_tokens=True))
            t.reward += step.reward
            t.info["tool_calls"] += int(bool(step.info.get("tool_call")))
            t.info["tool_errors"] += int(bool(step.info.get("tool_error")))
            room = max_new_tokens - len(t.response_ids)
            if not ended:  # the turn reached the response's cap mid-way
                t.finish_reason = "length"
                continue
            if step.done or t.info["turns"] >= episodes.max_turns:
                t.finish_reason = step.info.get("finish_reason", "stop") if step.done else "max_turns"
                continue
            if room <= 0:  # a call at the cap: no room for its answer
                t.finish_reason = "length"
                continue
            obs = step.observation
            obs_ids = (prompt_ids(tokenizer, [obs])[0] if isinstance(obs, str) else list(obs or []))
            obs_ids = obs_ids[:min(episodes.max_tool_tokens, room)]
            t.segments.append(Segment.environment(obs_ids))
            if len(t.response_ids) >= max_new_tokens:
                t.finish_reason = "length"
                continue
            going.append(i)
        active, round_ = going, round_ + 1
    return trajs


def episode_stats(trajs: list[Trajectory], max_turns: int) -> dict[str, float]:
    """``env/*``: model turns, tool calls and the share of calls that failed per trajectory, the share of a
    trajectory's response tokens the environment wrote, and the mean tokens of each model turn (turn k over the
    trajectories that reached it)."""
    n = max(1, len(trajs))
    calls = sum(t.info.get("tool_calls", 0) for t in trajs)
    stats = {
        "env/turns_mean": sum(t.info.get("turns", 0) for t in trajs) / n,
        "env/tool_calls_mean": calls / n,
        # failed calls / calls (0 when none was made)
        "env/tool_errors_frac": sum(t.info.get("tool_errors", 0) for t in trajs) / max(1, calls),
        # mean over trajectories of (environment tokens / response tokens)
        "env/env_tokens_frac": sum((len(t.response_ids) - t.model_tokens) / max(1, len(t.response_ids))
                                   for t in trajs) / n,
    }
    for k in range(max_turns):
        lengths = [t.info["turn_lengths"][k] for t in trajs if len(t.info.get("turn_lengths", ())) > k]
        if lengths:
            stats[f"env/turn{k + 1}_length_mean"] = sum(lengths) / len(lengths)
    return stats


def as_generation(trajs: list[Trajectory], tokenizer, pad_id: int) -> tuple[Generation, torch.Tensor]:
    """The trajectories in the engines' layout (``collate``), with their decoded responses and their MoE routes
    (when every one has them), and their loss mask."""
    laid = collate(trajs, pad_id)
    texts = [t.text(tokenizer) for t in trajs]
    routes = None
    if trajs and all(t.routes is not None for t in trajs):
        # (layers, B, P + T, k) in the layout's columns: trajectory b's tokens start at P - len(prompt); tokens
        # the last round never read (an answer appended after it) stay -1
        L, _, k = trajs[0].routes.shape
        routes = torch.full((L, len(trajs), laid.input_ids.shape[1], k), -1, dtype=trajs[0].routes.dtype)
        for b, t in enumerate(trajs):
            start = laid.prompt_len - len(t.prompt_ids)
            routes[:, b, start:start + t.routes.shape[1]] = t.routes
    return (Generation(laid.input_ids, laid.attention_mask, laid.prompt_len, laid.response_mask, laid.rollout_logp,
                       texts, routes, laid.versions), laid.loss_mask)
