"""A sampled reply as an OpenAI assistant message: its reasoning, its text and its tool calls, per model
family.

Families and how each writes a tool call (`FAMILIES`):
- `hermes` (Qwen2.5, Qwen3, Hermes, GRL's own agents): `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`;
- `llama3_json` (Llama 3.1 / 3.2 / 3.3): `{"name": ..., "parameters": {...}}`, after `<|python_tag|>` or
alone,
  several separated by `;`;
- `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`;
- `qwen3_coder` (Qwen3-Coder, Qwen3.5):
`<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>`.
Every family accepts `"parameters"` for `"arguments"` and several calls in one reply. A block that does not
parse stays in the text. `family_of(template)` picks the family from the chat template's own markers.

Reasoning: text before `</think>` (after an optional `<think>`) is `reasoning_content` when the template
knows `<think>` (Qwen3, DeepSeek-R1 distills); a reply cut inside its thinking is all reasoning.
"""

from __future__ import annotations

import json
import re
import uuid

FAMILIES = ("hermes", "llama3_json", "mistral", "qwen3_coder")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_CODER_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.DOTALL)
_CODER_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL_TAG = "[TOOL_CALLS]"


def family_of(template: str | None) -> str:
    """The tool-call family a chat template writes (hermes when it shows none of the others' markers)."""
    template = template or ""
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    if _MISTRAL_TAG in template:
        return "mistral"
    if _PYTHON_TAG in template or ("<|start_header_id|>" in template and "parameters" in template):
        return "llama3_json"
    return "hermes"


def thinks(template: str | None) -> bool:
    return THINK_CLOSE in (template or "")


def _call(name: str, arguments) -> dict:
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _json_call(body) -> dict | None:
    """An OpenAI tool call from a decoded {"name", "arguments" | "parameters"} object, or None."""
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        return None
    arguments = body.get("arguments", body.get("parameters", {}))
    return _call(body["name"], arguments if arguments is not None else {})


def _blocks(text: str, pattern: re.Pattern, parse) -> tuple[str, list[dict]]:
    calls, kept, at = [], [], 0
    for match in pattern.finditer(text):
        call = parse(match)
        if call is None:
            continue
        calls.extend(call if isinstance(call, list) else [call])
        kept.append(text[at : match.start()])
        at = match.end()
    kept.append(text[at:])
    return "".join(kept), calls


def _hermes_block(match: re.Match) -> dict | None:
    try:
        return _json_call(json.loads(match.group(1).strip()))
    except ValueError:
        return None


def _coder_block(match: re.Match) -> list[dict] | None:
    functions = list(_CODER_FUNCTION.finditer(match.group(1)))
    if not functions:
        return None
    calls = []
    for function in functions:
        arguments = {}
        for parameter in _CODER_PARAMETER.finditer(function.group(2)):
            value = parameter.group(2).strip("\n")
            try:  # the template writes non-strings as JSON, strings bare
                arguments[parameter.group(1)] = json.loads(value)
            except ValueError:
                arguments[parameter.group(1)] = value
        calls.append(_call(function.group(1), arguments))
    return calls


def _json_values(text: str) -> list | None:
    """`text` as one or more JSON values, separated by whitespace or `;` (None if it is anything else)."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and text[at] in " \t\r\n;":
            at += 1
        if at == len(text):
            return values
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return None
        values.append(value)


def _llama(text: str) -> tuple[str, list[dict]]:
    head, tag, body = text.partition(_PYTHON_TAG)
    values = _json_values(body if tag else text)
    calls = [_json_call(v) for v in (values or [])]
    if not calls or None in calls:
        return text, []
    return (head if tag else ""), calls


def _mistral(text: str) -> tuple[str, list[dict]]:
    head, tag, body = text.partition(_MISTRAL_TAG)
    values = _json_values(body) if tag else None
    if not values:
        return text, []
    flat = [item for value in values for item in (value if isinstance(value, list) else [value])]
    calls = [_json_call(v) for v in flat]
    return (text, []) if not calls or None in calls else (head, calls)


def split_tool_calls(text: str, family: str = "hermes") -> tuple[str | None, list[dict]]:
    """A reply's text without its tool calls (None when nothing else is left), and the calls."""
    if family == "hermes":
        rest, calls = _blocks(text, _HERMES, _hermes_block)
    elif family == "qwen3_coder":
        rest, calls = _blocks(text, _HERMES, _coder_block)
    elif family == "llama3_json":
        rest, calls = _llama(text)
    elif family == "mistral":
        rest, calls = _mistral(text)
    else:
        raise ValueError(f"tool_parser: {family!r} is not one of {', '.join(FAMILIES)}")
    if not calls:
        return text, []
    return (rest.strip() or None), calls


def call_frames(family: str, names: list[str]) -> list[tuple[str, str | None, str]]:
    """How a reply that is one call to each of `names` is written in `family`, as grammar frames
    (grl/engines/constraint.py `compile_call_grammar`): (head, None, tail) around the JSON arguments, or for
    qwen3_coder (head, "</function>", tail) around free parameter text."""
    frames = []
    for name in dict.fromkeys(names):
        quoted = json.dumps(name, ensure_ascii=False)
        if family == "hermes":
            frames.append((f'<tool_call>\n{{"name": {quoted}, "arguments": ', None, "}\n</tool_call>"))
        elif family == "llama3_json":
            frames.append((f'{{"name": {quoted}, "parameters": ', None, "}"))
        elif family == "mistral":
            frames.append((f'{_MISTRAL_TAG}[{{"name": {quoted}, "arguments": ', None, "}]"))
        elif family == "qwen3_coder":
            frames.append((f"<tool_call>\n<function={name}>\n", "</function>", "\n</tool_call>"))
        else:
            raise ValueError(f"tool_parser: {family!r} is not one of {', '.join(FAMILIES)}")
    return frames


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, the rest) of a reply; a reply cut before `</think>` is all reasoning."""
    body = text.lstrip()
    opened = body.startswith(THINK_OPEN)
    if opened:
        body = body[len(THINK_OPEN) :]
    if THINK_CLOSE not in body:
        return (body.strip(), "") if opened else (None, text)
    reasoning, _, rest = body.partition(THINK_CLOSE)
    return reasoning.strip(), rest.lstrip()


def without_reasoning(content: str | None) -> str:
    """A message's content with a leading think block removed: how a program that strips earlier
    reasoning (as Qwen3's model card advises) and one that keeps it are compared."""
    return (
        split_reasoning(content or "")[1].strip()
        if THINK_CLOSE in (content or "")
        else (content or "").strip()
    )


def with_parsed_arguments(message: dict) -> dict:
    """`message` with its tool calls' JSON-string arguments as the objects they encode (what templates
    expect)."""
    if not message.get("tool_calls"):
        return message
    calls = []
    for call in message["tool_calls"]:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            try:
                call = {**call, "function": {**function, "arguments": json.loads(function["arguments"])}}
            except ValueError:
                pass  # not JSON: the template gets the string as sent
        calls.append(call)
    return {**message, "tool_calls": calls}
