"""A curriculum over puzzle difficulty: one env_config key of the training tasks, stepped from easy to hard
as training succeeds (`rollout.curriculum`, its `env_key`).

Stage i plays every training task with `env_config[env_key] = levels[i]` and, where `max_turns` is given,
at most `max_turns[i]` replies an episode: the turn budget grows with the puzzles, so an attempt that fails
an easy level stops where its moves no longer help, and costs the rollout and the update no more. After each
step the step's training success (the mean of the episodes' `success`) is recorded; when the mean over the
last `window` steps of the stage reaches `promote_at`, the next stage begins, and the last stays. Validation
plays the tasks as their blocks set them, so its curve measures the target difficulty throughout.

The stage a rollout plays is fixed by the step, not by timing: step t plays the stage reached after step
t - 1 - max_staleness, whose success is known by the time that rollout may start (grl/trainer/pipeline.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from statistics import fmean

from grl.agents import Task
from grl.rollout import Episode, TaskSpec


@dataclass
class Curriculum:
    key: str
    levels: list
    promote_at: float
    window: int
    max_turns: list[int] = field(default_factory=list)  # a stage's cap on replies; empty: the tasks' own
    stage: int = 0
    successes: list[float] = field(default_factory=list)  # this stage's, step by step
    # step -> stage reached after it, kept where the stage changed: a rollout any number of steps ahead
    # (rollout.max_staleness) finds its stage, and the record stays as small as the number of stages
    stage_after: dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_config(cls, c) -> Curriculum | None:
        """From the typed `rollout.curriculum` section; None where it steps no key."""
        return (
            None
            if c.env_key is None
            else cls(c.env_key, list(c.levels), c.promote_at, c.window, list(c.max_turns))
        )

    def stage_for(self, step: int, max_staleness: int = 0) -> int:
        """The stage training step `step` plays: the one reached after step `step - 1 - max_staleness`."""
        earlier = [s for s in self.stage_after if s <= step - 1 - max_staleness]
        return self.stage_after[max(earlier)] if earlier else 0

    def tasks(self, specs: list[TaskSpec], stage: int) -> list[TaskSpec]:
        return [replace(s, config=self._task_at(s.config, stage)) for s in specs]

    def _task_at(self, task: Task, stage: int) -> Task:
        staged = replace(task, env_config={**task.env_config, self.key: self.levels[stage]})
        if not self.max_turns:
            return staged
        return replace(staged, agent_config=replace(task.agent_config, max_turns=self.max_turns[stage]))

    def record(self, step: int, episodes: list[Episode]) -> bool:
        """Note the step's training success; True when it moved the curriculum to the next stage."""
        self.successes.append(
            fmean(float(ep.metrics.get("success", 0.0)) for ep in episodes) if episodes else 0.0
        )
        recent = self.successes[-self.window :]
        promoted = (
            self.stage < len(self.levels) - 1
            and len(recent) == self.window
            and fmean(recent) >= self.promote_at
        )
        if promoted:
            self.stage, self.successes = self.stage + 1, []
        if not self.stage_after or self.stage_after[max(self.stage_after)] != self.stage:
            self.stage_after[step] = self.stage
        return promoted

    def metrics(self, stage: int) -> dict[str, float]:
        """The stage a step played, and the key's value there when it is a number."""
        value = self.levels[stage]
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        return {
            "curriculum/stage": float(stage),
            **({f"curriculum/{self.key}": float(value)} if numeric else {}),
        }

    def state(self) -> dict:
        return {"stage": self.stage, "successes": list(self.successes), "stage_after": dict(self.stage_after)}

    def load_state(self, state: dict) -> None:
        self.stage, self.successes = int(state["stage"]), list(state["successes"])
        self.stage_after = {int(k): int(v) for k, v in state["stage_after"].items()}
