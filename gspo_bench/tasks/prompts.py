"""Prompt text for the model: a task's prompts as raw text or through the tokenizer's chat template.

This is the one place a task prompt becomes the text a model sees. ``load_task`` renders both splits here
once, when it is given the model, and everything downstream reads the rendered ``prompt`` column: the warm
start's supervised batches, the RL rollouts, the held-out evaluation and the vLLM engine, so they all see
the same string, tokenized the same way (``add_special_tokens=False``: a template writes its own special
tokens into the text).

``chat`` is the task spec's ``chat`` unless ``--set task.chat=...`` overrides it:

- ``false``: the prompt as it is (the built-in formula tasks, ``37+58=``, are text to continue); a task
  ``system`` message with it could never be seen, so ``TaskSpec`` refuses the pair;
- ``true``: through the chat template, which the tokenizer must have (else a ``ValueError``);
- ``auto``: through the chat template when the tokenizer has one (``tokenizer.chat_template`` is set), raw
  otherwise. The built-in character tokenizer has none, so ``auto`` is raw for the built-in models.

Rendering is ``apply_chat_template([system?, user], add_generation_prompt=True, tokenize=False)``: an
optional system message, the prompt as the user's message, and the template's opening of the assistant's
turn, so the completion (and the warm start's target) follows it directly. A task played in an environment
with a tool (``calc``, ``guess``) passes the tool's schema too (``tools=``, ``TOOL_SCHEMAS``), so a template
that lists tools shows the model what it may call.
"""

from __future__ import annotations

import hashlib
import json


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def uses_chat(chat, tokenizer) -> bool:
    """Whether prompts go through the chat template (the rules in the module docstring)."""
    if not (isinstance(chat, bool) or chat == "auto"):  # 1 == True, so not `in CHAT_MODES`
        raise ValueError(f"chat={chat!r} is not allowed (allowed: auto, true, false)")
    if chat is True and not has_chat_template(tokenizer):
        raise ValueError("chat: true, but the model's tokenizer has no chat template (tokenizer.chat_template "
                         "is unset); use chat: auto or false, or a model whose tokenizer carries one")
    return chat is True or (chat == "auto" and has_chat_template(tokenizer))


TOOL_SCHEMAS: dict[str, list[dict]] = {}
"""The tools of each environment that has some, by environment name, as a chat template's ``tools=`` takes them
(filled when a tool environment registers, ``environments.register_environment``)."""


def render_chat(tokenizer, prompt: str, system: str | None = None, tools: list[dict] | None = None) -> str:
    """One prompt through the chat template, ending with the opening of the assistant's turn; ``tools``: the
    schemas the template lists for the model (an environment's tool)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    extra = {} if tools is None else {"tools": tools}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)


def render_prompts(prompts: list[str], tokenizer, chat, system: str | None = None,
                   tools: list[dict] | None = None) -> list[str]:
    """The prompts as the model sees them: raw, or each through ``render_chat`` (with ``tools``)."""
    if not uses_chat(chat, tokenizer):
        return list(prompts)
    try:
        return [render_chat(tokenizer, p, system, tools) for p in prompts]
    except Exception as e:  # a template that refuses the messages (e.g. no system role) raises its own error
        first = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"the chat template cannot render a prompt: {type(e).__name__}: {first}") from None


def rendering_key(tokenizer, chat, system: str | None = None, tools: list[dict] | None = None) -> str | None:
    """What names the rendering for caches: None for raw prompts, else a digest of the template, the system
    message and the tools (so a warm start is cached per prompt format, and raw prompts keep the old keys)."""
    if not uses_chat(chat, tokenizer):
        return None
    text = f"{tokenizer.chat_template}\0{system or ''}" + ("" if tools is None else f"\0{json.dumps(tools)}")
    return hashlib.sha256(text.encode()).hexdigest()[:16]
