"""What one agent turn gives the rollout (`AgentStep`, its `TurnInfo`), and the windowed chat a task with
`agent_config.max_context_window` prompts with (`context_window`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict


class TurnInfo(TypedDict, total=False):
    """What `Agent.step` reports of a turn; every key is present except `tool_output`."""

    turn: int  # turns played so far, this one included
    actions: list[str]  # the actions the env ran
    actions_dropped: int  # actions past the per-turn or episode budget, not run
    invalid_actions: list[str]  # run, but the env called them invalid
    format_ok: bool
    format_error: str
    penalised: bool  # the turn earned format_penalty
    success: bool
    env_done: bool
    env_error: str | None  # the env raised or broke the contract: the episode ended
    env_error_kind: str | None  # exception | a kind of grl/envs/checks.py
    env_traceback: str | None
    think: str | None
    answer: str | None
    tool_output: str  # only on a tool turn: what the tool printed


def context_window(messages: list[dict[str, str]], instructions: str, window: int) -> list[dict[str, str]]:
    """`messages` (system, user, assistant, user, ...) keeping the last `window` replies and what
    follows them; the instructions then open the first kept message (or a message of their own
    before tool output), so that the model always reads the task. `window` -1 keeps everything."""
    replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if window < 0 or len(replies) <= window:
        return [dict(m) for m in messages]
    kept = [dict(m) for m in messages[replies[len(replies) - window - 1] + 1 :]]
    if kept[0]["role"] == "user":
        kept[0]["content"] = f"{instructions}\n\n{kept[0]['content']}" if instructions else kept[0]["content"]
    else:
        kept.insert(0, {"role": "user", "content": instructions})
    return [dict(messages[0]), *kept]


@dataclass
class AgentStep:
    reward: float
    done: bool
    info: TurnInfo = field(default_factory=TurnInfo)
