"""Models: the built-in configs and their character tokenizers (``builtin.py``), and loading any causal LM the
standard way (``loading.py``).

May import: tracking, config, core, paths (and torch, transformers, tokenizers); in practice none of them.
"""

from gspo_bench.models.builtin import (BOS, BUILTIN_CONTEXT, BUILTIN_MODELS, CHARSET, EOS, PAD, QWEN3_06B_VOCAB,
                                       BuiltinModel, build_builtin, char_tokenizer, count_parameters, is_moe,
                                       wide_char_tokenizer)
from gspo_bench.models.loading import (FALLBACK_CONTEXT, HUB_ID, check_model_dir, classify_model_ref, hub_cache_dir,
                                       load_pretrained, tokenizer_and_context)

__all__ = ["BOS", "BUILTIN_CONTEXT", "BUILTIN_MODELS", "CHARSET", "EOS", "FALLBACK_CONTEXT", "HUB_ID", "PAD",
           "QWEN3_06B_VOCAB", "BuiltinModel", "build_builtin", "char_tokenizer", "check_model_dir",
           "classify_model_ref", "count_parameters", "hub_cache_dir", "is_moe", "load_pretrained",
           "tokenizer_and_context", "wide_char_tokenizer"]
