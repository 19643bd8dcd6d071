"""Tool calls in a model's own words: how a call is written, read back, and answered.

A tool environment (``calc``, ``guess``) has one tool with one text argument (``Tool``). A model calls it by
writing the call and ending its turn with the format's ``close`` marker; whoever drives the episode
(``rollout/episodes.py``) cuts the turn at that marker, hands its text to the environment's ``step``, and
appends the environment's answer, as token ids, before the model's next turn. Two formats:

- ``compact``, for the built-in models' character vocabulary: ``[12*34]`` is a call of the environment's tool
  on ``12*34``, and its result comes back as ``=408`` and a newline. No tool name: each environment has one.
- ``chat``, for a checkpoint whose chat template renders tool calls (Qwen3, Hermes-style templates):
  ``<tool_call>{"name": "calc", "arguments": {"expression": "12*34"}}</tool_call>``, and the result as the
  template renders a ``tool`` message after it, up to the opening of the assistant's next turn. The tool's
  schema reaches the prompt through ``apply_chat_template(tools=...)`` (``prompts.render_chat``).

A malformed call (no opening marker, JSON that does not parse, another tool's name) is the environment's to
answer with an error observation (``error``); it never raises. ``check_tool_format`` says, before any work,
whether a tokenizer can write a format's calls at all (a vocabulary that cannot spell the markers, a template
without tool calls): a one-line ValueError.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gspo_bench.config.names import TOOL_FORMATS



@dataclass(frozen=True)
class Tool:
    """An environment's one tool: its name, its one text argument, and a line on what it does."""

    name: str
    arg: str
    description: str

    def schema(self) -> dict:
        """The tool as a chat template's ``tools=`` takes it (the JSON-schema form of function calling)."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": {self.arg: {"type": "string"}}, "required": [self.arg]}}}


@dataclass(frozen=True)
class Call:
    """A tool call read from a model's turn: its argument, or why it could not be read (``error``)."""

    arg: str | None
    error: str | None = None


class CompactTools:
    """``[argument]`` calls and ``=result`` answers, in any vocabulary that has the characters."""

    name = "compact"
    open, close = "[", "]"

    def call(self, tool: Tool, arg: str) -> str:
        """The text of a call of ``tool`` on ``arg``."""
        return f"{self.open}{arg}{self.close}"

    def parse(self, tool: Tool, text: str) -> Call | None:
        """The call a turn ending in ``close`` makes (None: the turn makes none, it is an answer)."""
        body = text.rstrip()
        if not body.endswith(self.close):
            return None
        start = body.rfind(self.open, 0, len(body) - len(self.close))
        if start < 0:
            return Call(None, f"no '{self.open}' opens the call")
        return Call(body[start + len(self.open):len(body) - len(self.close)].strip())

    def result(self, text: str) -> str:
        """What the environment appends after a call: its result."""
        return f"={text}\n"

    def error(self, why: str) -> str:
        """What the environment appends after a call it could not run."""
        return "=error\n"


class ChatTools:
    """Calls and answers as the tokenizer's chat template writes them (``<tool_call>`` JSON, a ``tool`` turn)."""

    name = "chat"
    open, close = "<tool_call>", "</tool_call>"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.suffix = tool_response_suffix(tokenizer)  # (before, after) the result in the template's tool turn

    def call(self, tool: Tool, arg: str) -> str:
        return f"{self.open}\n" + json.dumps({"name": tool.name, "arguments": {tool.arg: arg}}) + f"\n{self.close}"

    def parse(self, tool: Tool, text: str) -> Call | None:
        body = text.rstrip()
        if not body.endswith(self.close):
            return None
        start = body.rfind(self.open)
        if start < 0:
            return Call(None, f"no {self.open} opens the call")
        try:
            data = json.loads(body[start + len(self.open):len(body) - len(self.close)])
        except ValueError as e:
            return Call(None, f"the call is not JSON: {e}")
        if not isinstance(data, dict) or data.get("name") != tool.name:
            return Call(None, f"no tool named {data.get('name') if isinstance(data, dict) else data!r}")
        args = data.get("arguments")
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except ValueError:
                return Call(None, "the arguments are not JSON")
        if not isinstance(args, dict) or not isinstance(args.get(tool.arg), (str, int, float)):
            return Call(None, f"the call has no {tool.arg!r} argument")
        return Call(str(args[tool.arg]))

    def result(self, text: str) -> str:
        return self.suffix[0] + text + self.suffix[1]

    def error(self, why: str) -> str:
        return self.result(f"error: {why}")


