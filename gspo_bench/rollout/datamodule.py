"""The one rollout/verifier datamodule every algorithm shares.

Each training "batch" is a whole rollout: ``prompts_per_step`` prompts, ``G``
samples each from the *current* policy, verifier rewards (through the task's
``single_turn`` environment), optional DAPO shaping/filtering, and advantages
from the estimator ``rollout.advantage_estimator`` names (the group z-score by
default; docs/algorithms.md). Prompts for
step ``s`` are drawn from a generator seeded by ``(seed, s)``, so every
algorithm sees the same prompts in the same order: the comparison is on equal
terms. Modules never touch the task: sampling and scoring go through here,
and the held-out evaluation (``evaluation.Evaluator``) samples and scores
through it too. Whoever builds the run (``train.assembly``) hands it what
it samples and scores with: the policy, the engine (one object from the
registry, ``rollout.engines``), the evaluator, and the checkpoint to continue
from; it never reaches into the module, nor the module into it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from gspo_bench.core import advantages as adv
from gspo_bench.core import collectives as ddp
from gspo_bench.core.rng import set_rng_state
from gspo_bench.config import RolloutConfig
from gspo_bench.rollout.engine import Generation, eos_ids
from gspo_bench.rollout.engines import (ENGINES, Capabilities, EngineSetup, RolloutEngine, build_engine,
                                        resolve_engine)
from gspo_bench.rollout.evaluation import Evaluator
from gspo_bench.rollout.precision import SamplerWeights
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

    def to(self, device) -> "RolloutBatch":
        for k in ("input_ids", "attention_mask", "response_mask", "rollout_logp", "scores", "rewards", "advantages",
                  "routes", "truncated"):
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
                            None if self.truncated is None else self.truncated[idx])


def merge_generations(gens: list[Generation], pad_id: int) -> Generation:
    """Concatenate generations of different prompt/response widths (left-pad prompts, right-pad responses)."""
    if len(gens) == 1:
        return gens[0]
    P = max(g.prompt_len for g in gens)
    T = max(g.response_mask.shape[1] for g in gens)

    def pad(x, left, right, value):
        return torch.nn.functional.pad(x, (left, right), value=value)

    ids, attn, rmask, logp, routes = [], [], [], [], []
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
    return Generation(torch.cat(ids), torch.cat(attn), P, torch.cat(rmask),
                      torch.cat(logp) if len(logp) == len(gens) else None, sum((g.texts for g in gens), []),
                      torch.cat(routes, dim=1) if len(routes) == len(gens) else None)


def select(g: Generation, idx: torch.Tensor) -> Generation:
    il = idx.tolist()
    return Generation(g.input_ids[idx], g.attention_mask[idx], g.prompt_len, g.response_mask[idx],
                      None if g.rollout_logp is None else g.rollout_logp[idx], [g.texts[i] for i in il],
                      None if g.routes is None else g.routes[:, idx])


class _RolloutStream(IterableDataset):
    def __init__(self, dm: "RolloutDataModule"):
        self.dm = dm

    def __len__(self) -> int:
        return self.dm.steps - self.dm.start_step

    def __iter__(self):
        for step in range(self.dm.start_step, self.dm.steps):
            yield self.dm.rollout(step)


class RolloutDataModule(L.LightningDataModule):
    """Prompts -> G samples from the current policy -> verifier rewards -> advantages."""

    def __init__(self, task: Task, tokenizer, settings: RolloutConfig, *, steps: int, seed: int, policy=None,
                 engine: RolloutEngine | None = None, evaluator: Evaluator | None = None, record_routes: bool = False,
                 group_advantages: bool = True, resume: dict | None = None, eval_prompts: int = 256,
                 eval_samples: int = 0, eval_batch: int = 256, model_dir: str | None = None):
        """What it samples and scores with, from whoever builds the run (``train.assembly.rollout_data``):

        - ``policy``: the model rollouts sample (the policy module's; the engine samples a cast of it);
        - ``engine``: the engine that samples; None: ``rollout.engine``'s, from the registry, resolved for the
          policy where it is at the first rollout (a caller that builds no engine: tests, notebooks);
        - ``evaluator``: the held-out evaluation; None: the first ``eval_prompts`` eval rows, ``eval_samples``
          samples each beside the greedy one, ``eval_batch`` prompts per engine call;
        - ``record_routes``: keep the sampler's MoE experts; ``group_advantages``: compute group advantages
          here (False for an algorithm with its own, PPO's GAE);
        - ``resume``: a checkpoint's datamodule part (``train.checkpoint.rollout_part``), loaded in ``setup``,
          from rank 0 on several processes;
        - ``model_dir``: the policy's starting weights in Hugging Face format (an engine that needs them).

        Its rank among the processes is its own to read, in ``setup``."""
        super().__init__()
        self.model_dir = model_dir
        self.engine = engine  # the engine that samples (``engines.RolloutEngine``)
        self.engine_given = engine is not None  # handed in: never replaced by the registry's
        self.task, self.tokenizer, self.s = task, tokenizer, settings
        self.environment = SingleTurn(task)  # what scores the completions: the task's verifier, batch by batch
        self.steps, self.seed = steps, seed
        self.evaluator = evaluator if evaluator is not None else Evaluator.for_task(
            task, settings, prompts=eval_prompts, samples=eval_samples, batch_size=eval_batch)
        self.policy = policy
        self.record_routes, self.group_advantages = record_routes, group_advantages
        self.resume = resume
        self.sampler = SamplerWeights(settings.dtype, settings.staleness)
        self.timeouts = 0  # verifier calls past their time limit since the last RL step's metrics
        self.start_step = 0  # a resumed run's next RL step (load_state_dict)
        self.rank, self.world = 0, 1  # this process's share of the prompts (``setup``)
        self.train_sampled = 0  # completions generated for rollouts (``sampled``)
        self.resume_rng: dict | None = None  # RNG states a resumed run restores right before its first rollout

    def setup(self, stage: str) -> None:
        """Once the processes are up (Lightning calls this before the module's ``setup`` and before it sizes
        the dataloader): this process's rank among them, and the checkpoint to continue from, which only
        rank 0 read."""
        self.rank, self.world = ddp.rank_world()
        state = ddp.broadcast_object(self.resume) if self.world > 1 else self.resume
        if state is not None:
            self.load_state_dict(state)
            self.resume = None

    def state_dict(self) -> dict:
        """Its part of a checkpoint: the sampler's queue of past policies and the verifier timeouts not logged
        yet (the next RL step and the RNG states are the checkpoint's own ``rl_step`` and ``rng``)."""
        return {"sampler": self.sampler.state_dict(), "verify_timeouts": self.timeouts}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint (``train.checkpoint.capture``): its ``sampler`` and ``verify_timeouts``,
        rollouts from RL step ``rl_step`` on (the steps done), and the RNG states ``rng`` put back right before
        the first rollout samples (Lightning draws from them when it makes the dataloader's iterator, which an
        uninterrupted run did once, at step 0). Called before Lightning sizes the dataloader (``setup``, from
        the ``resume`` it was built with)."""
        self.sampler.load_state_dict(state["sampler"])
        self.timeouts = int(state["verify_timeouts"])
        self.start_step = int(state["rl_step"])
        self.resume_rng = state["rng"]

    def wants_rollout_logp(self) -> bool:
        """Keep the sampler's log-probs when training uses them (old log-probs, a correction), when the
        sampler's precision differs (the mismatch is the point), or when the engine gives them for free
        (``Capabilities.free_logp``: the fast engine and vLLM compute them anyway; transformers' ``generate``
        would need every step's logits kept)."""
        return (self.s.old_logp_source == "rollout" or self.s.correction != "none" or self.s.dtype != "float32"
                or self.s.opsm_threshold is not None or self.s.rejection is not None
                or self.s.staleness > 0 or self.engine_capabilities().free_logp)

    def count_timeouts(self, n: int) -> None:
        """Add ``n`` verifier calls past their time limit (an evaluation's whose result was reused): the next
        rollout's ``verify/timeouts`` reports them."""
        self.timeouts += n

    @property
    def sampled(self) -> dict[str, int]:
        """Completions generated, for rollouts and for evaluations (``bench --whole``)."""
        return {"train": self.train_sampled, "eval": self.evaluator.completions}

    # -- the engine --------------------------------------------------------------------------
    def engine_name(self) -> str:
        """The engine that samples: the one handed in, else ``rollout.engine`` resolved for the policy
        (``engines.resolve_engine``)."""
        if self.engine_given:
            return self.engine.name
        return resolve_engine(self.s.engine, self.policy, held=True)

    def engine_capabilities(self) -> Capabilities:
        """What the sampling engine declares (``engines.Capabilities``)."""
        return type(self.engine).capabilities if self.engine_given else ENGINES[self.engine_name()].capabilities

    def sampling_engine(self) -> RolloutEngine:
        """The engine object, built from the registry at its first use (and again should the resolved name
        change)."""
        name = self.engine_name()
        if self.engine is None or self.engine.name != name:
            self.close_engine()
            task = self.task
            self.engine = build_engine(name, EngineSetup(
                self.s, seed=self.seed, model_dir=self.model_dir, record_routes=self.record_routes,
                prompts=lambda: [*task.train["prompt"], *task.eval["prompt"]],
                max_prompt_tokens=task.spec.max_prompt_tokens))
        return self.engine

    def generate(self, model, prompts: list[str], **kwargs) -> Generation:
        """Sample ``prompts`` from ``model`` with this run's engine (an engine that holds its own copy of the
        weights gets ``model``'s first, when they changed)."""
        return self.sampling_engine().sample(model, self.tokenizer, prompts, **kwargs)

    def close_engine(self) -> None:
        """Free what the engine holds (the end of a run: vLLM's engine, one lives at a time); a later rollout
        would build it again."""
        if self.engine is not None:
            self.engine.close()

    def teardown(self, stage: str) -> None:
        self.close_engine()

    # -- scoring (the only place the verifier is called) ------------------------------------
    def score(self, texts: list[str], answers: list[str]) -> torch.Tensor:
        """Verifier rewards through the task's ``single_turn`` environment (``Task.score``), each under
        ``rollout.verify_timeout`` (0 past it; counted in ``verify/timeouts``)."""
        rewards, late = self.environment.score(texts, answers, self.s.verify_timeout)
        self.timeouts += late
        return torch.tensor(rewards, dtype=torch.float32)

    def _prompts_for(self, step: int, round_: int) -> list[dict]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 101 + round_)
        idx = torch.randint(len(self.task.train), (self.s.prompts_per_step,), generator=g).tolist()
        if self.world > 1:  # the same draw on every rank, each taking its share: a group never straddles ranks
            idx = idx[ddp.shard(len(idx), self.rank, self.world)]
        rows = self.task.train.select(idx)
        return [{"prompt": p, "answer": a} for p, a in zip(list(rows["prompt"]), list(rows["answer"]))]

    def _sample(self, rows: list[dict]) -> tuple[Generation, list[str]]:
        G = self.s.group_size
        prompts = [r["prompt"] for r in rows for _ in range(G)]
        answers = [r["answer"] for r in rows for _ in range(G)]
        extra = {"record_routes": True} if self.record_routes else {}
        # the sampler: the policy, or its cast to rollout.dtype refreshed now (after the last optimiser step)
        gen = self.generate(self.sampler(self.policy), prompts, max_new_tokens=self.s.max_new_tokens,
                            temperature=self.s.temperature, return_logp=self.wants_rollout_logp(), **extra)
        return gen, answers

    def rollout(self, step: int) -> RolloutBatch:
        """One rollout batch for RL step ``step`` (DAPO dynamic sampling included when on)."""
        if self.policy is None:
            raise RuntimeError("RolloutDataModule has no policy to sample: build it with policy=")
        if self.resume_rng is not None:
            set_rng_state(self.resume_rng)
            self.resume_rng = None
        t0 = time.perf_counter()
        G, want = self.s.group_size, self.s.prompts_per_step // self.world
        kept_gens, kept_answers, kept_scores, kept_rewards = [], [], [], []
        dropped = rounds = n_groups = 0
        n_tokens = 0.0
        all_scores = []
        while rounds < (self.s.max_gen_batches if self.s.dynamic_sampling else 1):
            gen, answers = self._sample(self._prompts_for(step, rounds))
            rounds += 1
            scores = self.score(gen.texts, answers)
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
        eos = torch.tensor(eos_ids(self.policy, self.tokenizer), device=last_tok.device)
        truncated = (lengths >= self.s.max_new_tokens) & ~torch.isin(last_tok, eos)
        sampled = torch.cat(all_scores)
        self.train_sampled += len(sampled)
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
        sync = None if self.engine is None else self.engine.take_sync_time()
        if sync is not None:
            stats["time/weight_sync"] = sync
        if self.s.dynamic_sampling:
            stats.update({"dynamic/dropped_groups": float(dropped), "dynamic/gen_batches": float(rounds),
                          "dynamic/kept_groups": float(n_groups)})
        return RolloutBatch(gen.input_ids, gen.attention_mask, gen.prompt_len, gen.response_mask,
                            gen.rollout_logp, scores, rewards, advantages, gen.texts, kept_answers, stats, gen.routes,
                            truncated)

    # -- Lightning hooks ---------------------------------------------------------------------------
    def train_dataloader(self):
        return DataLoader(_RolloutStream(self), batch_size=None, collate_fn=lambda b: b)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch.to(device) if isinstance(batch, RolloutBatch) else batch
