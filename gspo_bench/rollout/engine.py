"""The rollout layout, the two in-process samplers, and token log-probs (the training forward).

A rollout is stored as one left-padded prompt block followed by a right-padded
response block, so every response starts at the same column ``P``:

    input_ids (B, P + T) = [pad.. prompt | response .. eos pad..]

``response_mask`` (B, T) is 1 on generated tokens up to and including the
first eos. Position ids are derived from the attention mask, as
transformers' ``generate`` does, so a training forward pass sees the same
positions the sampler saw.

``hf_generate`` (transformers' ``generate``) and ``fast_generate`` (``fastgen``)
sample in that layout; the engines that wrap them, and the choice among
engines, are ``rollout.engines``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gspo_bench.rollout.recompute import layer_context
from gspo_bench.rollout.routing import RouterHooks, empty_grid, pinned_routes, routers

from gspo_bench.config.sections import LOGIT_CHUNK_TOKENS
from gspo_bench.core.lm_head import token_logp_entropy


@dataclass
class Generation:
    """Token-level output of one generate call (all tensors on the model's device)."""

    input_ids: torch.Tensor  # (B, P+T)
    attention_mask: torch.Tensor  # (B, P+T)
    prompt_len: int  # P
    response_mask: torch.Tensor  # (B, T) float
    rollout_logp: torch.Tensor | None  # (B, T) log-probs the sampler used, or None
    texts: list[str]  # decoded responses, without special tokens
    routes: torch.Tensor | None = None  # (layers, B, P+T, k) experts the sampler chose (MoE), -1 = none
    versions: torch.Tensor | None = None  # (B, T) long: the weights' version that sampled each token (None: one
    # version, the call's, for all)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    # pos_t = (number of real tokens before t), pads get 0
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def response_mask_from(response_ids: torch.Tensor, eos_id: int | list[int], pad_id: int) -> torch.Tensor:
    """1 up to and including the first eos of each row, 0 after it.

    A pad token *sampled* before eos stays in the response: ``generate`` fed it
    back to the model, so the training pass must see it too. Only what comes
    after eos (where ``generate`` writes pads) is masked.
    """
    eos_ids = torch.tensor([eos_id] if isinstance(eos_id, int) else list(eos_id), device=response_ids.device)
    is_eos = torch.isin(response_ids, eos_ids)
    # tokens strictly after the first eos: cumulative eos count, shifted right by one
    after = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    return (~after).float()


def token_logp(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[token] without keeping the full log-softmax around."""
    logits = logits.float() / temperature
    # log p(x) = logit_x - logsumexp(logits)
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    # H = -sum_v p_v log p_v
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


PLAIN_HEAD_TYPES = ("deepseek_v3", "gemma", "gpt2", "llama", "mistral", "mixtral", "olmo2", "phi", "phi3", "qwen2",
                    "qwen2_moe", "qwen3", "qwen3_moe", "smollm3")
"""Model types whose *ForCausalLM computes its logits as ``lm_head(last_hidden_state)`` and nothing more (as
transformers' modelling code reads): ``forward_response`` can run their decoder stack and apply the head itself, in
chunks. Others (logit soft-capping, logit scales: gemma2, cohere, granite, ...) give their module's whole logits."""


def plain_head(model) -> bool:
    """Whether ``model``'s logits are its output embedding applied to its decoder stack's last hidden state."""
    return (getattr(getattr(model, "config", None), "model_type", None) in PLAIN_HEAD_TYPES
            and model.get_output_embeddings() is not None)


@contextlib.contextmanager
def checkpointed_layers(model, mode: bool | str = True):
    """transformers' activation checkpointing of ``model``'s decoder layers for the forwards inside (where grad
    is on; transformers checkpoints in training mode only) in ``mode`` (true: full; ``selective``:
    ``rollout/recompute.py``), MoE routes pinned for the backward's recomputation (``routing.pinned_routes``);
    off again after, since ``generate`` needs the KV cache a checkpointed layer drops."""
    if not (mode and torch.is_grad_enabled()):
        yield
        return
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"train.activation_checkpointing: {type(model).__name__} does not support transformers' "
                         "gradient checkpointing; set train.activation_checkpointing=false")
    kwargs = {"use_reentrant": False, "context_fn": layer_context(mode, pinned_routes(routers(model)))}
    # transformers >= 5.24 names it activation checkpointing (the gradient_ names warn, and go in v6)
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    try:
        yield
    finally:
        (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()
        model.disable_input_require_grads()  # the embedding hook the enable adds


def forward_response(model, input_ids, attention_mask, prompt_len: int, temperature: float = 1.0,
                     with_entropy: bool = False, output_hidden_states: bool = False,
                     logit_chunk_tokens: int | str = LOGIT_CHUNK_TOKENS, checkpoint_layers: bool | str = False,
                     entropy_grad: bool = False):
    """Per-token log-probs of the response block, (B, T); optionally entropy (with a gradient when
    ``entropy_grad``) and the final hidden states (B, T, H) that predict it.

    ``logit_chunk_tokens`` > 0 and a ``plain_head`` model: the decoder stack runs, and the LM head over the
    B x T positions that many at a time (``core.lm_head``: no (B, T, V) logits); else the module's own logits,
    all at once. ``checkpoint_layers``: activation checkpointing for this call (``checkpointed_layers``).
    """
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                  use_cache=False)
    resp = input_ids[:, prompt_len:]
    if logit_chunk_tokens and plain_head(model):
        with checkpointed_layers(model, checkpoint_layers):
            # the final-norm state at position t predicts token t+1: the response block is predicted by [P-1, P+T-1)
            h = model.base_model(**inputs).last_hidden_state[:, prompt_len - 1 : -1]  # (B, T, H)
        head = model.get_output_embeddings()
        lp, ent = token_logp_entropy(h.reshape(-1, h.shape[-1]), head.weight, head.bias, resp.reshape(-1),
                                     temperature, logit_chunk_tokens, with_entropy, entropy_grad)
        return lp.view(resp.shape), (None if ent is None else ent.view(resp.shape)), (
            h if output_hidden_states else None)
    with checkpointed_layers(model, checkpoint_layers):
        out = model(**inputs, output_hidden_states=output_hidden_states)
    # logits at position t predict token t+1: the response block is predicted by [P-1, P+T-1)
    logits = out.logits[:, prompt_len - 1 : -1]
    logp = token_logp(logits, resp, temperature)
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = token_entropy(logits if entropy_grad else logits.detach(), temperature)
    hidden = out.hidden_states[-1][:, prompt_len - 1 : -1] if output_hidden_states else None
    return logp, ent, hidden


def uses_packed(model, forward: str = "auto") -> bool:
    """Whether ``response_logp`` runs ``fastlm``'s packed forward (True) or the transformers module (False)."""
    from gspo_bench.rollout import fastlm

    if forward == "packed" and not fastlm.supports(model):
        raise ValueError(f"train.forward=packed does not support this model ({fastlm.unsupported_reason(model)}); "
                         "use train.forward=hf")
    return forward == "packed" or (forward == "auto" and fastlm.supports(model))


def response_logp(model, input_ids, attention_mask, prompt_len: int, temperature: float = 1.0,
                  with_entropy: bool = False, forward: str = "auto", share_prompts: bool = False,
                  moe_kernel: str = "auto", logit_chunk_tokens: int | str = LOGIT_CHUNK_TOKENS,
                  checkpoint_layers: bool | str = False, entropy_grad: bool = False,
                  accumulate_grads: bool = False):
    """(log-probs, entropy or None) of the response block, (B, T) each, zero where the mask is 0.

    ``forward``: ``packed`` runs ``fastlm`` over the real tokens only (Qwen3
    family), ``hf`` the transformers module over the padded batch, ``auto``
    the first that supports the model. ``share_prompts`` (packed only): rows
    with the same prompt compute it once (``fastlm.packed_states``).
    ``moe_kernel`` (packed only): how MoE layers run their experts (``rollout.moe_kernel``).
    ``logit_chunk_tokens``: tokens per chunk of the LM head (``train.logit_chunk_tokens``; 0 = all at once);
    ``checkpoint_layers``: activation checkpointing (``train.activation_checkpointing``); ``entropy_grad``: the
    entropy carries its gradient (an entropy bonus in the loss); ``accumulate_grads`` (packed only): the weight
    gradients are added into the ``.grad`` already there inside their matmuls (``core.accumulate``; a
    micro-batch after the first).
    """
    from gspo_bench.rollout import fastlm

    if uses_packed(model, forward):
        logp, ent, _ = fastlm.packed_response_logp(model, input_ids, attention_mask, prompt_len, temperature,
                                                   with_entropy, share_prompts, moe_kernel,
                                                   logit_chunk_tokens=logit_chunk_tokens,
                                                   checkpoint_layers=checkpoint_layers, entropy_grad=entropy_grad,
                                                   accumulate_grads=accumulate_grads)
        return logp, ent
    mask = attention_mask[:, prompt_len:].to(torch.float32)
    logp, ent, _ = forward_response(model, input_ids, attention_mask, prompt_len, temperature, with_entropy,
                                    logit_chunk_tokens=logit_chunk_tokens, checkpoint_layers=checkpoint_layers,
                                    entropy_grad=entropy_grad)
    return logp * mask, (None if ent is None else ent * mask)


@torch.inference_mode()
def hf_generate(model, tokenizer, prompts: list[str], *, max_new_tokens: int, temperature: float = 1.0,
                greedy: bool = False, return_logp: bool = True, record_routes: bool = False,
                draws=None) -> Generation:
    """Sample with transformers' ``generate`` (KV-cached), batch of already-repeated prompts.

    ``record_routes`` (MoE): keep the experts the router chose for every token fed to the model.
    ``draws`` (``rollout.draws``; None: torch's global generator): a per-request one samples each row by
    inverse CDF from its own draws (``PerRowSampler``), as the fast engine does; any other stands in for
    torch's generator while ``generate`` samples."""
    from gspo_bench.rollout.draws import GlobalDraws

    enc, eos = encode_prompts(model, tokenizer, prompts)
    draws = GlobalDraws() if draws is None else draws
    kwargs = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    if not greedy and getattr(draws, "per_request", False):
        # generate's greedy pick of scores that are -inf everywhere but each row's own sampled token
        kwargs = dict(do_sample=False, logits_processor=[PerRowSampler(draws, temperature)])
    calls: list[torch.Tensor] = []
    # every forward of generate routes the (B * P) prompt cells first, then one column of B cells per step
    hooks = RouterHooks(model, on_forward=calls.append) if record_routes else contextlib.nullcontext()
    with hooks, draws.as_global(enc["input_ids"].device) if not kwargs.get("logits_processor") else \
            contextlib.nullcontext():
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos,
            return_dict_in_generate=True,
            output_logits=return_logp and not greedy,
            **kwargs,
        )
    gen = finish_generation(tokenizer, enc, out.sequences[:, enc["input_ids"].shape[1]:], eos)
    if calls:
        B, P = enc["input_ids"].shape
        grid = empty_grid(model, B, gen.input_ids.shape[1], device=gen.input_ids.device)
        grid[:, :, :P] = calls[0].view(grid.shape[0], B, P, -1).to(grid.dtype)
        for j, step in enumerate(calls[1:grid.shape[2] - P + 1]):
            grid[:, :, P + j] = step.view(grid.shape[0], B, -1).to(grid.dtype)
        gen.routes = recorded_only(grid, gen.attention_mask)
    if return_logp and not greedy and out.logits:
        logits = torch.stack(out.logits, dim=1)  # (B, T, V) raw logits
        gen.rollout_logp = token_logp(logits, gen.input_ids[:, gen.prompt_len:], temperature) * gen.response_mask
    return gen


class PerRowSampler:
    """A transformers logits processor that samples each row by inverse CDF (``fastgen.sample``) from its own
    draws, and leaves ``generate`` (greedy) only that token to pick: every row's t-th token from the t-th draw
    of its own generator, as the fast engine samples it."""

    def __init__(self, draws, temperature: float):
        self.draws, self.temperature = draws, temperature

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        from gspo_bench.rollout.fastgen import sample

        tok, _ = sample(scores, self.temperature, False, self.draws, torch.arange(scores.shape[0]))
        return torch.full_like(scores, float("-inf")).scatter_(1, tok[:, None], 0.0)


def recorded_only(grid: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    # routes of cells that are not real tokens of the final layout (padding, anything after eos) become -1
    return torch.where(attention_mask.bool()[None, :, :, None], grid, torch.full_like(grid, -1))


def eos_ids(model, tokenizer) -> list[int]:
    """The token ids that end a response: the model's generation config's (one or several), else the
    tokenizer's eos."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos)


def encode_prompts(model, tokenizer, prompts: list[str] | list[list[int]]):
    """Left-padded prompt batch on the model's device, and the eos id(s) that end a response. ``prompts``: token
    ids (what a rollout hands an engine: the ids it recorded, never encoded again), or text for a one-off call,
    encoded here without special tokens."""
    device = next(model.parameters()).device
    if prompts and not isinstance(prompts[0], str):
        return left_padded(prompts, tokenizer.pad_token_id, device), eos_ids(model, tokenizer)
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    return enc, eos_ids(model, tokenizer)


def prompt_ids(tokenizer, prompts: list[str]) -> list[list[int]]:
    """Each prompt's token ids, without special tokens (as ``encode_prompts`` encodes text)."""
    return tokenizer(prompts, add_special_tokens=False)["input_ids"]


def left_padded(ids: list[list[int]], pad_id: int, device=None) -> dict[str, torch.Tensor]:
    """Prompts' token ids as a left-padded batch: ``input_ids`` and ``attention_mask`` (B, P), P the longest."""
    P = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), P), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(ids), P), dtype=torch.long)
    for b, x in enumerate(ids):
        if x:
            input_ids[b, P - len(x):] = torch.tensor(x, dtype=torch.long)
            attention_mask[b, P - len(x):] = 1
    return {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}