ToolFormat = CompactTools | ChatTools

_PROBE = "\x00RESULT\x00"  # stands for the tool's result while the template's tool turn is rendered


def tool_response_suffix(tokenizer) -> tuple[str, str]:
    """What the chat template writes between the end of a model's tool call and the result, and after the
    result up to the opening of the model's next turn: the template renders a conversation with a tool call
    and a ``tool`` message, and the text after the call's closing marker is cut around the result. A template
    that renders no tool call is a ValueError."""
    call = {"type": "function", "function": {"name": "probe", "arguments": {"x": "1"}}}
    messages = [{"role": "user", "content": "u"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": _PROBE}]
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as e:  # a template without a tool role raises its own error
        raise ValueError(f"the chat template cannot render a tool turn: {type(e).__name__}: "
                         f"{(str(e).strip().splitlines() or [''])[0]}") from None
    end = text.find(ChatTools.close)
    if end < 0 or _PROBE not in text[end:]:
        raise ValueError(f"the chat template renders no {ChatTools.close} call before a tool turn")
    before, after = text[end + len(ChatTools.close):].split(_PROBE, 1)
    return before, after


def template_has_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders tool calls in ``<tool_call>`` form."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    try:
        tool_response_suffix(tokenizer)
    except ValueError:
        return False
    return True


def tool_format(tokenizer, name: str = "auto") -> ToolFormat:
    """The format ``env.tool_format`` names for ``tokenizer`` (auto: chat where the template renders tool calls,
    else compact), checked (``check_tool_format``)."""
    if name not in TOOL_FORMATS:
        raise ValueError(f"env.tool_format={name!r} is not allowed (allowed: {', '.join(TOOL_FORMATS)})")
    if name == "auto":
        name = "chat" if template_has_tools(tokenizer) else "compact"
    fmt = ChatTools(tokenizer) if name == "chat" else CompactTools()
    check_tool_format(tokenizer, fmt)
    return fmt


def check_tool_format(tokenizer, fmt: ToolFormat) -> None:
    """A ValueError unless ``tokenizer`` writes a call and its answer in ``fmt`` token for token: encoded and
    decoded again, a call's text and a result's come back unchanged (a vocabulary without the markers'
    characters maps them to an unknown token, and the call could never be read)."""
    probe = Tool("calc", "expression", "")
    for text in (fmt.call(probe, "12*34"), fmt.result("408")):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if tokenizer.decode(ids) != text:
            raise ValueError(f"the model's tokenizer cannot write a {fmt.name} tool call: {text!r} comes back as "
                             f"{tokenizer.decode(ids)!r} (use a tokenizer that can spell it, or env.tool_format="
                             f"{'compact' if fmt.name == 'chat' else 'chat'})")


class ToolEnvironment:
    """The shared part of an environment with one tool (``calc``, ``guess``): built with the run's tool format and
    turn cap, an episode per ``reset``, and ``take_turn``, which counts a model's turn and reads the call it makes.
    A subclass sets ``tool`` and ``default_turns`` and writes ``step`` and ``solver``."""

    tool: Tool
    default_turns = 4
    """The turn cap when none is given (``env.max_turns`` gives it in a run)."""

    def __init__(self, task, *, tools: ToolFormat, max_turns: int | None = None):
        self.task, self.tools = task, tools
        self.max_turns = self.default_turns if max_turns is None else max_turns
        self.row: dict | None = None  # the episode's row, None between episodes
        self.turns = 0

    def reset(self, row: dict) -> str:
        self.row, self.turns = row, 0
        return row["prompt"]

    def take_turn(self, action) -> Call | None:
        """Count one model turn and read its call (None: it makes none, it is an answer)."""
        name = type(self).__name__.lower()
        if self.row is None:
            raise RuntimeError(f"{name}: step() before reset(), or after the episode ended")
        if not isinstance(action, str):
            raise TypeError(f"{name} reads text: decode the turn's token ids before step()")
        self.turns += 1
        return self.tools.parse(self.tool, action)
