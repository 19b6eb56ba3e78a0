"""Reply parsing: `<think>...</think><answer>...</answer>` to a list of actions.

Parsing is total: every function here returns a value for any string and
never raises, because a model can write anything.

The exact rules (tags are matched case-insensitively and may hold spaces,
e.g. `< Answer >` or `</ answer>`):

1. The think part is the text up to the first `</think>` (from the first
   `<think>` before it, or from the start of the reply when the opening tag is
   missing, as when a chat template pre-fills `<think>`). With no `</think>`
   but a `<think>`, the think part runs from `<think>` to the next `<answer>`.
2. The answer is the text after the first `<answer>` that follows the think
   part, up to the next `</answer>`; a missing closing tag runs the answer to
   the end of the reply (a truncated trailing `</ans...` is cut off). Text
   before the think/answer and after `</answer>` is ignored.
3. The answer is stripped; an empty answer counts as no answer.
4. With `enable_think` true, a reply without a think part is a format error
   and its answer is not used. With `enable_think` false, a think part is
   allowed but not needed.
5. Actions are the answer split on the separator (none: the whole answer is
   one action), each stripped; empty pieces (`Up || || Down`, a trailing
   `||`) are skipped. Action text is otherwise passed to the env unchanged:
   case and synonyms are the env's business.
6. Tool calls (`parse_tool_calls`, for tasks with `agent_config.tools`): `<python>code</python>`
   anywhere in the reply (tags as tolerant as above; an unclosed tag runs to the end of the reply),
   and the Hermes/Qwen chat templates' own format,
   `<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>`, whose JSON must parse
   and name a tool with a string `code` argument (otherwise it is reported as a malformed call).
   Calls are returned in the order they appear.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_OPEN_THINK = re.compile(r"<\s*think\s*>", re.IGNORECASE)
_CLOSE_THINK = re.compile(r"<\s*/\s*think\s*>", re.IGNORECASE)
_OPEN_ANSWER = re.compile(r"<\s*answer\s*>", re.IGNORECASE)
_CLOSE_ANSWER = re.compile(r"<\s*/\s*answer\s*>", re.IGNORECASE)
# A closing tag cut off by the token limit: `...Up</ans`.
_CUT_CLOSE = re.compile(r"<\s*/\s*[a-z]*\s*$", re.IGNORECASE)
_PYTHON_CALL = re.compile(r"<\s*python\s*>(.*?)(?:<\s*/\s*python\s*>|$)", re.IGNORECASE | re.DOTALL)
_HERMES_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ParsedReply:
    think: str | None  # None: the reply has no think part
    answer: str | None  # None: no usable answer
    format_ok: bool
    error: str  # why the format is not ok; "" when it is


def _think_part(text: str) -> tuple[str | None, int]:
    """The think text and the offset where the answer search starts."""
    close = _CLOSE_THINK.search(text)
    if close:
        opening = _OPEN_THINK.search(text, 0, close.start())
        start = opening.end() if opening else 0
        return text[start : close.start()], close.end()
    opening = _OPEN_THINK.search(text)
    if opening:
        answer = _OPEN_ANSWER.search(text, opening.end())
        end = answer.start() if answer else len(text)
        return text[opening.end() : end], opening.end()
    return None, 0


def _answer_part(text: str, start: int) -> str | None:
    opening = _OPEN_ANSWER.search(text, start)
    if not opening:
        return None
    close = _CLOSE_ANSWER.search(text, opening.end())
    if close:
        answer = text[opening.end() : close.start()]
    else:
        answer = _CUT_CLOSE.sub("", text[opening.end() :])
    answer = answer.strip()
    return answer or None


def parse_reply(text: str, enable_think: bool) -> ParsedReply:
    """Split a reply into think and answer, by the rules in the module docstring."""
    if not isinstance(text, str):
        text = ""
    think, start = _think_part(text)
    answer = _answer_part(text, start)
    if think is not None:
        think = think.strip()
    if enable_think and think is None:
        error = "no <think>...</think> before the answer"
        return ParsedReply(None, None, False, error)
    if answer is None:
        return ParsedReply(think, None, False, "no <answer>...</answer> with content")
    return ParsedReply(think, answer, True, "")


def split_actions(answer: str | None, separator: str | None) -> list[str]:
    """The actions of an answer, in order, without empty pieces."""
    if not isinstance(answer, str):
        return []
    pieces = answer.split(separator) if separator else [answer]
    return [piece.strip() for piece in pieces if piece.strip()]


@dataclass(frozen=True)
class ToolCall:
    tool: str  # a tool name, or "" for a call that could not be read
    code: str
    error: str = ""  # why the call is malformed; "" when it is not


def _hermes_call(body: str) -> ToolCall:
    try:
        call = json.loads(body)
    except ValueError:
        return ToolCall("", "", "the <tool_call> body is not JSON")
    arguments = call.get("arguments") if isinstance(call, dict) else None
    if isinstance(arguments, str):  # some templates write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = None
    name = call.get("name") if isinstance(call, dict) else None
    code = arguments.get("code") if isinstance(arguments, dict) else None
    if not isinstance(name, str) or not isinstance(code, str):
        return ToolCall("", "", 'a <tool_call> needs {"name": ..., "arguments": {"code": "..."}}')
    return ToolCall(name, code)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The tool calls of a reply, in order, by rule 6 of the module docstring."""
    if not isinstance(text, str):
        return []
    found = [
        (m.start(), ToolCall("python", _CUT_CLOSE.sub("", m.group(1)).strip("\n")))
        for m in _PYTHON_CALL.finditer(text)
    ]
    found += [(m.start(), _hermes_call(m.group(1).strip())) for m in _HERMES_CALL.finditer(text)]
    return [call for _, call in sorted(found, key=lambda pair: pair[0])]
