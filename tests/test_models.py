"""Built-in tiny models, the character tokenizer and the loading path (gspo_bench.models)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM, Qwen3MoeForCausalLM

from gspo_bench.models import (
    BOS,
    CHARSET,
    EOS,
    PAD,
    build_builtin,
    char_tokenizer,
    classify_model_ref,
    count_parameters,
    is_moe,
    load_pretrained,
)


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


@pytest.fixture(scope="module")
def dense():
    return build_builtin("tiny-dense", 0)


# ----------------------------------------------------------------------------- tokenizer


def test_char_tokenizer_special_tokens_and_vocab(tok):
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == (PAD, BOS, EOS)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    # three specials + one id per character of the charset
    assert len(tok) == 3 + len(CHARSET)
    assert tok.padding_side == "left"


@pytest.mark.parametrize("text", ["12+34=46", "Hello, World!", "a b\nc", "~{}|\\", ""])
def test_char_tokenizer_round_trip(tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    # one token per character, none of them special
    assert len(ids) == len(text)
    assert all(i > 2 for i in ids)
    assert tok.decode(ids) == text


def test_char_tokenizer_one_id_per_character(tok):
    ids = tok("0123", add_special_tokens=False)["input_ids"]
    # the vocab lists pad, bos, eos, then digits in order
    assert ids == [3, 4, 5, 6]
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == [PAD, BOS, EOS, "0"]


def test_char_tokenizer_pads_on_the_left(tok):
    enc = tok(["12+3=", "7="], padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    assert len(ids[0]) == len(ids[1]) == 5
    assert ids[1][:3] == [tok.pad_token_id] * 3
    assert mask == [[1, 1, 1, 1, 1], [0, 0, 0, 1, 1]]
    assert ids[1][3:] == tok("7=", add_special_tokens=False)["input_ids"]
    assert tok.batch_decode(ids, skip_special_tokens=True) == ["12+3=", "7="]


def test_char_tokenizer_skip_special_tokens_on_decode(tok):
    ids = [tok.bos_token_id, *tok("42", add_special_tokens=False)["input_ids"], tok.eos_token_id,
           tok.pad_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == "42"
    assert tok.decode(ids, skip_special_tokens=False) == f"{BOS}42{EOS}{PAD}"


def test_tokenizer_save_and_autotokenizer_round_trip(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    texts = ["3+4=7", "Zz!? \n", "9"]
    a = tok(texts, padding=True, add_special_tokens=False)
    b = loaded(texts, padding=True, add_special_tokens=False)
    assert a["input_ids"] == b["input_ids"]
    assert a["attention_mask"] == b["attention_mask"]
    assert loaded.padding_side == "left"
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)
    assert loaded.batch_decode(b["input_ids"], skip_special_tokens=True) == texts


# ----------------------------------------------------------------------------- built-in models


def test_tiny_dense_architecture(dense):
    model, tok = dense
    assert isinstance(model, Qwen3ForCausalLM)
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (128, 4, 4, 2)
    assert c.vocab_size == len(tok)
    assert (c.pad_token_id, c.bos_token_id, c.eos_token_id) == (0, 1, 2)
    n = count_parameters(model)
    assert 800_000 <= n <= 1_200_000, n
    assert model.generation_config.pad_token_id == tok.pad_token_id
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert is_moe(model) is False


def test_count_parameters_by_hand():
    lin = torch.nn.Linear(3, 2)  # 3*2 weights + 2 biases
    assert count_parameters(lin) == 8


def test_build_builtin_is_deterministic_in_seed(dense):
    a, _ = dense
    b, _ = build_builtin("tiny-dense", 0)
    c, _ = build_builtin("tiny-dense", 1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys() == sc.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    # at least the randomly initialised matrices differ across seeds
    differ = [k for k in sa if not torch.equal(sa[k], sc[k])]
    assert "model.embed_tokens.weight" in differ
    assert len(differ) >= 4 * 7  # q, k, v, o, gate, up, down in each of 4 layers


def test_build_builtin_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    build_builtin("tiny-dense", 7)
    assert torch.equal(torch.rand(3), want)


def test_tiny_moe_architecture():
    model, tok = build_builtin("tiny-moe", 0)
    assert isinstance(model, Qwen3MoeForCausalLM)
    assert model.config.num_experts == 8
    assert model.config.num_experts_per_tok == 2
    assert model.config.num_hidden_layers == 4
    assert is_moe(model) is True
    assert count_parameters(model) > count_parameters(build_builtin("tiny-dense", 0)[0])


def test_moe_016b_is_the_gpu_moe_presets_model_at_its_stated_size():
    from transformers import AutoModelForCausalLM

    from gspo_bench.models import BUILTIN_MODELS
    from gspo_bench.rollout.vllm_engine import CPU_EXPERT_ALIGN

    cfg = BUILTIN_MODELS["moe-0.16b"].make_config(char_tokenizer())
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.num_hidden_layers) == (32, 8, 12)
    assert cfg.moe_intermediate_size % CPU_EXPERT_ALIGN == 0  # vLLM on CPU reloads its experts in place
    with torch.device("meta"):  # the shapes without the memory
        model = AutoModelForCausalLM.from_config(cfg)
    assert isinstance(model, Qwen3MoeForCausalLM) and is_moe(model)
    total = count_parameters(model)
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert 0.15e9 < total < 0.17e9  # "~0.16B params (0.05B active)", as its description says
    assert 0.04e9 < total - experts * (1 - 8 / 32) < 0.06e9


# Qwen/Qwen3-0.6B's config.json as published, its architecture fields (its token ids are its own tokenizer's)
QWEN3_06B_PUBLISHED = dict(
    vocab_size=151_936, tie_word_embeddings=True, num_hidden_layers=28, hidden_size=1024, intermediate_size=3072,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40_960,
    rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, attention_dropout=0.0, use_sliding_window=False,
    max_window_layers=28, initializer_range=0.02, model_type="qwen3",
)


@pytest.fixture(scope="module")
def wide_tok():
    from gspo_bench.models import BUILTIN_MODELS

    return BUILTIN_MODELS["qwen3-0.6b-arch"].make_tokenizer()


def test_qwen3_06b_arch_has_qwen3_06bs_config_and_size(wide_tok):
    from transformers import AutoModelForCausalLM

    from gspo_bench.models import BUILTIN_MODELS, QWEN3_06B_VOCAB

    spec = BUILTIN_MODELS["qwen3-0.6b-arch"]
    cfg = spec.make_config(wide_tok)
    assert {k: getattr(cfg, k) for k in QWEN3_06B_PUBLISHED} == QWEN3_06B_PUBLISHED
    assert cfg.rope_parameters["rope_theta"] == 1_000_000 and cfg.rope_parameters["rope_type"] == "default"
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (0, 1, 2)  # the char tokenizer's
    assert QWEN3_06B_VOCAB == len(wide_tok) == cfg.vocab_size
    assert spec.warm_start is False and "no warm start" in spec.description
    with torch.device("meta"):  # the shapes without the 2.4 GB
        model = AutoModelForCausalLM.from_config(cfg)
    assert isinstance(model, Qwen3ForCausalLM) and not is_moe(model)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: counted once
    assert tuple(model.model.embed_tokens.weight.shape) == (151_936, 1024)
    # Qwen3-0.6B's 0.6B: 0.44B in the 28 layers, 151,936 x 1024 = 0.156B in the (tied) embedding
    assert count_parameters(model) == 596_049_920
    with pytest.raises(ValueError, match="151936 tokens, got 99"):
        spec.make_config(char_tokenizer())


def test_wide_tokenizer_gives_every_id_its_own_readable_text(wide_tok, tok):
    n = len(wide_tok)
    texts = wide_tok.batch_decode([[i] for i in range(n)])
    assert all(texts) and len(set(texts)) == n  # every id: a non-empty text no other id decodes to
    # the char tokenizer's ids unchanged: specials where they were, then printable ASCII
    assert texts[:len(tok)] == tok.batch_decode([[i] for i in range(len(tok))])
    assert (wide_tok.pad_token, wide_tok.bos_token, wide_tok.eos_token) == (PAD, BOS, EOS)
    assert (wide_tok.pad_token_id, wide_tok.bos_token_id, wide_tok.eos_token_id) == (0, 1, 2)
    rest = texts[len(tok):]
    assert all(len(t) == 1 and ord(t) > 0xA0 and not t.isspace() for t in rest)
    assert not any(0xD800 <= ord(t) <= 0xDFFF for t in rest)  # no surrogate: every text encodes as UTF-8
    # fixed code points, whatever Unicode tables the running Python has
    assert (rest[0], texts[-1]) == ("\u00a1", chr(0x25A37))
    # the text of any id sequence encodes back to the same ids, so sampled completions survive a round trip
    ids = list(range(3, n))
    assert wide_tok(wide_tok.decode(ids), add_special_tokens=False)["input_ids"] == ids
    assert wide_tok("12+34=46", add_special_tokens=False)["input_ids"] == tok("12+34=46",
                                                                               add_special_tokens=False)["input_ids"]


def test_wide_tokenizer_round_trips_through_save_pretrained(wide_tok, tmp_path):
    wide_tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(loaded) == len(wide_tok) and loaded.get_vocab() == wide_tok.get_vocab()
    assert loaded.padding_side == "left" and (loaded.pad_token_id, loaded.eos_token_id) == (0, 2)
    text = "7+8=" + wide_tok.decode(list(range(150_000, 150_010))) + "15"
    assert loaded(text, add_special_tokens=False)["input_ids"] == wide_tok(text, add_special_tokens=False)["input_ids"]


def test_wide_char_tokenizer_refuses_a_vocabulary_below_the_char_tokenizers():
    from gspo_bench.models import wide_char_tokenizer

    assert len(wide_char_tokenizer(99)) == 99 and len(wide_char_tokenizer(1000)) == 1000
    with pytest.raises(ValueError, match="below the char tokenizer's 99 tokens"):
        wide_char_tokenizer(50)


def test_qwen3_06b_arch_builds_and_samples_text_a_verifier_scores():
    """The one test that builds the full model (2.4 GB of float32): tied for real, and what random weights
    sample decodes to text the arith verifier reads (and scores 0)."""
    from gspo_bench.rollout.engines import generate
    from gspo_bench.tasks import load_task

    model, wide = build_builtin("qwen3-0.6b-arch", 0)
    assert model.config.vocab_size == len(wide) == 151_936
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    task = load_task("arith", 0)
    rows = task.eval.select(range(2))
    torch.manual_seed(0)
    gen = generate("fast", model, wide, list(rows["prompt"]) * 2, max_new_tokens=6, greedy=False)
    response = gen.input_ids[:, gen.prompt_len:]
    assert len(gen.texts) == 4 and all(isinstance(t, str) for t in gen.texts)
    assert response.max() >= 99  # random weights over 151,936 ids: the wide part is sampled
    for text, ids, mask in zip(gen.texts, response, gen.response_mask):
        kept = [i for i, m in zip(ids.tolist(), mask.tolist()) if m and i > 2]
        assert wide(text, add_special_tokens=False)["input_ids"] == kept
    rewards, timeouts = task.score(gen.texts, list(rows["answer"]) * 2)
    assert rewards == [0.0] * 4 and timeouts == 0


def test_build_builtin_unknown_name():
    with pytest.raises(KeyError):
        build_builtin("tiny-nope", 0)


# ----------------------------------------------------------------------------- classify / load


def test_classify_model_ref(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert classify_model_ref("tiny-dense") == "builtin"
    assert classify_model_ref("tiny-moe") == "builtin"
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):  # an empty directory is no checkpoint
        classify_model_ref("./ckpt")
    (tmp_path / "ckpt" / "config.json").write_text('{"model_type": "qwen3"}')
    assert classify_model_ref("./ckpt") == "path"
    assert classify_model_ref(str(tmp_path / "ckpt")) == "path"
    cache = tmp_path / "hf"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    for repo in ("Qwen/Qwen3-0.6B", "gpt2"):  # the hub cache's layout: refs/main -> snapshots/<rev>/
        _cache_repo(cache, repo, {"model_type": "qwen3"})
        assert classify_model_ref(repo) == "hub"


def _cache_repo(cache, repo: str, config: dict) -> Path:
    import json

    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text("0" * 40)
    snap = root / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True, exist_ok=True)
    (snap / "config.json").write_text(json.dumps(config))
    return snap


def test_a_hub_id_not_in_the_cache_fails_at_once_naming_three_places(tmp_path, monkeypatch, capsys):
    import gspo_bench.models.loading
    from gspo_bench.cli.main import main

    def no_download(*a, **k):  # the run must stop before any loading, hence before any network retry
        raise AssertionError("from_pretrained was called")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    with pytest.raises(ValueError) as e:
        classify_model_ref("someone/no-such-model")
    msg = str(e.value)
    assert "not a built-in model (tiny-dense" in msg and str(tmp_path / "someone" / "no-such-model") in msg
    assert str(tmp_path / "hf") in msg and "huggingface-cli download someone/no-such-model" in msg
    monkeypatch.setattr(gspo_bench.models.loading.AutoTokenizer, "from_pretrained", no_download)
    monkeypatch.setattr(gspo_bench.models.loading.AutoModelForCausalLM, "from_pretrained", no_download)
    code = main(["run", "--model", "someone/no-such-model", "--tracking-uri", f"sqlite:///{tmp_path}/m.db",
                 "--no-progress"])
    out = capsys.readouterr()
    assert code == 2 and len((out.out + out.err).strip().splitlines()) == 1
    assert "not in the Hugging Face cache" in out.out + out.err


def test_load_pretrained_reads_a_hub_id_from_the_cache(dense, tmp_path, monkeypatch):
    model, tok = dense
    cache = tmp_path / "hf"
    snap = _cache_repo(cache, "someone/tiny", {})
    model.save_pretrained(snap)
    tok.save_pretrained(snap)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    loaded, _ = load_pretrained("someone/tiny", dtype=torch.float32)
    for (name, p), (_, q) in zip(model.named_parameters(), loaded.named_parameters()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("ref", ["./missing", "/no/such/dir", "~/no-such-dir-gspo-bench-test", "a/b/c", "bad id!"])
def test_classify_model_ref_rejects_missing_paths(ref, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as e:
        classify_model_ref(ref)
    assert repr(ref) in str(e.value)
    assert "tiny-dense" in str(e.value)  # the message lists the built-ins


def test_tokenizer_and_context_without_loading_weights(dense, tmp_path):
    from gspo_bench.models import BUILTIN_CONTEXT, tokenizer_and_context

    tok, ctx = tokenizer_and_context("tiny-dense")
    assert ctx == BUILTIN_CONTEXT == dense[0].config.max_position_embeddings and tok("12")["input_ids"]
    model, tok = dense
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()  # no weights needed: only the config and the tokenizer
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 96}))
    got, ctx = tokenizer_and_context(str(tmp_path))
    assert ctx == 96 and got("1+2=")["input_ids"] == tok("1+2=")["input_ids"]


def test_load_pretrained_round_trip(dense, tmp_path):
    model, tok = dense
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, ltok = load_pretrained(str(tmp_path))
    assert isinstance(loaded, Qwen3ForCausalLM)
    assert loaded.dtype == torch.float32
    assert ltok.padding_side == "left"
    assert ltok.pad_token_id == tok.pad_token_id
    assert loaded.generation_config.pad_token_id == tok.pad_token_id

    enc = ltok(["1+2=", "34+56="], return_tensors="pt", padding=True, add_special_tokens=False)
    assert enc["input_ids"].tolist() == tok(["1+2=", "34+56="], padding=True, add_special_tokens=False)["input_ids"]
    model.eval()
    loaded.eval()
    with torch.no_grad():
        want = model(**enc).logits
        got = loaded(**enc).logits
    assert got.shape == (2, 6, len(tok))
    assert torch.equal(got, want)


def test_load_pretrained_missing_path_raises(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_pretrained(str(tmp_path / "nothing-here"))
