"""A chat-completions request body, checked: every field the gateway reads is honoured or refused with one
line
(`BadRequest`), none is ignored silently. Fields it does not know (`user`, `metadata`, ...) change nothing
about sampling and are let through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
MAX_N = 16
_KEPT = ("tool_calls", "tool_call_id", "name", "reasoning_content")


class BadRequest(ValueError):
    """A request the gateway refuses, with the one line it answers."""


@dataclass
class ChatRequest:
    messages: list[dict]
    tools: list | None
    tool_choice: Any  # None, "auto", "none", "required" or {"type": "function", "function": {"name": ...}}
    n: int
    max_tokens: int
    stop: list[str]
    temperature: float
    top_p: float
    seed: int | None
    logprobs: bool
    parallel_tool_calls: bool
    stream: bool
    stream_usage: bool
    allowed_replies: Any

    @property
    def renders_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


def messages_of(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: a non-empty list of {role, content} is required")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise BadRequest(f"messages[{i}]: role must be one of {', '.join(ROLES)}")
        content = message.get("content")
        if isinstance(content, list):  # content parts: the text ones, in order
            texts = [
                part.get("text", "")
                for part in content
                if isinstance(part, dict) and part.get("type") == "text"
            ]
            content = (
                "".join(texts) if all(isinstance(text, str) for text in texts) else 0
            )  # not text: refused below
        if content is not None and not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content: a string, a list of text parts or null")
        kept = {"role": message["role"], "content": content}
        for extra in _KEPT:
            if message.get(extra) is not None:
                kept[extra] = message[extra]
        out.append(kept)
    return out


def number(body: dict, key: str, default, low, high, kind=float):
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low <= value <= high):
        raise BadRequest(f"{key}: a number in [{low}, {high}], got {value!r}")
    return kind(value)


def _tool_choice(choice, tools: list | None):
    if choice in (None, "auto", "none"):
        return choice
    if not tools:
        raise BadRequest(f"tool_choice: {choice!r} needs a non-empty tools list")
    if choice == "required":
        return choice
    function = (
        choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    )
    named = function.get("name") if isinstance(function, dict) else None
    if not isinstance(named, str):
        raise BadRequest(
            (
                'tool_choice: "auto", "none", "required" or '
                f'{{"type": "function", "function": {{"name": ...}}}}; got {choice!r}'
            )[:200]
        )
    names = [t["function"].get("name") for t in tools if isinstance(t.get("function"), dict)]
    if named not in names:
        raise BadRequest(
            f"tool_choice: function {named!r} is not among the tools ({', '.join(map(str, names))})"
        )
    return choice


def chat_request(body: Any, default_max_tokens: int, context: int) -> ChatRequest:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    tools = body.get("tools") or None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise BadRequest("tools: a list of tool definitions")
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise BadRequest(
            "response_format: only {'type': 'text'} is supported (no JSON mode or JSON schema decoding)"
        )
    if number(body, "top_logprobs", 0, 0, 20, int):
        raise BadRequest("top_logprobs: not supported (logprobs=true returns the sampled tokens' log-probs)")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("stop: a non-empty string or a list of them")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options: an object such as {'include_usage': true}")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    temperature = number(body, "temperature", 1.0, 0.0, 100.0)
    return ChatRequest(
        messages=messages_of(body.get("messages")),
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice"), tools),
        n=number(body, "n", 1, 1, MAX_N, int),
        max_tokens=number({"max_tokens": limit}, "max_tokens", default_max_tokens, 1, context, int),
        stop=stop,
        temperature=temperature,
        top_p=number(body, "top_p", 1.0, 1e-9, 1.0),
        seed=number(body, "seed", None, 0, 2**63 - 1, int),
        logprobs=bool(body.get("logprobs")),
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        stream=bool(body.get("stream")),
        stream_usage=bool(options.get("include_usage")),
        allowed_replies=body.get("allowed_replies"),
    )
