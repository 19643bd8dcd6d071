"""Trajectories: a rollout recorded as the token ids that went in and came out.

A ``Trajectory`` is one episode: the prompt's token ids, then its response as a list of ``Segment``s in
the order they were written, each the model's or the environment's, with the reward, why it ended
(``finish_reason``: ``stop`` at an eos, ``length`` at the token cap, or an environment's own reason) and
whatever the environment recorded (``info``). A model segment holds the ids the sampler drew, their
behaviour log-probs (the sampler's own, when the engine returned them) and the policy version of each
token; an environment segment holds the ids the environment appended (a tool's output, a user's reply),
which the model reads but is never trained on: the loss mask is 0 there.

Token in, token out. A response decoded to text and encoded again need not give back the ids that were
sampled (tokenizers merge across the join, normalise spaces, drop special tokens), so a trainer that
re-tokenised a conversation would score tokens the sampler never drew against log-probs of other ones.
Each turn is recorded as ids and the next turn's context is the concatenation of what came before: a
history is never re-tokenised. Text is derived when asked for (``Trajectory.text``) and not kept.

A single-turn response is one model segment: ``trajectories_from`` cuts a ``Generation`` (the engines'
layout, ``engine.py``) into one such trajectory per row, and ``collate`` lays trajectories back out in
that layout, a left-padded prompt block then a right-padded response block, with a loss mask and the
versions beside the response mask. For single-segment trajectories the round trip gives back the
generation's tensors exactly.

Versions. A token's version is the RL step whose weights sampled it: 0 for the warm start, ``v`` for the
weights after ``v`` RL steps. A response can span versions when new weights reach the sampler while it
is generating; environment tokens and padding are -1. A sample's staleness at the RL step that trains
on it is that step's version minus its oldest token's.

A single-turn rollout's MoE routes stay on the batch (``RolloutBatch.routes``), outside this record; a multi-turn
episode keeps its own (``Trajectory.routes``), taken from its last round, whose context held every token
before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from gspo_bench.rollout.engine import Generation

MODEL, ENVIRONMENT = "model", "environment"
"""Who wrote a segment."""
NO_VERSION = -1
"""The version of a token no policy sampled: an environment's, and padding."""


@dataclass(frozen=True)
class Segment:
    """A run of response tokens from one source: the model's (trained on) or the environment's (not)."""

    tokens: tuple[int, ...]
    """The token ids, in order."""
    source: str
    """``model`` or ``environment``."""
    logp: tuple[float, ...] | None = None
    """The model's: each token's behaviour log-prob, or None when the sampler gave none; environment: None."""
    versions: tuple[int, ...] = ()
    """The model's: the version that sampled each token; environment: empty."""

    def __post_init__(self):
        n = len(self.tokens)
        if self.source == MODEL:
            if len(self.versions) != n:
                raise ValueError(f"a model segment of {n} tokens needs {n} versions, got {len(self.versions)}")
            if self.logp is not None and len(self.logp) != n:
                raise ValueError(f"a model segment of {n} tokens needs {n} log-probs, got {len(self.logp)}")
        elif self.source == ENVIRONMENT:
            if self.logp is not None or self.versions:
                raise ValueError("an environment segment has neither log-probs nor versions")
        else:
            raise ValueError(f"segment source {self.source!r} is not allowed (allowed: {MODEL}, {ENVIRONMENT})")

    @classmethod
    def model(cls, tokens: Sequence[int], logp: Sequence[float] | None = None,
              version: int | Sequence[int] = 0) -> "Segment":
        """The model's tokens; ``version``: one for every token, or one per token."""
        tokens = tuple(int(t) for t in tokens)
        versions = (int(version),) * len(tokens) if isinstance(version, int) else tuple(int(v) for v in version)
        return cls(tokens, MODEL, None if logp is None else tuple(float(x) for x in logp), versions)

    @classmethod
    def environment(cls, tokens: Sequence[int]) -> "Segment":
        """The environment's tokens."""
        return cls(tuple(int(t) for t in tokens), ENVIRONMENT)

    @property
    def by_model(self) -> bool:
        return self.source == MODEL

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class Trajectory:
    """One episode, token in and token out: the prompt, the response's segments, the reward, how it ended."""

    prompt_ids: tuple[int, ...]
    """The prompt's token ids, no padding."""
    segments: list[Segment]
    """The response, in the order it was written."""
    reward: float | None = None
    """The episode's reward; None until it is scored."""
    finish_reason: str = "stop"
    """``stop`` (the model ended it: an eos), ``length`` (the token cap), or the environment's reason."""
    info: dict = field(default_factory=dict)
    """What the environment recorded."""
    routes: torch.Tensor | None = None
    """(layers, prompt + response tokens, k): the experts the sampler's MoE router chose for each of the
    trajectory's tokens, in order (-1: none recorded); kept for a multi-turn episode (``episodes.play``), whose
    rounds each route part of it. None: not recorded, or on the batch (``RolloutBatch.routes``)."""

    @property
    def response_ids(self) -> list[int]:
        """Every segment's tokens, concatenated."""
        return [t for s in self.segments for t in s.tokens]

    @property
    def loss_mask(self) -> list[int]:
        """Per response token: 1 on the model's, 0 on the environment's."""
        return [int(s.by_model) for s in self.segments for _ in s.tokens]

    @property
    def behaviour_logp(self) -> list[float] | None:
        """Per response token: the sampler's log-prob, 0 on the environment's; None when a model segment has
        none."""
        if any(s.by_model and s.logp is None for s in self.segments):
            return None
        return [x for s in self.segments for x in (s.logp if s.by_model else (0.0,) * len(s))]

    @property
    def versions(self) -> list[int]:
        """Per response token: the version that sampled it, -1 on the environment's."""
        return [v for s in self.segments for v in (s.versions if s.by_model else (NO_VERSION,) * len(s))]

    @property
    def model_tokens(self) -> int:
        """How many response tokens the model wrote (the ones the loss sees)."""
        return sum(len(s) for s in self.segments if s.by_model)

    def text(self, tokenizer) -> str:
        """The response decoded, special tokens skipped (as ``Generation.texts``)."""
        return tokenizer.decode(self.response_ids, skip_special_tokens=True)


