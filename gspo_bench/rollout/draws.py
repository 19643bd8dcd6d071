"""Where a sampler's random draws come from (``rollout.seeding``), so that no engine draws from torch's global
generator behind the run's back.

An engine call is handed a ``Draws`` and asks it for what it needs: a uniform number per live row at each
decode step (the fast and compiled engines sample by inverse CDF), a seed per request (vLLM), or torch's
generator for the length of a call that draws from it itself (transformers' ``generate``).

- ``StreamDraws`` (``rollout.seeding: stream``, the default): one stream for the run, shared by the rollouts
  and the held-out evaluation in the order they sample. It starts from torch's global state where the run
  first samples (after the run seeds torch), so a run draws exactly the numbers it drew when the samplers
  read the global generator, and the global generator itself is left alone. A checkpoint holds its state.
- ``RequestDraws`` (``rollout.seeding: request``): every completion its own generator, seeded from
  ``(seed, kind, step, round, row)``. A completion's tokens then depend on its own key and the weights, not
  on which other completions shared its batch, in which order they were sampled, or whether it was sampled
  again after a restart: what a producer that samples apart from the trainer needs.
- ``GlobalDraws``: torch's global generator itself, for a one-off call outside a run (the warm start's
  evaluations, a benchmark's timing).
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Protocol, runtime_checkable

import torch



@runtime_checkable
class Draws(Protocol):
    """What an engine reads its random draws from (see the module docstring)."""

    per_request: bool
    """Each completion draws from its own generator (an engine cannot stand it in for torch's global one)."""

    def uniform(self, rows: torch.Tensor, device, dtype) -> torch.Tensor:
        """(len(rows), 1) draws from U[0, 1), one for each of the call's rows ``rows`` (indices into the
        call's batch) still sampling, in ``dtype`` on ``device``."""
        ...

    def seeds(self, n: int) -> list[int]:
        """A seed in [0, 2**31 - 1) for each of the call's ``n`` completions (an engine seeded per request)."""
        ...

    def as_global(self, device) -> contextlib.AbstractContextManager:
        """For a call that draws from torch's generator itself: this object's draws in its place, for the
        length of the ``with``; the global state as it was after."""
        ...


class GlobalDraws:
    """torch's global generators, drawn from and advanced (a one-off call outside a run)."""

    per_request = False

    def uniform(self, rows, device, dtype):
        return torch.rand(len(rows), 1, device=device, dtype=dtype)

    def seeds(self, n):
        # one base from torch's generator, completion k at base + k (vLLM's own rule for the n of one request)
        base = int(torch.randint(0, 2**31 - 1, (1,)))
        return [(base + k) % (2**31 - 1) for k in range(n)]

    def as_global(self, device):
        return contextlib.nullcontext()


def _global_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


class StreamDraws:
    """One generator per device for the run, each starting from torch's global state for that device at its
    first draw (``rollout.seeding: stream``)."""

    per_request = False

    def __init__(self):
        self.generators: dict[str, torch.Generator] = {}
        self.pending: dict[str, torch.Tensor] = {}  # states from a checkpoint, taken at the first draw

    def generator(self, device="cpu") -> torch.Generator:
        """The stream's generator on ``device``: made from torch's global state there at the first call."""
        device = torch.device(device)
        key = str(device)
        if key not in self.generators:
            g = torch.Generator(device=device)
            g.set_state(self.pending.pop(key, None) if key in self.pending else _global_state(device))
            self.generators[key] = g
        return self.generators[key]

    def uniform(self, rows, device, dtype):
        return torch.rand(len(rows), 1, generator=self.generator(device), device=device, dtype=dtype)

    def seeds(self, n):
        # one base from the stream, completion k at base + k (vLLM's own rule for the n of one request)
        base = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator("cpu")))
        return [(base + k) % (2**31 - 1) for k in range(n)]

    @contextlib.contextmanager
    def as_global(self, device):
        device = torch.device(device)
        g = self.generator(device)
        before = _global_state(device)
        set_state = torch.cuda.set_rng_state if device.type == "cuda" else torch.set_rng_state
        set_state(g.get_state())
        try:
            yield
        finally:
            g.set_state(_global_state(device))
            set_state(before)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Each device's generator state (what a checkpoint holds): the ones drawn from, and any still pending."""
        return {**self.pending, **{k: g.get_state() for k, g in self.generators.items()}}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from ``state_dict``'s states: each device's generator starts there at its next first draw."""
        self.generators, self.pending = {}, {k: v.clone() for k, v in state.items()}


def request_seed(*key) -> int:
    """A 63-bit seed for a request's generator from its key (``seed``, kind, step, round, row): blake2b of the
    key's repr, so nearby keys get unrelated streams."""
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little") >> 1


class RequestDraws:
    """One generator per completion, seeded from ``(seed, kind, step, round, row)`` (``rollout.seeding:
    request``): ``kind`` is ``train`` or ``eval``, ``step`` the RL step, ``round`` the rollout's generation round
    (DAPO's dynamic sampling), ``row`` the completion's index among the step's (``rows[r]`` for the call's row
    ``r``; default ``r``), so that a completion's draws do not depend on the processes sharing the step."""

    per_request = True

    def __init__(self, seed: int, kind: str, step: int, round_: int = 0, rows: list[int] | None = None):
        self.key = (seed, kind, step, round_)
        self.rows = rows
        self.gens: dict[int, torch.Generator] = {}

    def row(self, r: int) -> int:
        """The key row of the call's row ``r``."""
        return r if self.rows is None else self.rows[r]

    def generator(self, r: int) -> torch.Generator:
        """The call's row ``r``'s generator (made at its first draw)."""
        if r not in self.gens:
            self.gens[r] = torch.Generator().manual_seed(request_seed(*self.key, self.row(r)))
        return self.gens[r]

    def uniform(self, rows, device, dtype):
        # row r's t-th draw is the t-th of its own generator, whoever else is sampling beside it
        u = [torch.rand(1, generator=self.generator(int(r)), dtype=torch.float32) for r in rows]
        return (torch.cat(u) if u else torch.zeros(0)).to(device=device, dtype=dtype)[:, None]

    def seeds(self, n):
        return [request_seed(*self.key, self.row(r)) % (2**31 - 1) for r in range(n)]

    def as_global(self, device):
        raise ValueError("rollout.seeding=request gives each completion its own generator; an engine that draws "
                         "from torch's global generator cannot use it")
