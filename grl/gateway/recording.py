"""A program's episode, from the calls it made and how its program ended, as the rollout's `Episode`; and
the gateway's counts over a rollout's episodes (`gateway/...`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from grl.gateway.contract import ProgramTask, ProgramValueError, final_messages
from grl.gateway.episodes import EpisodeLog
from grl.rollout.blame import POLICY, blame_of
from grl.rollout.tasks import TaskSpec
from grl.rollout.types import Episode

log = logging.getLogger("grl.gateway")


@dataclass
class ProgramEpisode:
    """One episode a program plays: its name in the gateway's URLs, its task and the calls it made."""

    name: str
    spec: TaskSpec
    settings: Any  # the task's agent_config (grl.schema.AgentConfig)
    task: ProgramTask
    log: EpisodeLog


class EpisodeRecorder:
    """`episode(r, outcome)`: the `Episode` of a program's episode, given the pool's outcome of its program.
    A failed program's episode ends with the env-failure penalty (the format penalty where the policy is to
    blame: grl/rollout/blame.py); the first failure of each task and kind
    is logged in full, the later ones only counted."""

    def __init__(self, env_error_penalty: float | None):
        self.env_error_penalty = env_error_penalty
        self._logged: set[tuple[str, str]] = set()

    def episode(self, r: ProgramEpisode, outcome) -> Episode:
        turns = r.log.turns()
        error = kind = None
        reward, metrics = 0.0, {}
        if not outcome.ok:
            error, kind = outcome.error, outcome.kind or ("timeout" if outcome.timed_out else "exception")
        elif isinstance(outcome.value, ProgramValueError):
            error, kind = f"bad reward: {outcome.value}", "bad_reward"
        else:
            reward, metrics = outcome.value
        blame = blame_of(kind)
        if error is not None:
            policy = blame == POLICY or self.env_error_penalty is None
            penalty = r.settings.format_penalty if policy else self.env_error_penalty
            reward = penalty
            if (r.spec.name, kind) not in self._logged:
                self._logged.add((r.spec.name, kind))
                log.error(
                    "program of task %s failed (%s, seed %d, group %d, attempt %d); episode ended with "
                    "reward "
                    "%g; further ones of this task and kind are only counted:\n%s",
                    r.spec.name,
                    kind,
                    r.task.seed,
                    r.task.group,
                    r.task.attempt,
                    penalty,
                    error.strip(),
                )
        if turns:
            turns[-1].reward = reward
        return Episode(
            task=r.spec.name,
            group_id=r.task.group,
            seed=r.task.seed,
            turns=turns,
            score=reward if turns else 0.0,
            metrics=metrics,
            error=error,
            error_kind=kind,
            blame=blame,
            member=r.task.attempt,
            messages=final_messages(r.log),
        )


def gateway_metrics(running: list[ProgramEpisode], episodes: list[Episode]) -> dict[str, float]:
    counts = {
        "calls": sum(len(r.log.calls) for r in running),
        "prefix_breaks": sum(r.log.prefix_breaks for r in running),
        "branches": sum(r.log.branches for r in running),
        "retried_calls": sum(r.log.retries for r in running),
        "truncated_calls": sum(r.log.truncations for r in running),
        "refused_calls": sum(r.log.refused for r in running),
        "program_errors": sum(e.error_kind == "exception" for e in episodes),
        "program_timeouts": sum(e.error_kind == "timeout" for e in episodes),
        "bad_rewards": sum(e.error_kind == "bad_reward" for e in episodes),
        "episodes_without_calls": sum(not e.turns for e in episodes),
    }
    return {f"gateway/{name}": float(value) for name, value in counts.items()}
