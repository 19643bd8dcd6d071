"""Built-in models: Qwen3 / Qwen3-MoE *configs* with random weights and a character tokenizer.

The machines this harness must run on have no network, so the built-in models
are configs built locally (a warm start makes the tiny ones useful, see
``train/warmstart.py``). They are saved and loaded exactly like hub models
(``save_pretrained`` / ``from_pretrained``), so a real checkpoint given with
``--model PATH_OR_HUB_ID`` goes through the same code (``loading.py``).

``qwen3-0.6b-arch`` is Qwen3-0.6B's architecture at full size, vocabulary
included, so memory and speed are measured on the real shapes; its tokenizer
is the char tokenizer widened to one Unicode character per id
(``wide_char_tokenizer``), since a random model emits any of its 151,936 ids.
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
    return _one_char_per_token([PAD, BOS, EOS, *CHARSET])


# Code points never used as tokens of the wide tokenizer (``wide_char_tokenizer``): the UTF-16 surrogates (no
# text holds them), the noncharacters, and Unicode's whitespace and zero-width / layout characters, which a
# verifier would strip or a reader not see. Inclusive ranges, written out so the vocabulary does not depend on the
# Unicode version of the Python that builds it.
UNUSED_CODE_POINTS = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x1680, 0x1680), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x2000, 0x200F), (0x2028, 0x202F), (0x205F, 0x206F), (0x3000, 0x3000), (0x3164, 0x3164),
    (0xD800, 0xDFFF), (0xFDD0, 0xFDEF), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFFF),
)
FIRST_WIDE_CODE_POINT = 0x00A1  # after ASCII (the char tokenizer's), the C1 controls and the no-break space


def wide_characters(n: int) -> list[str]:
    """``n`` distinct single characters outside ASCII, in code point order from U+00A1, none of them in
    ``UNUSED_CODE_POINTS`` (Unicode has room for 1.1 million; Qwen3-0.6B's vocabulary ends at U+25A37)."""
    out: list[str] = []
    cp = FIRST_WIDE_CODE_POINT
    for lo, hi in UNUSED_CODE_POINTS:  # sorted: take the run below each gap, then jump over it
        take = min(max(0, lo - cp), n - len(out))
        out.extend(map(chr, range(cp, cp + take)))
        cp = max(cp, hi + 1)
    out.extend(map(chr, range(cp, cp + n - len(out))))
    return out


def wide_char_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """The char tokenizer with one token per id up to ``vocab_size``: its own ids unchanged (specials, then
    printable ASCII), then one non-ASCII character each (``wide_characters``). A model with a real-size vocabulary
    can emit any id; every id decodes to its own one-character string, and encoding that text gives the ids back,
    so sampled completions reach the verifiers as plain (if unusual) text."""
    base = [PAD, BOS, EOS, *CHARSET]
    if vocab_size < len(base):
        raise ValueError(f"vocab_size={vocab_size} is below the char tokenizer's {len(base)} tokens")
    return _one_char_per_token(base + wide_characters(vocab_size - len(base)))


def _one_char_per_token(tokens: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``tokens`` (pad, bos, eos first) that splits text into single characters."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
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


QWEN3_06B_VOCAB = 151_936
"""Qwen3-0.6B's embedding rows (its tokenizer's 151,669 tokens, padded up): ids the model can emit."""


def qwen3_06b_config(tok: PreTrainedTokenizerFast) -> Qwen3Config:
    """Qwen/Qwen3-0.6B's config.json, every architecture field as published: vocabulary 151,936 with tied
    embeddings, hidden 1024, 28 layers, 16 heads / 8 kv heads of 128, MLP 3072, RoPE theta 1e6, RMSNorm eps 1e-6,
    40,960 positions: 0.60B parameters (0.16B of them the embedding). Only the special token ids are ``tok``'s
    (the wide char tokenizer keeps the char tokenizer's pad 0, bos 1, eos 2)."""
    if len(tok) != QWEN3_06B_VOCAB:
        raise ValueError(f"qwen3-0.6b-arch needs a tokenizer of {QWEN3_06B_VOCAB} tokens, got {len(tok)}")
    return Qwen3Config(
        vocab_size=QWEN3_06B_VOCAB, tie_word_embeddings=True, hidden_size=1024, intermediate_size=3072,
        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128, hidden_act="silu",
        max_position_embeddings=40_960, rms_norm_eps=1e-6, rope_parameters={"rope_type": "default",
                                                                            "rope_theta": 1_000_000.0},
        attention_bias=False, attention_dropout=0.0, use_sliding_window=False, max_window_layers=28,
        initializer_range=0.02, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id)


def qwen3_06b_tokenizer() -> PreTrainedTokenizerFast:
    """The wide char tokenizer at Qwen3-0.6B's vocabulary size."""
    return wide_char_tokenizer(QWEN3_06B_VOCAB)


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    make_config: Callable[[PreTrainedTokenizerFast], object]
    """The transformers config, given the model's tokenizer (its size and special ids)."""
    make_tokenizer: Callable[[], PreTrainedTokenizerFast] = char_tokenizer
    """The tokenizer, built locally (no hub)."""
    warm_start: bool = True
    """False: never warm-started whatever ``warmstart.enabled`` says (random weights, too large to fine-tune on a
    CPU; a run with it measures the pipeline, not learning)."""


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
        BuiltinModel("qwen3-0.6b-arch", "Qwen3ForCausalLM with Qwen3-0.6B's config exactly (151,936-token "
                     "vocabulary, tied embeddings, ~0.6B params), random weights, no warm start; char tokenizer "
                     "widened to one Unicode character per id", qwen3_06b_config, qwen3_06b_tokenizer,
                     warm_start=False),
    )
}


def build_builtin(name: str, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Random-weight built-in model (deterministic in ``seed``) and its tokenizer."""
    spec = BUILTIN_MODELS[name]
    tok = spec.make_tokenizer()
    config = spec.make_config(tok)
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
