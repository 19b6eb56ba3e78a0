"""OpenEnv's MCP environments (an `MCPEnvironment` served by `openenv.core.create_app`) seen as text.

OpenEnv's current envs act through tools: `step(ListToolsAction())` lists them and `step(CallToolAction(
tool_name, arguments))` runs one, over the same WebSocket session as reset (OpenEnv's `MCPToolClient`, whose
payloads are sent here). For the `openenv` env (grl/envs/openenv/env.py, `interface: mcp`, or `auto` when
the env's action schema is OpenEnv's `CallToolAction`):
- the tools offered to the model are the env's own, listed once per session and written into the first
  prompt as the Hermes/Qwen chat templates write them (`<tools>` with each tool's JSON schema);
- a reply's tool call is decoded exactly as GRL's gateway decodes one (`grl.toolcalls.split_tool_calls`:
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`); a reply that is the call's bare JSON is read
  the same way, since an answer tag may hold it;
- the call runs in the env, and its result (the text the tool returned) is the observation; a call that
  names no listed tool, or that the env reports as failed, is an invalid action.
"""

from __future__ import annotations

import json
from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.mcp_client import MCPToolClient

from grl.envs.checks import describe
from grl.toolcalls import split_tool_calls

CALL_FORMAT = '<tool_call>{"name": "<tool>", "arguments": {<arguments>}}</tool_call>'


class MCPClient(MCPToolClient):
    """OpenEnv's MCP client with the raw observation kept: an env's own fields (its text, its reward
    detail) would be lost to the typed tool observations."""

    def _parse_result(self, payload: Any) -> StepResult:
        if not isinstance(payload, dict) or not isinstance(payload.get("observation"), dict):
            raise ValueError(f"malformed response (no observation object): {describe(payload)}")
        return StepResult(
            observation=payload["observation"], reward=payload.get("reward"), done=payload.get("done", False)
        )


def read_tools(observation: dict[str, Any]) -> list[dict[str, Any]]:
    """The tools of a list_tools observation, as OpenAI function specs; ValueError when malformed."""
    tools = observation.get("tools")
    if not isinstance(tools, list) or not all(
        isinstance(tool, dict) and isinstance(tool.get("name"), str) for tool in tools
    ):
        raise ValueError(f"malformed response: tools {describe(tools)}")
    return [
        {
            "type": "function",
            "function": {
                "name": tool["name"],
                "description": tool.get("description") or "",
                "parameters": tool.get("input_schema") or tool.get("inputSchema") or {"type": "object"},
            },
        }
        for tool in tools
    ]


def tools_prompt(tools: list[dict[str, Any]]) -> str:
    """The tools offered to the model, as the Hermes/Qwen templates list them."""
    listed = "\n".join(json.dumps(tool, sort_keys=True) for tool in tools)
    return (
        "Act by calling one of these tools, one call a reply, written as "
        f"{CALL_FORMAT}:\n<tools>\n{listed}\n</tools>"
    )


def decode_call(text: str) -> tuple[str, dict[str, Any]] | str:
    """(tool name, arguments) of a reply's first tool call, or why there is none."""
    _, calls = split_tool_calls(text)
    if not calls and "<tool_call>" not in text:  # the call's JSON alone, as an answer tag holds it
        _, calls = split_tool_calls(f"<tool_call>{text}</tool_call>")
    if not calls:
        return f"no tool call; write {CALL_FORMAT}"
    function = calls[0]["function"]
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return f"the arguments of {function['name']!r} are not JSON"
    if not isinstance(arguments, dict):
        return f"the arguments of {function['name']!r} are not a JSON object"
    return function["name"], arguments


def result_text(observation: dict[str, Any]) -> tuple[str, str]:
    """The text a tool call's observation shows the model, and the failure it reports ("" for none)."""
    error = observation.get("error")
    if isinstance(error, dict):
        return f"[tool error: {error.get('message', '')}]", str(error.get("message") or "tool error")
    result = observation.get("result")
    if isinstance(result, dict):
        content = result.get("content")
        texts = (
            [part.get("text") for part in content if isinstance(part, dict)]
            if isinstance(content, list)
            else []
        )
        text = "\n".join(t for t in texts if isinstance(t, str))
        failed = bool(result.get("is_error") or result.get("isError"))
        if not text:
            text = json.dumps(result.get("data", result), sort_keys=True, default=str)
        return text, (text if failed else "")
    return (result if isinstance(result, str) else json.dumps(result, sort_keys=True, default=str)), ""
