"""One agent's state during a rollout (grl/rollout/multi_turn.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grl.engines.constraint import ReplyGrammar
from grl.rollout.tasks import TaskSpec
from grl.rollout.types import Turn


@dataclass
class Slot:
    task: TaskSpec
    key: tuple  # the agent cache key: task, its config, position among the task's agents
    group_id: int
    seed: int
    member: int
    agent: Any = None
    ids: list[int] = field(default_factory=list)  # the episode's token ids so far
    pending: list[int] = field(default_factory=list)  # ids added since the last reply
    keep_prefix: int = 0  # system-prompt ids that truncation keeps
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    error: str | None = None
    error_kind: str | None = None  # exception | timeout | a kind of grl/envs/checks.py
    env_warnings: int = 0  # values of the env that were repaired
    hung: bool = False
    truncated_turns: int = 0
    new_context: bool = False  # `pending` is a whole prompt (the first, or a windowed one), not a continuation
    grammar: ReplyGrammar | None = None  # this turn's valid-action grammar (None: free decoding)
    output: Any = None  # this turn's GenerationOutput
