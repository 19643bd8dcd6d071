"""Loading any causal LM the standard way: a local directory or a hub id already in the local cache.

Nothing is downloaded: a hub id must be in the Hugging Face cache
(``$HF_HUB_CACHE``), so an offline machine does not spend a minute on network
retries, and an unknown name stops at once, naming the places looked in.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerFast

from gspo_bench.models.builtin import BUILTIN_MODELS

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
FALLBACK_CONTEXT = 4096  # a model that states no context length


def hub_cache_dir() -> Path:
    """The local Hugging Face hub cache, read at call time: $HF_HUB_CACHE, else $HF_HOME/hub, else
    huggingface_hub's default."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE).expanduser()


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
    """A model's tokenizer and its context length in tokens, without loading its weights: the config's
    ``max_position_embeddings`` (or ``n_positions``), else the tokenizer's ``model_max_length`` when it is a
    real number, else ``FALLBACK_CONTEXT``."""
    if classify_model_ref(name) == "builtin":
        spec = BUILTIN_MODELS[name]
        tok = spec.make_tokenizer()
        return tok, spec.make_config(tok).max_position_embeddings
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
