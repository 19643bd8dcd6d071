"""The one rollout/verifier datamodule every algorithm shares: Lightning's face of the rollout producer.

Each training "batch" is a whole rollout, made by the run's ``producer.RolloutProducer``: ``prompts_per_step``
prompts, ``G`` samples each from the weights it was last handed, environment rewards, optional DAPO
shaping/filtering, and advantages (docs/algorithms.md). The loop is synchronous: before RL step ``s``'s
rollout the producer is handed the policy's weights, tagged version ``s`` (``sync_weights``; the policy's
own tensors, nothing copied), it samples one rollout into its buffer, and the trainer takes it.

Evaluation has its own engine handle (``producer.EngineHandle``), which shares the engine object where one
lives per process (vLLM). Both draw their randomness from the run's ``rollout.draws`` (``rollout.seeding``):
one stream in the order they sample, or a generator per completion. Whoever builds the run
(``train.assembly``) hands it what it samples and scores with: the policy, the engine (one object from the
registry, ``rollout.engines``), the evaluator, and the checkpoint to continue from; it never reaches into
the module, nor the module into it.
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from gspo_bench.core import collectives as ddp
from gspo_bench.core.rng import set_rng_state
from gspo_bench.config import RolloutConfig
from gspo_bench.rollout.draws import StreamDraws
from gspo_bench.rollout.engine import Generation, eos_ids
from gspo_bench.rollout.episodes import TURN_STRIDE, Episodes, play
from gspo_bench.rollout.engines import Capabilities, EngineSetup, RolloutEngine
from gspo_bench.rollout.evaluation import Evaluator
from gspo_bench.rollout.overlap import OverlappedRollouts, WorkerSpec, split_cores
from gspo_bench.rollout.producer import EngineHandle, RolloutBatch, RolloutProducer
from gspo_bench.tasks import Task

class _RolloutStream(IterableDataset):
    def __init__(self, dm: "RolloutDataModule"):
        self.dm = dm

    def __len__(self) -> int:
        return self.dm.steps - self.dm.start_step

    def __iter__(self):
        for step in range(self.dm.start_step, self.dm.steps):
            yield self.dm.rollout(step)


class RolloutDataModule(L.LightningDataModule):
    """Prompts -> G samples from the current policy -> verifier rewards -> advantages, one rollout per RL step."""

    def __init__(self, task: Task, tokenizer, settings: RolloutConfig, *, steps: int, seed: int, policy=None,
                 engine: RolloutEngine | None = None, evaluator: Evaluator | None = None, record_routes: bool = False,
                 group_advantages: bool = True, sampler_logp: bool = False, resume: dict | None = None,
                 eval_prompts: int = 256,
                 eval_samples: int = 0, eval_batch: int = 256, model_dir: str | None = None,
                 episodes: Episodes | None = None):
        """What it samples and scores with, from whoever builds the run (``train.assembly.rollout_data``):

        - ``policy``: the model rollouts sample (the policy module's; the engine samples a cast of it);
        - ``engine``: the engine that samples; None: ``rollout.engine``'s, from the registry, resolved for the
          policy where it is at the first rollout (a caller that builds no engine: tests, notebooks);
        - ``evaluator``: the held-out evaluation; None: the first ``eval_prompts`` eval rows, ``eval_samples``
          samples each beside the greedy one, ``eval_batch`` prompts per engine call;
        - ``record_routes``: keep the sampler's MoE experts; ``group_advantages``: compute group advantages
          here (False for an algorithm with its own, PPO's GAE); ``sampler_logp``: keep the sampler's
          log-probs whatever the settings (a loss weighted against the sampler, rollout_is);
        - ``resume``: a checkpoint's datamodule part (``train.checkpoint.rollout_part``), loaded in ``setup``,
          from rank 0 on several processes;
        - ``model_dir``: the policy's starting weights in Hugging Face format (an engine that needs them);
        - ``episodes``: how the task's multi-turn environment is played (``episodes.Episodes``; None: one
          completion per prompt, the verifier's reward), by the rollouts and the evaluation alike.

        Its rank among the processes is its own to read, in ``setup``."""
        super().__init__()
        self.task, self.tokenizer, self.s = task, tokenizer, settings
        self.steps, self.seed, self.policy = steps, seed, policy
        self.draws = StreamDraws()  # the run's stream (rollout.seeding=stream): rollouts and evaluations share it
        setup = EngineSetup(settings, seed=seed, model_dir=model_dir, record_routes=record_routes,
                            prompts=lambda: [*task.train["prompt"], *task.eval["prompt"]],
                            max_prompt_tokens=task.spec.max_prompt_tokens)

        def handle(kind: str) -> EngineHandle:
            return EngineHandle(settings, tokenizer, seed=seed, kind=kind, engine=engine, setup=setup,
                                stream=self.draws)

        self.producer = RolloutProducer(task, tokenizer, settings, seed=seed, handle=handle("train"), model=policy,
                                        record_routes=record_routes, group_advantages=group_advantages,
                                        sampler_logp=sampler_logp, episodes=episodes)
        self.model_dir = model_dir
        self.overlap: OverlappedRollouts | None = None  # rollout.max_staleness > 0: the worker, at the first rollout
        self.eval_engine = handle("eval")
        self.evaluator = evaluator if evaluator is not None else Evaluator.for_task(
            task, settings, prompts=eval_prompts, samples=eval_samples, batch_size=eval_batch)
        self.resume = resume
        self.start_step = 0  # a resumed run's next RL step (load_state_dict)
        self.rank, self.world = 0, 1  # this process's share of the prompts (``setup``)
        self.resume_rng: dict | None = None  # RNG states a resumed run restores right before its first rollout
        self.resume_draws: dict | None = None  # and the draws' stream

    def setup(self, stage: str) -> None:
        """Once the processes are up (Lightning calls this before the module's ``setup`` and before it sizes
        the dataloader): this process's rank among them, and the checkpoint to continue from, which only
        rank 0 read."""
        self.rank, self.world = ddp.rank_world()
        self.producer.rank, self.producer.world = self.rank, self.world
        state = ddp.broadcast_object(self.resume) if self.world > 1 else self.resume
        if state is not None:
            self.load_state_dict(state)
            self.resume = None

    def state_dict(self) -> dict:
        """Its part of a checkpoint: the producer's (the sampler's queue of past policies, the verifier
        timeouts not logged yet) and the draws' stream (the next RL step and the other RNG states are the
        checkpoint's own ``rl_step`` and ``rng``)."""
        return {**self.producer.state_dict(), "draws": self.draws.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint (``train.checkpoint.capture``): the producer's part, rollouts from RL step
        ``rl_step`` on (the steps done), and the RNG states, put back right before the first rollout samples
        (Lightning draws from the stream when it makes the dataloader's iterator, which an uninterrupted run
        did once, at step 0). A checkpoint from before the draws had a stream of their own holds it as torch's
        global state. Called before Lightning sizes the dataloader (``setup``, from the ``resume`` it was
        built with)."""
        self.producer.load_state_dict(state)
        self.start_step = int(state["rl_step"])
        self.resume_rng = state["rng"]
        self.resume_draws = state.get("draws") or {"cpu": state["rng"]["torch"], **{
            f"cuda:{i}": s for i, s in enumerate(state["rng"].get("cuda", []))}}

    # -- what the module and the evaluation read ----------------------------------------------------
    @property
    def timeouts(self) -> int:
        """Verifier calls past their time limit since the last rollout's stats."""
        return self.producer.timeouts

    def count_timeouts(self, n: int) -> None:
        """Add ``n`` verifier calls past their time limit (an evaluation's whose result was reused): the next
        rollout's ``verify/timeouts`` reports them."""
        self.producer.timeouts += n

    @property
    def sampled(self) -> dict[str, int]:
        """Completions generated, for rollouts and for evaluations (``bench --whole``)."""
        return {"train": self.producer.sampled, "eval": self.evaluator.completions}

    @property
    def engine(self) -> RolloutEngine | None:
        """The rollouts' engine object (None before the first rollout when the registry builds it)."""
        return self.producer.handle.engine

    def engine_name(self) -> str:
        """The engine that samples: the one handed in, else ``rollout.engine`` resolved for the policy."""
        return self.producer.handle.name(self.policy)

    def engine_capabilities(self) -> Capabilities:
        """What the sampling engine declares (``engines.Capabilities``)."""
        return self.producer.handle.capabilities(self.policy)

    def generate(self, model, prompts: list[str], **kwargs) -> Generation:
        """Sample ``prompts`` from ``model`` through the evaluation's engine handle (``Evaluator``'s calls)."""
        return self.eval_engine.generate(model, prompts, **kwargs)

    def score(self, texts: list[str], answers: list[str]) -> torch.Tensor:
        """Verifier rewards (``RolloutProducer.score``)."""
        return self.producer.score(texts, answers)

    def play(self, model, prompts: list[str], answers: list[str], *, max_new_tokens: int,
             rows: list[int] | None = None, step: int = 0, **kwargs) -> torch.Tensor | None:
        """Each prompt's return in the task's multi-turn environment, one episode each, sampled from ``model``
        through the evaluation's engine handle (None for a single-turn task: ``generate`` and ``score``)."""
        episodes = self.producer.episodes
        if episodes is None:
            return None
        keys = list(range(len(prompts))) if rows is None else rows

        def sample(contexts, idx, turn, max_new):
            return self.eval_engine.generate(model, contexts, step=step, max_new_tokens=max_new,
                                             rows=[keys[i] + turn * TURN_STRIDE for i in idx], **kwargs)

        trajs = play(episodes, self.tokenizer, [{"prompt": p, "answer": a} for p, a in zip(prompts, answers)],
                     sample, max_new_tokens=max_new_tokens, eos=eos_ids(model, self.tokenizer),
                     version=kwargs.get("version", 0))
        return torch.tensor([t.reward for t in trajs], dtype=torch.float32)

    def loader_generator(self) -> torch.Generator:
        """The run's stream on CPU: every data loader of the run draws its iterator's base seed from it, so
        nothing in the run draws from torch's global generator."""
        return self.draws.generator("cpu")

    def close_engine(self) -> None:
        """Free what the engines hold (the end of a run: vLLM's engine, one lives at a time); a later rollout
        would build them again."""
        self.producer.handle.close()
        if self.eval_engine.engine is not self.producer.handle.engine:
            self.eval_engine.close()
        if self.overlap is not None:
            self.overlap.close()
            self.overlap = None

    def teardown(self, stage: str) -> None:
        self.close_engine()

    # -- the synchronous loop --------------------------------------------------------------------------
    def rollout(self, step: int) -> RolloutBatch:
        """RL step ``step``'s rollout: the producer is handed the policy's weights (version ``step``), samples
        one rollout into its buffer, and it is taken out."""
        if self.policy is None:
            raise RuntimeError("RolloutDataModule has no policy to sample: build it with policy=")
        if self.resume_rng is not None:
            set_rng_state(self.resume_rng)
            self.draws.load_state_dict(self.resume_draws)
            self.resume_rng = None
        if self.s.max_staleness > 0:  # asynchronous: the worker sampled it, perhaps while the last step trained
            if self.overlap is None:
                self.overlap = OverlappedRollouts(self.worker_spec(step))
            self.overlap.sync_weights(self.policy.state_dict(), step)
            return self.overlap.take(step)
        self.producer.sync_weights(self.policy.state_dict(), step)
        self.producer.produce(step)
        return self.producer.take(step)

    def worker_spec(self, start: int) -> WorkerSpec:
        """What an asynchronous producer's worker builds its own producer from, starting at RL step ``start``."""
        if self.model_dir is None:
            raise RuntimeError("rollout.max_staleness > 0 builds the sampler's own copy of the policy from the "
                               "run's model folder: build the datamodule with model_dir=")
        from gspo_bench.rollout.engines import partial_check
        from gspo_bench.tasks.verifiers import VERIFIERS

        p = self.producer
        # rollout.engine=auto resolved for the policy, as the worker will: one that cannot continue a response
        # under new weights stops a partial run here, before the worker starts
        partial_check(p.handle.name(self.policy), self.s.partial)
        _, worker = split_cores()
        return WorkerSpec(self.task, self.tokenizer, self.s, self.seed, self.model_dir, p.record_routes,
                          p.group_advantages, p.sampler_logp, start, self.steps, worker,
                          VERIFIERS.get(self.task.spec.verifier), p.episodes)

    # -- Lightning hooks ---------------------------------------------------------------------------
    def train_dataloader(self):
        # the iterator's base seed comes from the run's stream, as it came from torch's generator before
        return DataLoader(_RolloutStream(self), batch_size=None, collate_fn=lambda b: b,
                          generator=self.loader_generator())

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch.to(device) if isinstance(batch, RolloutBatch) else batch
