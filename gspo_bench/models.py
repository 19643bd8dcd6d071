"""Built-in tiny models, the character tokenizer, and the standard loading path.

The machines this harness must run on have no network, so the built-in models
are tiny Qwen3 / Qwen3-MoE *configs* with random weights (a warm start makes
them useful, see ``warmstart.py``). They are saved and loaded exactly like hub
models (``save_pretrained`` / ``from_pretrained``), so a real checkpoint given
with ``--model PATH_OR_HUB_ID`` goes through the same code.
"""

from __future__ import annotations

import os
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3MoeConfig,
)

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
# Printable ASCII minus the characters we never need; one token per character.
CHARSET = string.digits + string.ascii_letters + string.punctuation + " \n"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
BUILTIN_CONTEXT = 512  # tokens (= characters) the built-in tiny models take
FALLBACK_CONTEXT = 4096  # a model that states no context length


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


def hub_cache_dir() -> Path:
    """The local Hugging Face hub cache: $HF_HUB_CACHE, else huggingface_hub's default (read at call time)."""
    from huggingface_hub import constants

    return Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE).expanduser()


def check_model_dir(path: Path) -> None:
    """A local checkpoint must be a directory with a readable ``config.json`` naming a ``model_type`` (what
    ``from_pretrained`` needs first); an empty or partial one is a ValueError here, not a tokenizer traceback."""
    import json

    config = path / "config.json"
    if not path.is_dir() or not config.is_file():
        raise ValueError(f"model directory {str(path)!r} has no config.json (not a saved checkpoint: empty, "
                         "partial, or a file)")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"model directory {str(path)!r}: config.json is corrupt ({e})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ValueError(f"model directory {str(path)!r}: config.json names no model_type")


def classify_model_ref(ref: str) -> str:
    """'builtin', 'path' or 'hub' (a hub id whose config is in the local hub cache). Anything else is a
    ValueError at once, naming the three places looked in: no download is tried, so an offline machine does
    not spend a minute on network retries (``load_pretrained`` reads hub ids from the cache only)."""
    if ref in BUILTIN_MODELS:
        return "builtin"
    if Path(ref).expanduser().exists():
        check_model_dir(Path(ref).expanduser())
        return "path"
    if ref.startswith((".", "/", "~")) or not HUB_ID.match(ref) or ref.count("/") > 1:
        raise ValueError(
            f"model path {ref!r} does not exist (built-in models: {', '.join(BUILTIN_MODELS)}; "
            "or give a local directory or a hub id such as Qwen/Qwen3-0.6B)"
        )
    from huggingface_hub import try_to_load_from_cache

    cache = hub_cache_dir()
    if not isinstance(try_to_load_from_cache(ref, "config.json", cache_dir=cache), str):
        raise ValueError(
            f"model {ref!r} not found: not a built-in model ({', '.join(BUILTIN_MODELS)}), not a local directory "
            f"({str(Path(ref).expanduser().resolve())!r}), not in the Hugging Face cache ({str(cache)!r}); "
            f"download it first (huggingface-cli download {ref}) or give its local directory"
        )
    return "hub"


def _where(ref: str) -> tuple[str, dict]:
    """(path or hub id, from_pretrained keywords) of a non-built-in model."""
    kind = classify_model_ref(ref)
    # a hub id comes from the local cache only (classify_model_ref checked it is there): no network retries
    hub = {"cache_dir": str(hub_cache_dir()), "local_files_only": True} if kind == "hub" else {}
    return (str(Path(ref).expanduser()) if kind == "path" else ref), hub


def tokenizer_and_context(name: str, trust_remote_code: bool = False) -> tuple[PreTrainedTokenizerFast, int]:
    """A model's tokenizer and its context length in tokens, without loading its weights: the built-ins'
    ``max_position_embeddings``; else the config's (or ``n_positions``), else the tokenizer's
    ``model_max_length`` when it is a real number, else ``FALLBACK_CONTEXT``."""
    if classify_model_ref(name) == "builtin":
        return char_tokenizer(), BUILTIN_CONTEXT
    from transformers import AutoConfig

    ref, hub = _where(name)
    tok = AutoTokenizer.from_pretrained(ref, trust_remote_code=trust_remote_code, **hub)
    cfg = AutoConfig.from_pretrained(ref, trust_remote_code=trust_remote_code, **hub)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 0:
            return tok, value
    length = getattr(tok, "model_max_length", None)
    return tok, length if isinstance(length, int) and 0 < length < 10**7 else FALLBACK_CONTEXT


def load_pretrained(
    ref: str, *, trust_remote_code: bool = False, dtype: torch.dtype | str = "auto"
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Standard transformers loading for a local directory or hub id."""
    ref, hub = _where(ref)
    tok = AutoTokenizer.from_pretrained(ref, trust_remote_code=trust_remote_code, **hub)
    model = AutoModelForCausalLM.from_pretrained(ref, trust_remote_code=trust_remote_code, dtype=dtype, **hub)
    if tok.pad_token is None:
        # Many causal LMs ship without a pad token; eos is the usual stand-in.
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def is_moe(model: PreTrainedModel) -> bool:
    """True when the model has routed experts (a ``num_experts``-style config field)."""
    cfg = model.config
    return any(getattr(cfg, k, 0) or 0 for k in ("num_experts", "num_local_experts", "n_routed_experts"))


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
