"""The rollout producer: it owns the engine that samples, takes the trainer's weights tagged with their version,
and puts each RL step's rollout into a bounded buffer for the trainer to take.

A rollout is ``prompts_per_step`` prompts, ``G`` samples each, scored by the task's environment, optionally
shaped and filtered (DAPO), with advantages from ``rollout.advantage_estimator``. Prompts for step ``s``
come from a generator seeded by ``(seed, s)``, so every algorithm sees the same prompts in the same order.

Weights. ``sync_weights(state, version)`` hands the producer the weights to sample with from then on, after
``version`` RL steps (0: the warm start). A producer that shares its process with the trainer holds the
policy itself and is handed the policy's own tensors: nothing is copied. Every sampled token records the
version of the weights that drew it (``RolloutBatch.versions``); ``rollout.staleness = k`` samples from the
weights of ``k`` versions before (``precision.SamplerWeights``).

Randomness. The engine draws from the producer's ``draws`` (``rollout.draws``), never from torch's global
generator: one stream for the run (``rollout.seeding: stream``), shared with the held-out evaluation in
the order they sample, or a generator per completion keyed by ``(seed, step, round, row)`` (``request``).

The buffer. ``produce(step)`` samples step ``step``'s rollout into the buffer, ``take(step)`` hands it to
the trainer; at most ``capacity`` rollouts wait. The synchronous loop (``RolloutDataModule``) produces
one and trains on it, then syncs the new weights and produces the next.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from gspo_bench.config import RolloutConfig
from gspo_bench.core import advantages as adv
from gspo_bench.core import collectives as ddp
from gspo_bench.rollout.draws import Draws, RequestDraws, StreamDraws
from gspo_bench.rollout.engine import Generation, eos_ids, prompt_ids
from gspo_bench.rollout.episodes import TURN_STRIDE, Episodes, as_generation, episode_stats, play
from gspo_bench.rollout.engines import (ENGINES, Capabilities, EngineSetup, RolloutEngine, build_engine,
                                        resolve_engine)
from gspo_bench.rollout.precision import SamplerWeights
from gspo_bench.rollout.trajectory import Trajectory, collate, trajectories_from
from gspo_bench.tasks import SingleTurn, Task


@dataclass
class RolloutBatch:
    input_ids: torch.Tensor  # (B, P+T)
    attention_mask: torch.Tensor  # (B, P+T)
    prompt_len: int  # P
    response_mask: torch.Tensor  # (B, T)
    rollout_logp: torch.Tensor | None  # (B, T) the sampler's log-probs, when the engine returned them
    scores: torch.Tensor  # (B,) verifier reward
    rewards: torch.Tensor  # (B,) reward after shaping (what advantages see)
    advantages: torch.Tensor | None  # (B,) rollout.advantage_estimator's; None for an algorithm with its own (GAE)
    texts: list[str]
    answers: list[str]
    stats: dict[str, float] = field(default_factory=dict)
    routes: torch.Tensor | None = None  # (layers, B, P+T, k) the sampler's experts (MoE), -1 = not recorded
    truncated: torch.Tensor | None = None  # (B,) bool: the response hit max_new_tokens without an eos
    versions: torch.Tensor | None = None  # (B, T) long: the weights' version that sampled each token, -1 elsewhere
    loss_mask: torch.Tensor | None = None  # (B, T) float: 1 on the model's response tokens (None: response_mask)
    trajectories: list[Trajectory] = field(default_factory=list)  # the record the tensors were laid out from

    TENSORS = ("input_ids", "attention_mask", "response_mask", "rollout_logp", "scores", "rewards", "advantages",
               "routes", "truncated", "versions", "loss_mask")

    def __post_init__(self):
        if self.loss_mask is None:  # a batch made by hand, one model segment per row: the loss sees the response
            self.loss_mask = self.response_mask

    def to(self, device) -> "RolloutBatch":
        for k in self.TENSORS:
            v = getattr(self, k)
            if v is not None:
                setattr(self, k, v.to(device))
        return self

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, idx: slice) -> "RolloutBatch":
        """The rollout restricted to rows ``idx`` (e.g. one rank's share of a global batch); stats kept."""
        return RolloutBatch(self.input_ids[idx], self.attention_mask[idx], self.prompt_len, self.response_mask[idx],
                            None if self.rollout_logp is None else self.rollout_logp[idx], self.scores[idx],
                            self.rewards[idx], None if self.advantages is None else self.advantages[idx],
                            self.texts[idx], self.answers[idx],
                            dict(self.stats), None if self.routes is None else self.routes[:, idx],
                            None if self.truncated is None else self.truncated[idx],
                            None if self.versions is None else self.versions[idx], self.loss_mask[idx],
                            self.trajectories[idx])


def merge_generations(gens: list[Generation], pad_id: int) -> Generation:
    """Concatenate generations of different prompt/response widths (left-pad prompts, right-pad responses)."""
    if len(gens) == 1:
        return gens[0]
    P = max(g.prompt_len for g in gens)
    T = max(g.response_mask.shape[1] for g in gens)

    def pad(x, left, right, value):
        return torch.nn.functional.pad(x, (left, right), value=value)

    ids, attn, rmask, logp, routes, versions = [], [], [], [], [], []
    for g in gens:
        lp, rp = P - g.prompt_len, T - g.response_mask.shape[1]
        ids.append(pad(pad(g.input_ids, lp, 0, pad_id), 0, rp, pad_id))
        attn.append(pad(pad(g.attention_mask, lp, 0, 0), 0, rp, 0))
        rmask.append(pad(g.response_mask, 0, rp, 0.0))
        if g.rollout_logp is not None:
            logp.append(pad(g.rollout_logp, 0, rp, 0.0))
        if g.routes is not None:
            # routes (L, B, W, k): the same columns as input_ids, -1 (not recorded) in the new padding
            routes.append(pad(g.routes.transpose(2, 3), lp, rp, -1).transpose(2, 3))
        if g.versions is not None:
            versions.append(pad(g.versions, 0, rp, -1))
    return Generation(torch.cat(ids), torch.cat(attn), P, torch.cat(rmask),
                      torch.cat(logp) if len(logp) == len(gens) else None, sum((g.texts for g in gens), []),
                      torch.cat(routes, dim=1) if len(routes) == len(gens) else None,
                      torch.cat(versions) if len(versions) == len(gens) else None)


def select(g: Generation, idx: torch.Tensor) -> Generation:
    il = idx.tolist()
    return Generation(g.input_ids[idx], g.attention_mask[idx], g.prompt_len, g.response_mask[idx],
                      None if g.rollout_logp is None else g.rollout_logp[idx], [g.texts[i] for i in il],
                      None if g.routes is None else g.routes[:, idx], None if g.versions is None else g.versions[idx])


class EngineHandle:
    """One user's hold on the run's engine (the rollouts', the evaluation's): the engine, built from the
    registry at its first use unless handed in, the draws its calls read, and the weights it samples.

    Two handles may share one engine object where one lives per process (vLLM): each hands it its own
    weights before it samples, and the engine pushes them only when they changed."""

    def __init__(self, settings: RolloutConfig, tokenizer, *, seed: int, kind: str, engine: RolloutEngine | None,
                 setup: EngineSetup, stream: StreamDraws):
        self.s, self.tokenizer, self.seed, self.kind = settings, tokenizer, seed, kind
        self.engine = engine
        self.given = engine is not None  # handed in: never replaced by the registry's
        self.setup, self.stream = setup, stream
        self.model = None  # what it resolves ``auto`` for when it builds its own (the first model sampled)

    def name(self, model=None) -> str:
        """The engine that samples: the one handed in, else ``rollout.engine`` resolved for ``model``."""
        if self.given:
            return self.engine.name
        return resolve_engine(self.s.engine, model if model is not None else self.model, held=True)

    def capabilities(self, model=None) -> Capabilities:
        return type(self.engine).capabilities if self.given else ENGINES[self.name(model)].capabilities

    def get(self, model) -> RolloutEngine:
        """The engine object, built from the registry at its first use (and again should the name change)."""
        self.model = model
        name = self.name(model)
        if self.engine is None or self.engine.name != name:
            self.close()
            self.engine = build_engine(name, self.setup)
        return self.engine

    def draws(self, step: int, round_: int, rows: list[int] | None = None) -> Draws:
        """What call ``(step, round_)`` draws from: the run's stream, or a generator per completion
        (``rows``: each completion's index among the step's; default its place in the call)."""
        if self.s.seeding == "stream":
            return self.stream
        return RequestDraws(self.seed, self.kind, step, round_, rows=rows)

    def generate(self, model, prompts: list[str] | list[list[int]], *, version: int = 0, step: int = 0,
                 round_: int = 0, rows: list[int] | None = None, **kwargs) -> Generation:
        """Sample ``prompts`` (text, encoded here once, or token ids) from ``model`` (weights of version
        ``version``): the engine is handed the weights first (``sync_weights``), then the prompts' token ids,
        and samples with this call's draws."""
        engine = self.get(model)
        engine.sync_weights(model.state_dict(), version)
        ids = prompt_ids(self.tokenizer, prompts) if prompts and isinstance(prompts[0], str) else prompts
        if kwargs.get("swap") is not None:  # partial rollouts: the engine tags tokens from this version on
            kwargs["version"] = version
        return engine.sample(model, self.tokenizer, ids, draws=self.draws(step, round_, rows), **kwargs)

    def take_sync_time(self) -> float | None:
        return None if self.engine is None else self.engine.take_sync_time()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


class RolloutProducer:
    """Prompts -> G samples from the weights it was last handed -> environment rewards -> advantages, into a
    buffer of ``capacity`` rollouts (see the module docstring)."""

    def __init__(self, task: Task, tokenizer, settings: RolloutConfig, *, seed: int, handle: EngineHandle,
                 model=None, record_routes: bool = False, group_advantages: bool = True, sampler_logp: bool = False,
                 capacity: int = 1, episodes: Episodes | None = None):
        """``handle``: the engine it samples with; ``model``: the module the engine runs (the policy itself when
        the producer shares the trainer's process; ``sync_weights`` loads other weights into it);
        ``record_routes``: keep the sampler's MoE experts; ``group_advantages``: compute advantages here
        (False for an algorithm with its own, PPO's GAE); ``sampler_logp``: keep the sampler's log-probs
        whatever the settings (a loss weighted against the sampler); ``episodes``: a multi-turn environment's
        (``episodes.Episodes``), whose episodes are played turn by turn (None: one completion per prompt, scored
        by the task's verifier)."""
        self.task, self.tokenizer, self.s, self.seed = task, tokenizer, settings, seed
        self.handle, self.model = handle, model
        self.environment = SingleTurn(task)  # what scores the completions: the task's verifier, batch by batch
        self.episodes = episodes
        self.record_routes, self.group_advantages, self.sampler_logp = record_routes, group_advantages, sampler_logp
        self.sampler = SamplerWeights(settings.dtype, settings.staleness)
        self.version = 0  # the RL steps behind the weights it holds
        self.capacity = capacity
        self.buffer: deque[tuple[int, RolloutBatch]] = deque()
        self.timeouts = 0  # verifier calls past their time limit since the last rollout's stats
        self.sampled = 0  # completions generated
        self.rank, self.world = 0, 1  # this process's share of the prompts
        # partial rollouts (rollout.partial, in the asynchronous worker): called between two decode steps, it
        # hands over newer weights if any came (``sync_weights``) and says whether it did
        self.refresh: Callable[[], bool] | None = None

    # -- weights ------------------------------------------------------------------------------------
    @torch.no_grad()
    def sync_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Sample with ``state``'s weights from now on, tagged ``version`` (the RL steps behind them). The
        trainer's own tensors (a producer in its process) are taken as they are; others are copied in."""
        own = self.model.state_dict()
        if any(own[k].data_ptr() != v.data_ptr() for k, v in state.items()):
            self.model.load_state_dict(state)
        self.version = version

    def sampled_version(self) -> int:
        """The version that samples the next rollout: the latest, or ``rollout.staleness`` before it (never
        before the warm start)."""
        return max(0, self.version - self.s.staleness)

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The sampler's queue of past policies and the verifier timeouts not logged yet."""
        return {"sampler": self.sampler.state_dict(), "verify_timeouts": self.timeouts}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.timeouts = int(state["verify_timeouts"])

    def wants_rollout_logp(self) -> bool:
        """Keep the sampler's log-probs when training uses them (old log-probs, a correction), when the
        sampler's precision differs (the mismatch is the point), or when the engine gives them for free
        (``Capabilities.free_logp``: the fast engine and vLLM compute them anyway; transformers' ``generate``
        would need every step's logits kept)."""
        return (self.sampler_logp or self.s.old_logp_source == "rollout" or self.s.correction != "none"
                or self.s.dtype != "float32"
                or self.s.opsm_threshold is not None or self.s.rejection is not None
                or self.s.prox_logp == "loglinear" or self.s.m2_threshold is not None
                or self.s.staleness > 0 or self.handle.capabilities(self.model).free_logp)

    # -- scoring (the only place the verifier is called) ------------------------------------
    def score(self, texts: list[str], answers: list[str]) -> torch.Tensor:
        """Verifier rewards through the task's ``single_turn`` environment (``Task.score``), each under
        ``rollout.verify_timeout`` (0 past it; counted in ``verify/timeouts``)."""
        rewards, late = self.environment.score(texts, answers, self.s.verify_timeout)
        self.timeouts += late
        return torch.tensor(rewards, dtype=torch.float32)

    # -- sampling ---------------------------------------------------------------------------------
    def prompts_for(self, step: int, round_: int) -> tuple[list[dict], int]:
        """Step ``step``'s prompts of generation round ``round_`` (this process's share), and the index of
        the first among all the processes'."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 101 + round_)
        idx = torch.randint(len(self.task.train), (self.s.prompts_per_step,), generator=g).tolist()
        first = 0
        if self.world > 1:  # the same draw on every rank, each taking its share: a group never straddles ranks
            share = ddp.shard(len(idx), self.rank, self.world)
            first, idx = share.start or 0, idx[share]
        rows = self.task.train.select(idx)
        return [{"prompt": p, "answer": a} for p, a in zip(list(rows["prompt"]), list(rows["answer"]))], first

    def _sample(self, step: int, round_: int) -> tuple[Generation, list[str], list[Trajectory] | None]:
        rows, first = self.prompts_for(step, round_)
        G = self.s.group_size
        prompts = [r["prompt"] for r in rows for _ in range(G)]
        answers = [r["answer"] for r in rows for _ in range(G)]
        extra = {"record_routes": True} if self.record_routes else {}
        version = self.sampled_version()
        if self.episodes is not None:  # a multi-turn environment: each completion an episode, turn by turn
            sampler = self.sampler(self.model)

            def sample(contexts, idx, turn, max_new):
                return self.handle.generate(sampler, contexts, version=version, step=step, round_=round_,
                                            rows=[first * G + i + turn * TURN_STRIDE for i in idx],
                                            max_new_tokens=max_new, temperature=self.s.temperature,
                                            return_logp=self.wants_rollout_logp(), **extra)

            trajs = play(self.episodes, self.tokenizer, [r for r in rows for _ in range(G)], sample,
                         max_new_tokens=self.s.max_new_tokens, eos=eos_ids(self.model, self.tokenizer),
                         version=version)
            return as_generation(trajs, self.tokenizer, self.tokenizer.pad_token_id)[0], answers, trajs
        if self.refresh is not None:  # partial: the responses under way continue under newer weights
            refresh = self.refresh
            extra["swap"] = lambda: self.version if refresh() else None
        # the sampler: the weights held, or their cast to rollout.dtype refreshed now (after the last update)
        gen = self.handle.generate(self.sampler(self.model), prompts, version=version, step=step,
                                   round_=round_, rows=list(range(first * G, (first + len(rows)) * G)),
                                   max_new_tokens=self.s.max_new_tokens, temperature=self.s.temperature,
                                   return_logp=self.wants_rollout_logp(), **extra)
        if gen.versions is None:  # one version sampled every token
            gen.versions = torch.full(gen.response_mask.shape, version, dtype=torch.long,
                                      device=gen.response_mask.device)
        return gen, answers, None

    def produce(self, step: int) -> None:
        """Sample RL step ``step``'s rollout into the buffer; RuntimeError when ``capacity`` wait already."""
        if len(self.buffer) >= self.capacity:
            raise RuntimeError(f"the rollout buffer is full ({self.capacity} waiting): take one first")
        self.buffer.append((step, self.rollout(step)))

    def take(self, step: int) -> RolloutBatch:
        """The oldest rollout in the buffer, which must be step ``step``'s."""
        if not self.buffer:
            raise RuntimeError(f"no rollout waits for RL step {step}: produce it first")
        made = self.buffer[0][0]
        if made != step:
            raise RuntimeError(f"the rollout buffer holds RL step {made}'s rollout, not step {step}'s")
        return self.buffer.popleft()[1]

    def rollout(self, step: int) -> RolloutBatch:
        """One rollout batch for RL step ``step`` (DAPO dynamic sampling included when on)."""
        if self.model is None:
            raise RuntimeError("the rollout producer has no weights to sample: build it with model=")
        t0 = time.perf_counter()
        G, want = self.s.group_size, self.s.prompts_per_step // self.world
        kept_gens, kept_answers, kept_scores, kept_rewards, kept_trajs = [], [], [], [], []
        dropped = rounds = n_groups = 0
        n_tokens = 0.0
        all_scores = []
        while rounds < (self.s.max_gen_batches if self.s.dynamic_sampling else 1):
            gen, answers, trajs = self._sample(step, rounds)
            rounds += 1
            # the environment's returns (a multi-turn episode's, played already), else the verifier's scores
            scores = self.score(gen.texts, answers) if trajs is None else torch.tensor(
                [t.reward for t in trajs], dtype=torch.float32)
            all_scores.append(scores)
            n_tokens += float(gen.response_mask.sum())
            rewards = scores.clone()
            if self.s.overlong_buffer:
                lengths = gen.response_mask.sum(-1).cpu()
                # r += min(0, -(L - (L_max - L_buf)) / L_buf) * penalty
                rewards = rewards + adv.overlong_penalty(lengths, self.s.max_new_tokens, self.s.overlong_buffer,
                                                         self.s.overlong_penalty)
            keep = torch.ones(len(rewards) // G, dtype=torch.bool)
            if self.s.dynamic_sampling:
                keep = ~adv.group_is_degenerate(rewards, G)
                # on the last round, top up with degenerate groups rather than train on too few
                if rounds == self.s.max_gen_batches and n_groups + int(keep.sum()) < want:
                    deficit = want - n_groups - int(keep.sum())
                    extra = (~keep).nonzero().flatten()[:deficit]
                    keep[extra] = True
                dropped += int((~keep).sum())
            room = want - n_groups
            groups = keep.nonzero().flatten()[:room]
            idx = (groups[:, None] * G + torch.arange(G)).flatten()
            kept_gens.append(select(gen, idx.to(gen.input_ids.device)))
            kept_answers += [answers[i] for i in idx.tolist()]
            if trajs is not None:
                kept_trajs += [trajs[i] for i in idx.tolist()]
            kept_scores.append(scores[idx])
            kept_rewards.append(rewards[idx])
            n_groups += len(groups)
            if n_groups >= want:
                break
        gen = merge_generations(kept_gens, self.tokenizer.pad_token_id)
        scores, rewards = torch.cat(kept_scores), torch.cat(kept_rewards)
        # rollout.advantage_estimator; the default, group: A_i = (R_i - mean(R_group)) / (std(R_group) + 1e-6),
        # population std (baseline, scale: config)
        advantages = None
        if self.group_advantages:
            estimate = adv.ADVANTAGE_ESTIMATORS[self.s.advantage_estimator]
            advantages = estimate(rewards, G, scale=self.s.advantage_scale, baseline=self.s.advantage_baseline,
                                  all_sum=ddp.all_sum if self.world > 1 else None)
        gen_s = time.perf_counter() - t0
        lengths = gen.response_mask.sum(-1)
        # truncated: the response hit the cap without emitting eos (any of the ids the engine stops on)
        last_tok = gen.input_ids[:, gen.prompt_len:].gather(1, (lengths.long() - 1).clamp(min=0)[:, None])[:, 0]
        eos = torch.tensor(eos_ids(self.model, self.tokenizer), device=last_tok.device)
        truncated = (lengths >= self.s.max_new_tokens) & ~torch.isin(last_tok, eos)
        if self.episodes is not None:  # an episode that reached the cap, whatever its last token
            truncated = torch.tensor([t.finish_reason == "length" for t in kept_trajs], device=lengths.device)
        sampled = torch.cat(all_scores)
        self.sampled += len(sampled)
        stats = {
            "reward/mean": float(sampled.mean()),
            "reward/std": float(sampled.std(unbiased=False)),
            "reward/train_batch_mean": float(scores.mean()),
            "reward/shaped_mean": float(rewards.mean()),
            "response/length_mean": float(lengths.float().mean()),
            "response/length_max": float(lengths.max()),
            "response/truncated_frac": float(truncated.float().mean()),
            "time/gen_s": gen_s,
            "throughput/gen_tokens_per_s": n_tokens / max(gen_s, 1e-9),
            "throughput/completions_per_s": len(sampled) / max(gen_s, 1e-9),
            # verifier calls past rollout.verify_timeout (scored 0) since the last step: this rollout's, and
            # those of an evaluation in between
            "verify/timeouts": float(self.timeouts),
        }
        self.timeouts = 0
        # correct: the verifier's score (before shaping) fully verifies, as eval/pass1_sampled counts it
        correct = scores.to(lengths.device) >= 1.0
        # mean length over each class that has a response this step; an empty class logs no value (not NaN)
        for key, part in (("response/length_correct_mean", correct), ("response/length_wrong_mean", ~correct)):
            if bool(part.any()):
                # L_class = sum_{i in class} L_i / |class|
                stats[key] = float(lengths[part].float().mean())
        # pushing the weights into an engine that holds its own copy (vLLM): this rollout's, and an evaluation's
        # before it
        sync = self.handle.take_sync_time()
        if sync is not None:
            stats["time/weight_sync"] = sync
        if self.episodes is not None:
            stats.update(episode_stats(kept_trajs, self.episodes.max_turns))
        if self.s.dynamic_sampling:
            stats.update({"dynamic/dropped_groups": float(dropped), "dynamic/gen_batches": float(rounds),
                          "dynamic/kept_groups": float(n_groups)})
        # the record: one trajectory per row, its response one model segment whose every token carries the
        # version of the weights that drew it (a multi-turn episode: the segments it played); the batch is their
        # layout (the generation's, column for column)
        trajs = trajectories_from(gen, truncated) if self.episodes is None else kept_trajs
        for t, r in zip(trajs, scores.tolist()):
            t.reward = r
        laid = collate(trajs, self.tokenizer.pad_token_id, prompt_len=gen.prompt_len,
                       response_len=gen.response_mask.shape[1], device=gen.input_ids.device)
        return RolloutBatch(laid.input_ids, laid.attention_mask, laid.prompt_len, laid.response_mask,
                            laid.rollout_logp, scores, rewards, advantages, gen.texts, kept_answers, stats, gen.routes,
                            truncated, laid.versions, laid.loss_mask, trajs)
