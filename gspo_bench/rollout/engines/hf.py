"""``hf``: transformers' own ``generate`` (KV-cached) on the policy module: any causal LM."""

from __future__ import annotations

from gspo_bench.rollout import engine as sampling
from gspo_bench.rollout.engines.base import Capabilities, InProcessEngine, register_engine


@register_engine("hf")
class HfEngine(InProcessEngine):
    """``engine.hf_generate``: its log-probs need every step's logits kept, so a run asks for them only when it
    uses them. ``generate`` draws from torch's generator, which ``draws`` stands in for during the call (a
    per-request ``draws``: each row sampled from its own, ``engine.PerRowSampler``)."""

    capabilities = Capabilities(free_logp=False, records_routes=True, auto_order=3)

    def sample(self, model, tokenizer, prompts, *, max_new_tokens, temperature=1.0, greedy=False,
               return_logp=True, record_routes=False, draws=None):
        return sampling.hf_generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                                    temperature=temperature, greedy=greedy, return_logp=return_logp,
                                    record_routes=record_routes, draws=draws)
