"""The Responses API (`POST /v1/responses`) as far as the OpenAI Agents SDK uses it with function tools: a
request
becomes a chat-completions body (`chat_body`), is answered by the same gateway call (so an episode records it
and continues it exactly as a chat call), and the chat reply becomes a response (`response_of`).

Input items: a string (one user message), messages (`user`, `system`, `developer` as system, `assistant`,
text or `input_text` / `output_text` parts), `function_call` (joined to the assistant message before it),
`function_call_output` (a tool message) and `reasoning` (the next assistant message's reasoning). `tools`:
function tools. Refused with one line: other tools and items, `previous_response_id` (the gateway stores no
responses: send the whole input, as the Agents SDK does by default), a `text.format` other than text.
`stream: true` sends the finished response as the API's events (grl/gateway/streaming.py `response_events`).
"""

from __future__ import annotations

import time
import uuid

from grl.gateway.requests import BadRequest

_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_PASSED = ("temperature", "top_p", "seed", "parallel_tool_calls", "allowed_replies")


def _text(content, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content: a string or a list of text parts")
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            raise BadRequest(f"{where}.content: only text parts are supported, got {str(part)[:80]}")
        parts.append(part.get("text", ""))
    return _joined(parts, f"{where}.content")


def _joined(texts: list, where: str) -> str:
    if not all(isinstance(text, str) for text in texts):
        raise BadRequest(f"{where}: each part's text must be a string")
    return "".join(texts)


def _messages(body: dict) -> list[dict]:
    items = body.get("input")
    items = [{"role": "user", "content": items}] if isinstance(items, str) else items
    if not isinstance(items, list) or not items:
        raise BadRequest("input: a string or a non-empty list of input items")
    messages = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    reasoning = None
    for i, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and isinstance(item.get("role"), str) and item["role"] in _ROLES:
            message = {"role": _ROLES[item["role"]], "content": _text(item.get("content"), f"input[{i}]")}
            if message["role"] == "assistant" and reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
            messages.append(message)
        elif kind == "function_call":
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":  # calls of one reply share its assistant message
                last = {"role": "assistant", "content": None}
                if reasoning is not None:
                    last["reasoning_content"], reasoning = reasoning, None
                messages.append(last)
            call = {"name": item.get("name"), "arguments": item.get("arguments", "{}")}
            last.setdefault("tool_calls", []).append(
                {"id": item.get("call_id"), "type": "function", "function": call}
            )
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": _text(output, f"input[{i}].output"),
                }
            )
        elif kind == "reasoning":
            summary = item.get("summary") or []
            if not isinstance(summary, list):
                raise BadRequest(f"input[{i}].summary: a list of summary_text parts")
            reasoning = _joined(
                [s.get("text", "") for s in summary if isinstance(s, dict)], f"input[{i}].summary"
            )
        else:
            raise BadRequest(
                f"input[{i}]: {kind or type(item).__name__} items are not supported (messages and function "
                "calls are)"
            )
    return messages


def _tools(tools) -> list[dict] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools if isinstance(tools, list) else [None]):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise BadRequest(f"tools[{i}]: only function tools are supported")
        function = {
            k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None
        }
        out.append({"type": "function", "function": function})
    return out


def chat_body(body) -> dict:
    """The chat-completions body of a Responses request."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if body.get("previous_response_id"):
        raise BadRequest("previous_response_id: the gateway stores no responses; send the whole input")
    text_format = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if text_format not in (None, {"type": "text"}):
        raise BadRequest("text.format: only {'type': 'text'} is supported")
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    chat = {"messages": _messages(body), "tools": _tools(body.get("tools")), "tool_choice": choice}
    chat["max_tokens"] = body.get("max_output_tokens")
    chat.update({key: body[key] for key in _PASSED if key in body})
    return chat


def response_of(chat: dict, body: dict) -> dict:
    """The Responses-API reply of a chat completion `chat` answered for request `body`."""
    choice = chat["choices"][0]
    message, output = choice["message"], []
    if message.get("reasoning_content"):
        summary = [{"type": "summary_text", "text": message["reasoning_content"]}]
        output.append({"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "summary": summary})
    if message.get("content"):
        text = {"type": "output_text", "text": message["content"], "annotations": []}
        output.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "role": "assistant",
                "status": "completed",
                "content": [text],
            }
        )
    for call in message.get("tool_calls") or []:
        function = call["function"]
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": call["id"],
                "name": function["name"],
                "arguments": function["arguments"],
                "status": "completed",
            }
        )
    cut = choice["finish_reason"] == "length"
    usage = chat["usage"]
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "model": chat["model"],
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "instructions": body.get("instructions"),
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
        "grl": chat["grl"],
    }
