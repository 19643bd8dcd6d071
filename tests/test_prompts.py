"""Prompt rendering (gspo_bench.tasks.prompts): raw or through a chat template, the one rendering that the warm
start, the rollouts and the evaluation all read; checked with a tokenizer that carries a Jinja template, saved and
loaded like a hub checkpoint."""

from __future__ import annotations

import pytest
from mlflow_fakes import one_line

from gspo_bench.cli.main import main
from gspo_bench.config import ModelConfig, RolloutConfig, TaskOptions, WarmStartConfig
from gspo_bench.models import build_builtin, char_tokenizer
from gspo_bench.tasks import load_task
from gspo_bench.tasks.prompts import render_chat, render_prompts, rendering_key, uses_chat

# a small chat template, Jinja as transformers runs it; every character is in the char tokenizer's CHARSET
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def chat_tokenizer():
    tok = char_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    """tiny-dense with the char tokenizer plus TEMPLATE, saved with save_pretrained like any checkpoint."""
    path = tmp_path_factory.mktemp("chat-model")
    model, _ = build_builtin("tiny-dense", 0)
    model.save_pretrained(path)
    chat_tokenizer().save_pretrained(path)
    return str(path)


def test_the_rules_for_auto_true_and_false():
    plain, chat = char_tokenizer(), chat_tokenizer()
    assert not uses_chat("auto", plain) and uses_chat("auto", chat)
    assert uses_chat(True, chat) and not uses_chat(False, chat)
    with pytest.raises(ValueError, match="has no chat template"):
        uses_chat(True, plain)
    with pytest.raises(ValueError, match="allowed: auto, true, false"):
        uses_chat(1, chat)
    assert render_prompts(["1+2="], chat, False) == ["1+2="] == render_prompts(["1+2="], plain, "auto")


def test_rendered_text_exactly():
    tok = chat_tokenizer()
    assert render_chat(tok, "Question: 1+2?\nAnswer:") == "<|user|>\nQuestion: 1+2?\nAnswer:\n<|assistant|>\n"
    assert render_chat(tok, "1+2=", system="Be brief.") == "<|system|>\nBe brief.\n<|user|>\n1+2=\n<|assistant|>\n"
    assert rendering_key(tok, "auto") != rendering_key(tok, "auto", "Be brief.")
    assert rendering_key(tok, False) is None and rendering_key(char_tokenizer(), "auto") is None


def test_a_saved_checkpoint_keeps_its_template_and_load_task_renders_with_it(chat_model_dir):
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(chat_model_dir).chat_template == TEMPLATE
    raw = load_task("arith", 0)
    model = ModelConfig(name=chat_model_dir)
    assert load_task("arith", 0, model).prompt_format is None  # the spec says chat: false
    task = load_task("arith", 0, model, options=TaskOptions(chat="auto", system="Add."))
    assert task.prompt_format is not None
    assert task.train[0]["prompt"] == f"<|system|>\nAdd.\n<|user|>\n{raw.train[0]['prompt']}\n<|assistant|>\n"
    assert list(task.eval["answer"]) == list(raw.eval["answer"])  # only the prompts change
    builtin = load_task("arith", 0, ModelConfig("tiny-dense"), options=TaskOptions(chat="auto"))
    assert builtin.prompt_format is None and list(builtin.eval["prompt"]) == list(raw.eval["prompt"])


def test_warm_start_rollout_and_eval_see_the_same_prompt_strings(chat_model_dir, tmp_path, monkeypatch):
    import gspo_bench.train.warmstart as ws_mod
    from gspo_bench.rollout.datamodule import RolloutDataModule

    monkeypatch.setenv("GSPO_BENCH_CACHE", str(tmp_path))
    task = load_task("arith", 0, ModelConfig(name=chat_model_dir), options=TaskOptions(chat=True))
    rendered = set(task.train["prompt"]) | set(task.eval["prompt"])
    seen: dict[str, list[str]] = {"sft": [], "ws_generate": [], "rollout": [], "eval": []}

    def spy(name, fn, prompts_at):
        def wrapped(*args, **kwargs):
            seen[name].extend(args[prompts_at])
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(ws_mod, "sft_batch", spy("sft", ws_mod.sft_batch, 1))
    monkeypatch.setattr(ws_mod, "generate", spy("ws_generate", ws_mod.generate, 3))
    ws = ws_mod.warm_start(task, ModelConfig(name=chat_model_dir), WarmStartConfig(
        target_pass1=1.0, max_steps=2, eval_every=1, eval_prompts=4, batch_size=4), 0, 4, progress=False,
        log=lambda *a: None)
    model, tok = ws_mod.load_base(ModelConfig(name=str(ws.path)), 0)
    assert tok.chat_template == TEMPLATE  # the warm start's checkpoint keeps the template for the run
    dm = RolloutDataModule(task, tok, RolloutConfig(prompts_per_step=2, group_size=2, max_new_tokens=4, dynamic_sampling=False,
                                         overlong_buffer=None, advantage_scale="group"),
                           steps=1, seed=0, policy=model, eval_prompts=3)
    monkeypatch.setattr(dm.producer.handle, "generate", spy("rollout", dm.producer.handle.generate, 1))
    batch = dm.rollout(0)
    seen["eval"] = [p for rows in dm.evaluator.batches() for p in rows["prompt"]]
    for name, prompts in seen.items():
        assert prompts and set(prompts) <= rendered, name
        assert all(p.startswith("<|user|>\n") and p.endswith("\n<|assistant|>\n") for p in prompts), name
    # the engine tokenized exactly that text: the prompt part of the batch decodes back to it
    first = tok.decode(batch.input_ids[0, :batch.prompt_len], skip_special_tokens=True)
    assert first == seen["rollout"][0]


def test_cache_key_follows_the_rendering_not_the_chat_field(chat_model_dir):
    from gspo_bench.train.warmstart import cache_key

    ws, model = WarmStartConfig(), ModelConfig(name=chat_model_dir)
    raw = load_task("arith", 0)
    raw_auto = load_task("arith", 0, options=TaskOptions(chat="auto"))  # no model: nothing rendered
    assert cache_key(raw, model, ws, 0) == cache_key(raw_auto, model, ws, 0)
    chat = load_task("arith", 0, model, options=TaskOptions(chat="auto"))
    assert cache_key(chat, model, ws, 0) != cache_key(raw, model, ws, 0)


@pytest.mark.parametrize("value, needle", [("true", "has no chat template"), ("maybe", "task.chat='maybe'")])
def test_bad_chat_is_one_line_exit_2_before_any_run(value, needle, tmp_path, capsys):
    db = tmp_path / "mlflow.db"
    code = main(["run", "--preset", "smoke", "--algos", "grpo", "--no-progress", "--tracking-uri", f"sqlite:///{db}",
                 "--set", f"task.chat={value}"])
    text = one_line(capsys)
    assert code == 2 and needle in text and not db.exists()