def finish_generation(tokenizer, enc, resp: torch.Tensor, eos: list[int]) -> Generation:
    """The rollout layout from prompts and raw responses (B, T); rollout_logp left for the engine to fill."""
    rmask = response_mask_from(resp, eos, tokenizer.pad_token_id)
    # pad out anything after eos so stale tokens never leak into a training pass
    resp = torch.where(rmask.bool(), resp, torch.full_like(resp, tokenizer.pad_token_id))
    seq = torch.cat([enc["input_ids"], resp], dim=1)
    attn = torch.cat([enc["attention_mask"], rmask.long()], dim=1)
    texts = tokenizer.batch_decode(resp, skip_special_tokens=True)
    return Generation(seq, attn, enc["input_ids"].shape[1], rmask, None, texts)


def fast_generate(model, tokenizer, prompts: list[str], *, max_new_tokens: int, temperature: float = 1.0,
                  greedy: bool = False, return_logp: bool = True, generator=None,
                  record_routes: bool = False, compiled: bool = False, moe_kernel: str = "auto", swap=None,
                  version: int = 0) -> Generation:
    """Sample with the fast engine (``fastgen``): same contract as ``hf_generate``. ``compiled``: its decode
    steps through ``torch.compile`` with static shapes (``rollout.compiled``), where that serves the model.
    ``moe_kernel``: how MoE layers run their experts (``rollout.moe_kernel``). ``swap``: partial rollouts, called
    between two decode steps, returns the version of new weights it loaded into ``model`` (None: none came);
    the generation's ``versions`` then say which version sampled each token, ``version`` the first."""
    from gspo_bench.rollout.fastgen import decode

    enc, eos = encode_prompts(model, tokenizer, prompts)
    routes = None
    if record_routes and routers(model):
        B, P = enc["input_ids"].shape
        routes = empty_grid(model, B, P + max_new_tokens, device=enc["input_ids"].device)
    versions = None if swap is None else torch.full((len(enc["input_ids"]), max_new_tokens), version,
                                                     dtype=torch.long)
    resp, logp = decode(model, enc["input_ids"], enc["attention_mask"], max_new_tokens=max_new_tokens,
                        eos_ids=eos, temperature=temperature, greedy=greedy, generator=generator, routes=routes,
                        compiled=compiled, moe_kernel=moe_kernel, swap=swap, versions=versions)
    gen = finish_generation(tokenizer, enc, resp, eos)
    if versions is not None:
        gen.versions = versions[:, :gen.response_mask.shape[1]].to(gen.input_ids.device)
    if routes is not None:
        gen.routes = recorded_only(routes[:, :, :gen.input_ids.shape[1]], gen.attention_mask)
    if logp is not None and return_logp:
        gen.rollout_logp = logp * gen.response_mask
    return gen
