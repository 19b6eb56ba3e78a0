"""One agent's state during a rollout (grl/rollout/multi_turn.py), and the Episode it ends as."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grl.engines.constraint import ReplyGrammar
from grl.rollout.tasks import TaskSpec
from grl.rollout.types import Episode, Turn


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
    blame: str | None = None  # policy | infra (grl/rollout/blame.py)
    env_warnings: int = 0  # values of the env that were repaired
    hung: bool = False
    truncated_turns: int = 0
    new_context: bool = (
        False  # `pending` is a whole prompt (the first, or a windowed one), not a continuation
    )
    grammar: ReplyGrammar | None = None  # this turn's valid-action grammar (None: free decoding)
    output: Any = None  # this turn's GenerationOutput

    def episode(self) -> Episode:
        metrics, messages = {}, []
        if self.error is None:  # a failed agent is not asked anything more
            metrics = {k: float(v) for k, v in self.agent.episode_metrics().items()}
            messages = [dict(m) for m in self.agent.messages]
        return Episode(
            task=self.task.name,
            group_id=self.group_id,
            seed=self.seed,
            turns=self.turns,
            score=sum(t.reward for t in self.turns),
            metrics=metrics,
            error=self.error,
            member=self.member,
            messages=messages,
            error_kind=self.error_kind,
            blame=self.blame,
            env_warnings=self.env_warnings,
        )
