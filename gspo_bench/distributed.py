"""Multi-process training: who this process is, its share of the work, and what ranks must agree on.

Every process of a multi-process ``run`` runs the whole command: Lightning's
own launcher (``--devices 2``) starts the others by re-running the command
line, and ``torchrun`` or SLURM start them all at once. So the rank is read
from the launcher's environment before any process group exists
(``launch_rank_zero``), and from ``torch.distributed`` once the Trainer has made
one (``rank_world``). Only rank 0 talks to MLflow and prints.

The contract's aggregations stay exact across ranks (``local_minibatches``):
rank ``r`` backpropagates ``W * sum_{its units} l / N`` where ``N`` counts the
minibatch's units (tokens for token-mean, non-empty sequences otherwise) on
*every* rank, so the strategy's gradient average over ``W`` ranks is the
gradient of ``sum_{all units} l / N``: a global token mean, not a mean of
per-rank means.

Also here: what a multi-process run asks of its config (``check_processes``),
the FSDP fallback to transformers' own sampling and forward, and the
Lightning strategy for ``train.strategy``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from gspo_bench.config import ConfigError, RunConfig

# how a step metric combines across ranks; everything else is the mean of the ranks' values (rewards and
# losses exactly: every rank holds the same number of rollouts, and each rank's loss is W x its share)
_SUMMED = ("throughput/", "dynamic/dropped_groups", "dynamic/kept_groups", "verify/timeouts")
_MAXED = ("time/", "dynamic/gen_batches")


def launch_rank_zero() -> bool:
    """Whether this process is rank 0 as its launcher set it (True when there is none): torchrun's
    ``RANK``, SLURM's ``SLURM_PROCID`` when the job has several tasks, and for the processes Lightning
    starts itself, ``NODE_RANK`` and ``LOCAL_RANK``."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"]) == 0
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in os.environ:
        return int(os.environ["SLURM_PROCID"]) == 0
    return int(os.environ.get("LOCAL_RANK", "0")) == 0 and int(os.environ.get("NODE_RANK", "0")) == 0


def rank_world() -> tuple[int, int]:
    """(rank, world size) of the current process group; (0, 1) when there is none."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard(n: int, rank: int, world: int) -> slice:
    """Rank ``rank``'s contiguous share of ``n`` items (``n`` divisible by ``world``)."""
    if n % world:
        raise ValueError(f"{n} items do not split evenly over {world} processes")
    per = n // world
    return slice(rank * per, (rank + 1) * per)


def all_gather_cat(t: torch.Tensor) -> torch.Tensor:
    """Every rank's ``t`` (same shape on each), concatenated along dim 0 in rank order."""
    rank, world = rank_world()
    if world == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


def all_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over ranks (a new tensor; ``t`` itself on one process)."""
    if rank_world()[1] == 1:
        return t
    out = t.clone()
    dist.all_reduce(out)
    return out


def all_true(flag: bool, device) -> bool:
    """True when ``flag`` holds on every rank (so all ranks take the same branch around a collective)."""
    if rank_world()[1] == 1:
        return flag
    t = torch.tensor([0 if flag else 1], dtype=torch.int64, device=device)
    dist.all_reduce(t)
    return int(t) == 0


def broadcast_object(obj, src: int = 0):
    """Rank ``src``'s ``obj`` on every rank."""
    if rank_world()[1] == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def local_minibatches(global_parts: list[torch.Tensor], lengths: torch.Tensor, rank: int, world: int):
    """For each global minibatch (rows of the global rollout, ranks' rows in rank order): this rank's rows,
    as local indices, and the minibatch's unit counts over all ranks.

    ``lengths``: response lengths of all ``W * B_local`` global rows. Yields ``(local_rows, tokens, seqs)``
    where ``tokens = sum |y_i|`` and ``seqs = #{i : |y_i| > 0}`` over the whole minibatch.
    """
    b_local = len(lengths) // world
    lo, hi = rank * b_local, (rank + 1) * b_local
    for rows in global_parts:
        mine = rows[(rows >= lo) & (rows < hi)] - lo
        n = lengths[rows]
        yield mine, float(n.sum()), float((n > 0).sum())


def reduce_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """One value per metric across ranks: summed counts and throughputs, the slowest rank's times, min/max
    for ``*_min``/``*_max`` keys, the mean of the ranks' values otherwise. Keys missing on a rank are
    reduced over the ranks that have them. Every rank returns the same dict."""
    if rank_world()[1] == 1:
        return metrics
    everyone: list[dict] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(everyone, metrics)
    out = {}
    for key in sorted({k for m in everyone for k in m}):
        values = [m[key] for m in everyone if key in m]
        if any(v != v for v in values):  # a NaN on any rank stays NaN (the collapse detector must see it)
            out[key] = float("nan")
        elif key.startswith(_SUMMED):
            out[key] = float(sum(values))
        elif key.startswith(_MAXED) or key.endswith(("/max", "_max")):
            out[key] = float(max(values))
        elif key.endswith(("/min", "_min")):
            out[key] = float(min(values))
        else:
            out[key] = float(sum(values) / len(values))
    return out


# -- what a multi-process run asks of its config, and Lightning's strategy for it ---------------------------
def check_processes(cfg: RunConfig) -> None:
    """A multi-process run splits each step's prompts evenly (whole groups per rank), and FSDP needs GPUs."""
    t = cfg.train
    n = t.devices * t.num_nodes
    if n > 1 and cfg.rollout.prompts_per_step % n:
        raise ConfigError(f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} must divide evenly over "
                          f"{n} processes (devices {t.devices} x num_nodes {t.num_nodes}): each rank samples whole "
                          "groups of its share of the prompts")
    if n > 1 and cfg.train.eval_prompts < n:
        raise ConfigError(f"train.eval_prompts={t.eval_prompts} is fewer than the {n} processes sharing them")
    if t.strategy == "fsdp":
        import torch

        if t.accelerator == "cpu" or not torch.cuda.is_available():
            raise ConfigError("--strategy fsdp needs GPUs (Lightning runs FSDP on CUDA only); on CPU use "
                              "--strategy ddp")


def fsdp_fallback(cfg: RunConfig, log) -> RunConfig:
    """Under FSDP each rank holds a shard of every parameter, and the fast engine and the packed forward read
    whole ones: sampling and the training forward fall back to transformers' own (``hf``), and say so."""
    from dataclasses import replace

    if cfg.train.strategy != "fsdp":
        return cfg
    if cfg.rollout.engine in ("auto", "fast", "compiled") or cfg.train.forward in ("auto", "packed"):
        log("[fsdp] the fast engine and the packed forward read whole parameters, which FSDP shards: "
            "sampling and training use transformers' own (engine hf, forward hf)")
    own = cfg.rollout.engine in ("auto", "fast", "compiled")
    return replace(cfg, rollout=replace(cfg.rollout, engine="hf" if own else cfg.rollout.engine),
                   train=replace(cfg.train, forward="hf"))


def strategy(t, moe: bool):
    """Lightning's strategy for ``train.strategy``: one process as before; DDP (gloo on CPU, NCCL on GPUs)
    averaging gradients, with unused-parameter detection on MoE models (experts a minibatch never routes
    to); or FSDP."""
    if t.devices * t.num_nodes == 1 and t.strategy == "auto":
        return "auto"
    if t.strategy == "fsdp":
        return "fsdp"
    from lightning.pytorch.strategies import DDPStrategy

    return DDPStrategy(find_unused_parameters=moe)
