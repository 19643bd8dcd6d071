"""``hf``: transformers' own ``generate`` (KV-cached) on the policy module: any causal LM."""

from __future__ import annotations

from gspo_bench.rollout import engine as sampling
from gspo_bench.rollout.engines.base import Capabilities, InProcessEngine, register_engine


@register_engine("hf")
class HfEngine(InProcessEngine):
    """``engine.hf_generate``: its log-probs need every step's logits kept, so a run asks for them only when it
    uses them. It draws from torch's global generator (``generator`` must be None)."""

    capabilities = Capabilities(free_logp=False, records_routes=True, auto_order=3)

    def sample(self, model, tokenizer, prompts, *, max_new_tokens, temperature=1.0, greedy=False,
               return_logp=True, record_routes=False, generator=None):
        if generator is not None:
            raise ValueError("engine hf samples from torch's global generator; it takes no generator")
        return sampling.hf_generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                                    temperature=temperature, greedy=greedy, return_logp=return_logp,
                                    record_routes=record_routes)
