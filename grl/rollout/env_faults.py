"""Env faults during a rollout (grl/rollout/multi_turn.py): how a failed agent's episode ends and is
logged, the failure ratio that stops a step, and what becomes of the failed agents.

An env that raises (in `reset` or `step`), overruns `env_step_timeout` or returns a value
breaking the contract (grl/envs/checks.py) ends that agent's episode with reward `env_error_penalty`
(default: the task's format penalty) on the failed turn, as the infrastructure's doing: the trainer leaves
it out of training (grl/rollout/blame.py). One that raises `PolicyFault` ends it with the task's format
penalty, as the policy's doing, trained on. Either is logged (once per task and kind for bad
values) with task and seed, counted in `<task>/env_errors` (non-finite rewards also in
`<task>/nonfinite_rewards`), and the agent is thrown away (a hung one is never touched again). A repaired
observation keeps its episode and is counted in `<task>/env_warnings`. If more than
`max_failed_agent_ratio` of the step's agents fail, `RolloutError` stops it; if more than
`max_infra_failed_ratio` of its episodes (those of agent programs too, after any `infra_retries`) failed in
the infrastructure, `InfraFailureError` (`check_infra_ratio`).
"""

from __future__ import annotations

import logging
from collections import Counter

from grl.envs.base import InfraFault, PolicyFault
from grl.envs.checks import VALUE_KINDS, EnvValueError, Repair
from grl.rollout.blame import POLICY, blame_of, infra_failed
from grl.rollout.env_pool import run_calls
from grl.rollout.slot import Slot
from grl.rollout.types import Episode

log = logging.getLogger("grl.rollout")


class RolloutError(RuntimeError):
    """The step cannot produce a batch worth training on."""


class InfraFailureError(RolloutError):
    """More of a step's episodes failed in the infrastructure than `rollout.max_infra_failed_ratio` allows."""


def check_failure_ratio(
    failed: list[tuple[str, int, str]], total: int, ratio: float, who: str = "agents"
) -> None:
    """RolloutError when more than `ratio` of `total` failed; `failed`: (task, seed, error) of each
    failure."""
    if len(failed) > ratio * total:
        task, seed, error = failed[0]
        raise RolloutError(
            f"{len(failed)} of {total} {who} failed, more than max_failed_agent_ratio {ratio:g}; "
            f"first: task {task} seed {seed}: {error.strip().splitlines()[-1] if error else ''}"
        )


def check_infra_ratio(episodes: list[Episode], ratio: float) -> None:
    """InfraFailureError when more than `ratio` of the episodes failed in the infrastructure: one line with
    the commonest kind, the count and the last error."""
    failed = [ep for ep in episodes if infra_failed(ep)]
    if not failed or len(failed) <= ratio * len(episodes):
        return
    kind, count = Counter(ep.error_kind or "exception" for ep in failed).most_common(1)[0]
    last = failed[-1]
    error = last.error.strip().splitlines()[-1] if last.error and last.error.strip() else "unknown error"
    raise InfraFailureError(
        f"{len(failed)} of {len(episodes)} episodes failed in the infrastructure, more than "
        f"rollout.max_infra_failed_ratio {ratio:g} ({count} of kind {kind}); last: task {last.task} seed "
        f"{last.seed} "
        f"({last.error_kind}): {error}"
    )


class EnvFaults:
    """The env faults of one rollout's agents, across its calls (each kind of bad value is logged once)."""

    def __init__(self, env_error_penalty: float | None, max_failed_agent_ratio: float):
        self.env_error_penalty = env_error_penalty
        self.max_failed_agent_ratio = max_failed_agent_ratio
        self._logged_env_values: set[tuple[str, str]] = set()  # (task, kind) of bad env values already logged
        self.others: list[Slot] = []

    def fail(self, s: Slot, error: str | None, timed_out: bool, where: str, kind: str = "exception") -> None:
        """End the slot's episode: a PolicyFault's (kind `policy`) with the task's format penalty, to be
        trained
        on; any other with `env_error_penalty`, to be left out of training (grl/rollout/blame.py)."""
        s.done = True
        s.hung = timed_out
        s.error = (error or "unknown env error").strip()
        s.error_kind = "timeout" if timed_out else kind
        s.blame = blame_of(s.error_kind)
        penalty = (
            s.agent.format_penalty
            if s.blame == POLICY or self.env_error_penalty is None
            else self.env_error_penalty
        )
        if s.turns:
            s.turns[-1].reward = float(penalty)
        fate = (
            "trained on (the policy's doing)"
            if s.blame == POLICY
            else "left out of training (the infrastructure's doing)"
        )
        episode = (
            f"task {s.task.name} (seed {s.seed}, group {s.group_id}, agent {s.member}); episode ended with "
            f"reward {penalty:g}, {fate}"
        )
        if s.error_kind not in VALUE_KINDS:
            log.error("env failure in %s of %s:\n%s", where, episode, s.error)
        elif self._first_of_kind(s.task.name, s.error_kind):
            log.error(
                "bad env value (%s) in %s; further ones of this task and kind are only counted in "
                "%s/env_errors: %s",
                s.error_kind,
                episode,
                s.task.name,
                s.error,
            )

    def repaired(self, s: Slot, repairs: list[Repair]) -> None:
        s.env_warnings += len(repairs)
        for repair in repairs:
            if self._first_of_kind(s.task.name, repair.kind):
                log.warning(
                    "env value repaired (%s) in task %s (seed %d); further ones of this task and kind are "
                    "only counted in %s/env_warnings: %s",
                    repair.kind,
                    s.task.name,
                    s.seed,
                    s.task.name,
                    repair.detail,
                )

    def check(self, slots: list[Slot]) -> None:
        """RolloutError when more than max_failed_agent_ratio of `slots` and `others` (the step's agents that
        played before: an infra retry plays only the failed ones) failed."""
        every = [*self.others, *slots]
        check_failure_ratio(
            [(s.task.name, s.seed, s.error) for s in every if s.error is not None],
            len(every),
            self.max_failed_agent_ratio,
        )

    def _first_of_kind(self, task: str, kind: str) -> bool:
        seen = (task, kind) in self._logged_env_values
        self._logged_env_values.add((task, kind))
        return not seen


def reset_agent(s: Slot):
    """The agent's first messages, or the EnvValueError of a bad reset observation (or the PolicyFault or
    InfraFault the env raised): returned, not raised, so that its kind survives the pool (which keeps only a
    traceback)."""
    try:
        return s.agent.reset(s.seed)
    except (EnvValueError, PolicyFault, InfraFault) as err:
        return err


def retire_failed(slots: list[Slot], agents: dict, workers: int, timeout: float | None) -> None:
    """Drop failed agents from the `agents` cache; close the ones that did not hang."""
    failed = [s for s in slots if s.error is not None]
    for s in failed:
        agents.pop(s.key, None)
    run_calls([s.agent.close for s in failed if not s.hung], workers, timeout)
