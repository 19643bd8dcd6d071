"""``fast``: the package's own KV-cache sampler (``rollout.fastgen``), Qwen3 family, in the policy's process."""

from __future__ import annotations

from gspo_bench.rollout import engine as sampling
from gspo_bench.rollout.engines.base import Capabilities, InProcessEngine, register_engine
from gspo_bench.rollout.fastgen import unsupported_reason


@register_engine("fast")
class FastEngine(InProcessEngine):
    """``engine.fast_generate`` on the policy module; its MoE experts run by ``rollout.moe_kernel``."""

    capabilities = Capabilities(free_logp=True, records_routes=True, whole_parameters=True, auto_order=2,
                                continues=True)
    compiled = False  # decode steps through torch.compile (the ``compiled`` engine)

    @classmethod
    def supports(cls, model) -> str | None:
        return unsupported_reason(model)

    def sample(self, model, tokenizer, prompts, *, max_new_tokens, temperature=1.0, greedy=False,
               return_logp=True, record_routes=False, draws=None, swap=None, version=0):
        return sampling.fast_generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                                      temperature=temperature, greedy=greedy, return_logp=return_logp,
                                      generator=draws, record_routes=record_routes, compiled=self.compiled,
                                      moe_kernel=self.setup.settings.moe_kernel, swap=swap, version=version)
