"""The tool-calling agent of OpenEnv's MCP envs (`agent_type: openenvToolsAgent`, env `openenv`).

The env offers its own tools in the first prompt and runs the call a reply holds (grl/envs/openenv/mcp.py).
A reply's answer is one call, never split (a call's JSON may hold any separator); a reply without answer
tags that holds a Hermes `<tool_call>` block, as models trained on tool calling write them, is acted on
whole (and counted as a format error, so `format_penalty: 0` suits such models).
"""

from __future__ import annotations

from grl.agents.parse import split_actions
from grl.agents.tasks import TaskHooks


class ToolCallHooks(TaskHooks):
    def actions(self, answer: str | None, separator: str | None) -> list[str]:
        return split_actions(answer, None)

    def fallback_answer(self, reply: str) -> str | None:
        return reply if isinstance(reply, str) and "<tool_call>" in reply else None

    def budget_text(self, actions_left: int, per_turn: int, brief: bool = False) -> str:
        return f"Tool calls left: {actions_left}."
