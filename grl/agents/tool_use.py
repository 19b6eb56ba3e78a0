"""Tool calls inside an episode: budgets, running the tools, the text the model reads back, counts.

A reply that holds tool calls (grl/agents/parse.py rule 6) is a tool turn: its calls run, up to
`max_tool_calls_per_turn` of them and `max_tool_calls` in the episode, and their output comes back
as the next message, role `tool` (the rollout renders it as `user` where the chat template has no
tool role). The env is not stepped. Output longer than `max_tool_output_chars` is cut and the
message says so; a malformed call, an unknown tool, a call over the budget or a failing run comes
back as text, never as an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from grl.agents.parse import ToolCall


class ToolUse:
    """One agent's tools and the counts of its current episode."""

    def __init__(self, tools: Mapping[str, Callable], per_turn: int, per_episode: int, max_chars: int):
        self.tools = dict(tools)
        self.per_turn = per_turn
        self.per_episode = per_episode
        self.max_chars = max_chars
        self.reset()

    def reset(self) -> None:
        self.calls = self.errors = self.timeouts = 0
        self.seconds = 0.0

    def prompt_text(self) -> str:
        names = ", ".join(sorted(self.tools))
        return (
            f"Tools ({names}): write <python>code</python> to run Python code; what it prints comes back in "
            f"the next message. Up to {self.per_turn} call{'s' if self.per_turn > 1 else ''} a reply and "
            f"{self.per_episode} in all; a reply with a tool call is not taken as an answer."
        )

    def spent(self) -> bool:
        return self.calls >= self.per_episode

    def run(self, calls: list[ToolCall]) -> str:
        """Run the calls within the budgets; the message the model reads next."""
        room = min(self.per_turn, self.per_episode - self.calls)
        parts = []
        for index, call in enumerate(calls):
            label = f"[call {index + 1}]\n" if len(calls) > 1 else ""
            if index >= room:
                parts.append(
                    f"{label}[not run: {self.per_turn} call(s) a reply, {self.per_episode} an episode]"
                )
                continue
            self.calls += 1
            if call.error or call.tool not in self.tools:
                self.errors += 1
                why = call.error or f"unknown tool {call.tool!r} (tools: {', '.join(sorted(self.tools))})"
                parts.append(f"{label}[tool call not run: {why}]")
                continue
            outcome = self.tools[call.tool](call.code, self.max_chars)
            self.errors += outcome.error
            self.timeouts += outcome.timed_out
            self.seconds += outcome.seconds
            parts.append(label + outcome.text)
        return "\n".join(parts)

    def metrics(self) -> dict[str, float]:
        return {
            "tool_calls": float(self.calls),
            "tool_errors": float(self.errors),
            "tool_timeouts": float(self.timeouts),
            "tool_time_s": self.seconds,
        }
