"""Agent types: which env each drives, and the few per-task hooks.

The generic Agent covers the grid games as is. A task gets a `TaskHooks`
subclass only where its replies or metrics differ from theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grl.agents.parse import split_actions
from grl.schema.tasks import Task

__all__ = ["AGENT_TYPES", "AgentType", "Task", "TaskHooks"]


class TaskHooks:
    """Default behaviour: actions split on the separator; budget in actions."""

    def actions(self, answer: str | None, separator: str | None) -> list[str]:
        return split_actions(answer, separator)

    def fallback_answer(self, reply: str) -> str | None:
        """What to act on when a reply has no usable answer (it is still penalised)."""
        return None

    def budget_text(self, actions_left: int, per_turn: int, brief: bool = False) -> str:
        left = f"You have {actions_left} action{'s' if actions_left != 1 else ''} left"
        if brief and per_turn == 1:  # the reply format already asks for one action
            return f"{left}."
        return f"{left}; use at most {min(per_turn, actions_left)} in this answer."

    def episode_extras(self, env_infos: list[dict[str, Any]]) -> dict[str, float]:
        """Task metrics beyond the common ones, from the infos of the episode's env steps."""
        return {}


class AnswerHooks(TaskHooks):
    """The whole answer is one attempt (GSM8K, competition math); a reply without tags is judged as a
    whole (its last number, its last \\boxed{}), and still penalised for the format."""

    def actions(self, answer: str | None, separator: str | None) -> list[str]:
        return split_actions(answer, None)

    def fallback_answer(self, reply: str) -> str | None:
        return reply if isinstance(reply, str) and reply.strip() else None

    def budget_text(self, actions_left: int, per_turn: int, brief: bool = False) -> str:
        return f"Attempts left: {actions_left}."


class SQLHooks(TaskHooks):
    """One SQL query per answer: `||` is SQL's concatenation operator, so never split."""

    def actions(self, answer: str | None, separator: str | None) -> list[str]:
        return split_actions(answer, None)

    def budget_text(self, actions_left: int, per_turn: int, brief: bool = False) -> str:
        return f"Queries left: {actions_left}."


class WebShopHooks(TaskHooks):
    """Adds the purchase rate: an episode counts once the env reports a purchase."""

    def episode_extras(self, env_infos: list[dict[str, Any]]) -> dict[str, float]:
        return {"purchased": float(any(info.get("purchased", False) for info in env_infos))}


class TextWorldHooks(TaskHooks):
    """One game command per answer, never split: commands hold no separator but may hold any word."""

    def actions(self, answer: str | None, separator: str | None) -> list[str]:
        return split_actions(answer, None)

    def budget_text(self, actions_left: int, per_turn: int, brief: bool = False) -> str:
        return f"Commands left: {actions_left}."


class GemHooks(AnswerHooks):
    """GEM's games read the move from the last \\boxed{} of whatever they are given: the whole answer is one
    move, and a reply without tags is passed whole, as GEM's own trainers pass the reply."""

    def budget_text(self, actions_left: int, per_turn: int, brief: bool = False) -> str:
        return f"Moves left: {actions_left}."


@dataclass(frozen=True)
class AgentType:
    env: str  # the grl.envs name it drives
    hooks: TaskHooks


AGENT_TYPES: dict[str, AgentType] = {
    "sokobanAgent": AgentType("sokoban", TaskHooks()),
    "tetrisAgent": AgentType("tetris", TaskHooks()),
    "blocksworldAgent": AgentType("blocksworld", TaskHooks()),
    "gsm8kAgent": AgentType("gsm8k", AnswerHooks()),
    # GRL's math agent types: one env, one dataset each (configs/agents.yaml)
    "math500Agent": AgentType("math", AnswerHooks()),
    "aime24Agent": AgentType("math", AnswerHooks()),
    "aime25Agent": AgentType("math", AnswerHooks()),
    "amc23Agent": AgentType("math", AnswerHooks()),
    "minervamathAgent": AgentType("math", AnswerHooks()),
    "webshopAgent": AgentType("webshop", WebShopHooks()),
    "birdAgent": AgentType("bird", SQLHooks()),
    "textworldAgent": AgentType("textworld", TextWorldHooks()),
    "gemAgent": AgentType("gem", GemHooks()),
}
