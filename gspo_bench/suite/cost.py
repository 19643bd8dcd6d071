"""The suite's ETA: per cell, the mean ``time/wall_s`` of the scenario's FINISHED cells of that algorithm
(else of the other algorithms, each divided by its ``ALGO_COST`` and multiplied by this one's) when the
experiment has some; else this module's cost model ``cell_seconds``:

    CELL_OVERHEAD_S + S_PER_COMPLETION x completions x max(1, max_new_tokens / 8) x ALGO_COST x MOE_COST

with completions = steps x prompts_per_step x group_size (training) + evals x eval prompts x
(1 + eval_samples) (evaluation; evals = at step 0, every eval_every steps and at the end). The constants
were measured on this project's 2-core CPU (torch 2.13 CPU): S_PER_COMPLETION from grpo under the default
preset (81 s for 20,480 training + 25,600 eval completions of arith, max 8 new tokens;
``results/arith-default``), ALGO_COST from the other algorithms' wall times in the same runs, the length
factor and MOE_COST from ``results/bench.md`` (RL step at 64 new tokens: 1.43 s measured for 128
completions per step, 1.69 s predicted; tiny-moe 1.1-1.5x tiny-dense), CELL_OVERHEAD_S from the test's
2-step cells (7-18 s each on a busy 2-core machine). A warm start still to build adds WARMSTART_S (the
default preset's ~100 s; arith_scratchpad's, with 7x longer targets, measured 169 s alone: the length matters
less here, as the supervised steps are short and the greedy checks stop at eos). Expect the model to be off by
2x on other machines, tasks or settings; the ETA printed after each cell rescales it by the cells measured so far.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

from gspo_bench.config import RunConfig

# the cost model (see the docstring); seconds on a 2-core CPU
CELL_OVERHEAD_S = 10.0
S_PER_COMPLETION = 1.65e-3
ALGO_COST = {"grpo": 1.0, "gspo": 1.1, "dapo": 1.25, "gspo_token": 1.4, "cispo": 1.5, "ppo": 2.4}
MOE_COST = 1.2
WARMSTART_S = 100.0


def cell_seconds(cfg: RunConfig, algo: str) -> float:
    """The cost model's seconds for one cell (module docstring); rough."""
    from gspo_bench.tasks import resolve_task_spec

    spec = resolve_task_spec(cfg.task)
    r, t = cfg.rollout, cfg.train
    tokens = spec.max_new_tokens if r.max_new_tokens == "auto" else r.max_new_tokens
    n_eval = spec.params.get("n_eval")
    prompts = min(t.eval_prompts, n_eval) if isinstance(n_eval, int) else t.eval_prompts
    evals = 1 + t.steps // t.eval_every + (1 if t.steps % t.eval_every else 0)
    completions = t.steps * r.prompts_per_step * r.group_size + evals * prompts * (1 + t.eval_samples)
    moe = MOE_COST if "moe" in cfg.model.name.lower() else 1.0
    return CELL_OVERHEAD_S + (S_PER_COMPLETION * completions * max(1.0, tokens / 8)
                              * ALGO_COST.get(algo, 1.0) * moe)


@functools.lru_cache(maxsize=32)
def _prompt_format(model: str, trust_remote_code: bool, chat, system: str | None,
                   environment: str = "single_turn") -> str | None:
    """How a model's tokenizer renders a task's prompts (``prompts.rendering_key``, with the tool of the task's
    environment where it has one), loaded once per plan rather than once per scenario and seed."""
    from gspo_bench.models import tokenizer_and_context
    from gspo_bench.tasks.prompts import TOOL_SCHEMAS, rendering_key

    tok, _ = tokenizer_and_context(model, trust_remote_code)
    return rendering_key(tok, chat, system, TOOL_SCHEMAS.get(environment))


def warmstart_key(cfg: RunConfig, seed: int) -> str | None:
    """The warm-start cache key of a scenario's seed; None when that checkpoint is cached already."""
    from gspo_bench.paths import cache_dir
    from gspo_bench.tasks import resolve_task_spec
    from gspo_bench.train.warmstart import cache_key

    spec = resolve_task_spec(cfg.task, cfg.task_options)
    # cache_key reads the task's name, its spec and how its prompts were rendered for the model (raw, or
    # through the chat template), so the tokenizer decides; the data themselves are not loaded
    fmt = _prompt_format(cfg.model.name, cfg.model.trust_remote_code, spec.chat, spec.system, spec.environment)
    key = cache_key(SimpleNamespace(name=spec.name, spec=spec, prompt_format=fmt), cfg.model, cfg.warmstart, seed,
                    cfg.env)
    return None if (cache_dir() / "warmstart" / key / "warmstart.json").is_file() else key
