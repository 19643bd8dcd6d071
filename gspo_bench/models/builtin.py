"""Built-in models: Qwen3 / Qwen3-MoE *configs* with random weights and a character tokenizer.

The machines this harness must run on have no network, so the built-in models
are configs built locally (a warm start makes the tiny ones useful, see
``train/warmstart.py``). They are saved and loaded exactly like hub models
(``save_pretrained`` / ``from_pretrained``), so a real checkpoint given with
``--model PATH_OR_HUB_ID`` goes through the same code (``loading.py``).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Callable

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3MoeConfig,
)

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
# Printable ASCII minus the characters we never need; one token per character.
CHARSET = string.digits + string.ascii_letters + string.punctuation + " \n"
BUILTIN_CONTEXT = 512  # tokens (= characters) the built-in tiny models take


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer built with ``tokenizers``, wrapped for transformers."""
    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, *CHARSET])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    # Split("") isolates every character, so the word-level model sees one char at a time.
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=PAD,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def _common(tok: PreTrainedTokenizerFast) -> dict:
    return dict(
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        max_position_embeddings=BUILTIN_CONTEXT,
        tie_word_embeddings=True,
    )


# the trunk both built-in models share
TINY_TRUNK = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32)


def tiny_dense_config(tok: PreTrainedTokenizerFast) -> Qwen3Config:
    """Qwen3, hidden 128, 4 layers, 4 heads / 2 kv heads: about 1M parameters."""
    return Qwen3Config(**TINY_TRUNK, **_common(tok))


def tiny_moe_config(tok: PreTrainedTokenizerFast) -> Qwen3MoeConfig:
    """Qwen3-MoE, same trunk as tiny-dense, 8 experts with top-2 routing per layer."""
    return Qwen3MoeConfig(**TINY_TRUNK, moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2,
                          norm_topk_prob=True, **_common(tok))


def small_dense_config(tok: PreTrainedTokenizerFast) -> Qwen3Config:
    """Qwen3, hidden 512, 14 layers, 8 heads / 4 kv heads: about 44M parameters (a middle point for timings)."""
    return Qwen3Config(hidden_size=512, intermediate_size=1536, num_hidden_layers=14, num_attention_heads=8,
                       num_key_value_heads=4, head_dim=64, **_common(tok))


def dense_05b_config(tok: PreTrainedTokenizerFast) -> Qwen3Config:
    """Qwen3-0.6B's trunk (hidden 1024, 28 layers, 16 heads / 8 kv heads of 128, MLP 3072) with the char
    tokenizer's vocabulary instead of 151k tokens: about 0.44B parameters."""
    return Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, **_common(tok))


def moe_016b_config(tok: PreTrainedTokenizerFast) -> Qwen3MoeConfig:
    """Qwen3-MoE at the scale of a GPU preset (``gpu-moe``) that still builds on a CPU: hidden 512, 12 layers,
    8 heads / 4 kv heads of 64, 32 experts of width 256 with top-8 routing (Qwen3-30B-A3B's 128 experts top-8,
    scaled down): about 0.16B parameters, 0.05B active per token. The expert width is a multiple of 32, which
    vLLM on CPU needs to reload experts in place (``rollout/vllm_engine.py``)."""
    return Qwen3MoeConfig(hidden_size=512, num_hidden_layers=12, num_attention_heads=8,
                          num_key_value_heads=4, head_dim=64, moe_intermediate_size=256, num_experts=32,
                          num_experts_per_tok=8, norm_topk_prob=True, **_common(tok))


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    make_config: Callable[[PreTrainedTokenizerFast], object]


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in (
        BuiltinModel("tiny-dense", "Qwen3ForCausalLM, ~1M params, char tokenizer", tiny_dense_config),
        BuiltinModel("tiny-moe", "Qwen3MoeForCausalLM, 8 experts top-2, char tokenizer", tiny_moe_config),
        BuiltinModel("small-dense", "Qwen3ForCausalLM, ~44M params, char tokenizer (timings)", small_dense_config),
        BuiltinModel("dense-0.5b", "Qwen3ForCausalLM with Qwen3-0.6B's trunk, ~0.44B params, char tokenizer",
                     dense_05b_config),
        BuiltinModel("moe-0.16b", "Qwen3MoeForCausalLM, 12 layers, 32 experts top-8, ~0.16B params (0.05B active), "
                     "char tokenizer", moe_016b_config),
    )
}


def build_builtin(name: str, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Random-weight built-in model (deterministic in ``seed``) and its tokenizer."""
    tok = char_tokenizer()
    config = BUILTIN_MODELS[name].make_config(tok)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model, tok


def is_moe(model: PreTrainedModel) -> bool:
    """True when the model has routed experts (a ``num_experts``-style config field)."""
    cfg = model.config
    return any(getattr(cfg, k, 0) or 0 for k in ("num_experts", "num_local_experts", "n_routed_experts"))


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
