"""Collectives over the processes of a multi-process run, as pure functions of tensors and dicts.

Who this process is (``launch_rank_zero`` from the launcher's environment before any process group exists,
``rank_world`` once one does), its share of a batch (``shard``), gathers and sums over ranks, and the two
pieces of the loss contract that stay exact across ranks: ``local_minibatches`` (each rank's rows of every
global minibatch with the whole minibatch's unit counts; ``train/distributed.py`` says why) and
``reduce_metrics`` (one value per step metric across ranks). Every function is the identity on one process.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

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