@dataclass
class TrajectoryBatch:
    """Trajectories in the rollout layout (``engine.Generation``'s), with the loss mask and versions."""

    input_ids: torch.Tensor  # (B, P+T) [pad.. prompt | response .. pad]
    attention_mask: torch.Tensor  # (B, P+T) 1 on prompt and response tokens
    prompt_len: int  # P
    response_mask: torch.Tensor  # (B, T) float: 1 on every response token, the model's and the environment's
    loss_mask: torch.Tensor  # (B, T) float: 1 on the model's response tokens
    rollout_logp: torch.Tensor | None  # (B, T) behaviour log-probs, 0 elsewhere; None when a trajectory has none
    versions: torch.Tensor  # (B, T) long: the version that sampled each token, -1 elsewhere


def _prefix_lengths(mask_BW: torch.Tensor, left: bool, what: str) -> list[int]:
    # the 1s of each row as one run at the row's right end (left) or left end (right padding)
    W = mask_BW.shape[1]
    n_B = mask_BW.sum(-1)
    pos_W = torch.arange(W, device=mask_BW.device)
    want_BW = pos_W[None, :] >= (W - n_B)[:, None] if left else pos_W[None, :] < n_B[:, None]
    if not torch.equal(mask_BW, want_BW):
        raise ValueError(f"the {what} is not {'left' if left else 'right'}-padded: its mask has a gap")
    return n_B.tolist()


def trajectories_from(gen: Generation, truncated: torch.Tensor | None = None, version: int = 0) -> list[Trajectory]:
    """One trajectory per row of ``gen``: its prompt without the left padding, its response (up to and including
    the first eos, by ``response_mask``) as one model segment whose tokens carry ``gen.versions`` (the version
    that sampled each; None: every token ``version``).

    ``truncated`` (B,) bool, as the datamodule computes it: those rows finish with ``length``, the others
    with ``stop``; None: every row with ``stop``."""
    P = gen.prompt_len
    n_prompt = _prefix_lengths(gen.attention_mask[:, :P] > 0, True, "prompt")
    n_resp = _prefix_lengths(gen.response_mask > 0, False, "response")
    ids = gen.input_ids.tolist()
    logp = None if gen.rollout_logp is None else gen.rollout_logp.tolist()
    vers = None if gen.versions is None else gen.versions.tolist()
    cut = [False] * len(ids) if truncated is None else [bool(x) for x in truncated.tolist()]
    out = []
    for b, row in enumerate(ids):
        n = n_resp[b]
        segment = Segment.model(row[P:P + n], None if logp is None else logp[b][:n],
                                version if vers is None else vers[b][:n])
        out.append(Trajectory(tuple(row[P - n_prompt[b]:P]), [segment], None, "length" if cut[b] else "stop"))
    return out


def collate(trajs: Sequence[Trajectory], pad_id: int, *, prompt_len: int | None = None,
            response_len: int | None = None, device=None) -> TrajectoryBatch:
    """``trajs`` in the rollout layout: prompts left-padded with ``pad_id`` to ``P`` columns, responses
    right-padded to ``T``, where ``P`` and ``T`` are the longest prompt and response (at least ``prompt_len``
    and ``response_len``, to match a wider block). ``rollout_logp`` is None unless every trajectory has
    behaviour log-probs."""
    if not trajs:
        raise ValueError("collate needs at least one trajectory")
    prompts = [t.prompt_ids for t in trajs]
    responses = [t.response_ids for t in trajs]
    P = max([len(p) for p in prompts] + [prompt_len or 0])
    T = max([len(r) for r in responses] + [response_len or 0])
    B = len(trajs)
    input_ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, P + T), dtype=torch.long)
    response_mask = torch.zeros((B, T), dtype=torch.float32)
    loss_mask = torch.zeros((B, T), dtype=torch.float32)
    versions = torch.full((B, T), NO_VERSION, dtype=torch.long)
    logps = [t.behaviour_logp for t in trajs]
    rollout_logp = None if any(lp is None for lp in logps) else torch.zeros((B, T), dtype=torch.float32)
    for b, (t, prompt, resp) in enumerate(zip(trajs, prompts, responses)):
        n_p, n_r = len(prompt), len(resp)
        # [pad.. prompt | response .. pad]: the prompt ends at column P, the response starts there
        input_ids[b, P - n_p:P] = torch.tensor(prompt, dtype=torch.long)
        input_ids[b, P:P + n_r] = torch.tensor(resp, dtype=torch.long)
        attention_mask[b, P - n_p:P + n_r] = 1
        response_mask[b, :n_r] = 1.0
        loss_mask[b, :n_r] = torch.tensor(t.loss_mask, dtype=torch.float32)
        versions[b, :n_r] = torch.tensor(t.versions, dtype=torch.long)
        if rollout_logp is not None:
            rollout_logp[b, :n_r] = torch.tensor(logps[b], dtype=torch.float32)
    out = TrajectoryBatch(input_ids, attention_mask, P, response_mask, loss_mask, rollout_logp, versions)
    if device is not None:
        for k in ("input_ids", "attention_mask", "response_mask", "loss_mask", "rollout_logp", "versions"):
            v = getattr(out, k)
            if v is not None:
                setattr(out, k, v.to(device))
    return out
