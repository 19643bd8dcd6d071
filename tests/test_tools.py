"""Tool formats (``tasks/environments/tools.py``): the compact form reads back what it writes and answers a
malformed call without raising; the chat form follows the tokenizer's template (a small Hermes-style template
that renders ``<tool_call>``, written here); a tokenizer that cannot spell a call is refused in one line."""

from __future__ import annotations

import json

import pytest

from gspo_bench.models.builtin import _one_char_per_token, char_tokenizer
from gspo_bench.tasks.environments.tools import (ChatTools, CompactTools, Tool, check_tool_format,
                                                 template_has_tools, tool_format, tool_response_suffix)
from gspo_bench.tasks.prompts import render_prompts

TOOL = Tool("calc", "expression", "Evaluate an expression.")

# the shape of Qwen3's and Hermes' tool turns: a call as <tool_call> JSON in the assistant's turn, a result as
# <tool_response> in a user turn, tools listed in the system turn
TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture
def chat_tok():
    tok = char_tokenizer()
    tok.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<|im_start|>",
                    "<|im_end|>"])
    tok.chat_template = TEMPLATE
    return tok


def test_compact_calls_read_back_and_malformed_ones_are_errors_not_exceptions():
    tools = CompactTools()
    assert tools.call(TOOL, "12*34") == "[12*34]"
    assert tools.parse(TOOL, "[12*34]").arg == "12*34"
    assert tools.parse(TOOL, "let me see [12*34]").arg == "12*34"  # text before the call is the model's own
    assert tools.parse(TOOL, "408") is None  # no closing marker: an answer
    bad = tools.parse(TOOL, "12*34]")
    assert bad.arg is None and "'['" in bad.error
    assert tools.result("408") == "=408\n" and tools.error("anything") == "=error\n"


def test_the_chat_format_follows_the_template_around_the_result(chat_tok):
    assert template_has_tools(chat_tok) and not template_has_tools(char_tokenizer())
    before, after = tool_response_suffix(chat_tok)
    assert before == "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
    assert after == "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    tools = tool_format(chat_tok)  # auto: the template renders tool calls
    assert isinstance(tools, ChatTools)
    call = tools.call(TOOL, "12*34")
    assert json.loads(call[len("<tool_call>\n"):-len("\n</tool_call>")]) == {
        "name": "calc", "arguments": {"expression": "12*34"}}
    assert tools.parse(TOOL, call).arg == "12*34"
    assert tools.result("408") == before + "408" + after
    assert tools.parse(TOOL, "<tool_call>{not json}</tool_call>").error.startswith("the call is not JSON")
    assert "no tool named 'rm'" in tools.parse(TOOL, '<tool_call>{"name": "rm", "arguments": {}}</tool_call>').error
    assert "no 'expression'" in tools.parse(TOOL, '<tool_call>{"name": "calc", "arguments": {}}</tool_call>').error
    [prompt] = render_prompts(["12*34+5="], chat_tok, True, tools=[TOOL.schema()])
    assert '"name": "calc"' in prompt and prompt.endswith("<|im_start|>assistant\n")


def test_auto_is_compact_without_a_tool_template_and_chat_needs_one():
    assert isinstance(tool_format(char_tokenizer()), CompactTools)
    with pytest.raises(ValueError, match="no chat template|cannot render a tool turn"):
        ChatTools(char_tokenizer())
    with pytest.raises(ValueError, match="not allowed"):
        tool_format(char_tokenizer(), "xml")


def test_a_vocabulary_that_cannot_spell_a_call_is_refused_in_one_line():
    digits = _one_char_per_token(["<pad>", "<bos>", "<eos>", *"0123456789+*="])
    with pytest.raises(ValueError, match="cannot write a compact tool call") as e:
        check_tool_format(digits, CompactTools())
    assert "\n" not in str(e.value)


def test_a_checkpoint_with_a_tool_template_plays_calc_in_the_chat_form(chat_tok, tmp_path, tracking_uri):
    """A local checkpoint whose tokenizer's chat template renders tool calls: its prompts list the calculator,
    the solver's transcripts are in <tool_call> JSON with the template's tool turns, and a run trains on calc."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from gspo_bench.config import EnvConfig, ModelConfig, TaskOptions, load_config
    from gspo_bench.rollout.episodes import episodes_for
    from gspo_bench.tasks import load_task
    from gspo_bench.train.runner import run
    from gspo_bench.train.warmstart import transcript_batch
    from tests.conftest import tiny_overrides

    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(chat_tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         head_dim=16, max_position_embeddings=1024,
                                         pad_token_id=chat_tok.pad_token_id, bos_token_id=chat_tok.bos_token_id,
                                         eos_token_id=chat_tok.eos_token_id))
    folder = tmp_path / "chat-ckpt"
    model.save_pretrained(folder)
    chat_tok.save_pretrained(folder)
    task = load_task("calc", 0, ModelConfig(name=str(folder)), 64, log=lambda *a: None,
                     options=TaskOptions(chat=True))
    prompt = task.train[0]["prompt"]
    assert '"name": "calc"' in prompt and prompt.endswith("24+99*13=<|im_end|>\n<|im_start|>assistant\n")
    episodes = episodes_for(task, EnvConfig(), chat_tok)
    assert isinstance(episodes.tools, ChatTools)
    batch = transcript_batch(chat_tok, episodes, [{"prompt": "24+99*13=", "answer": "1311"}], "cpu")
    text = chat_tok.decode(batch["input_ids"][0])
    assert '<tool_call>\n{"name": "calc", "arguments": {"expression": "99*13"}}\n</tool_call><|im_end|>' in text
    assert "<tool_response>\n1287\n</tool_response>" in text and text.endswith("1311<eos>")
    trained = chat_tok.decode(batch["input_ids"][0][batch["labels"][0] >= 0])
    assert "tool_response" not in trained and "1287\n" not in trained  # the template's tool turn is not trained
    o = tiny_overrides("calc", tracking_uri, rollout={"max_new_tokens": 64}, train={"steps": 1},
                       tracking={"experiment": "calc-chat"}, task_options={"chat": True})
    o["algos"], o["model"] = ["grpo"], {"name": str(folder)}
    [r] = run(load_config("smoke", overrides=o), log=lambda *a: None)
    assert r.status == "FINISHED", r.error
    assert r.last["env/turns_mean"] >= 1
