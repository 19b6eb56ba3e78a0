"""Blame in a real rollout (tiny model, HF engine): an env says whose doing an ended episode is by what it
raises; the infrastructure's are counted by kind, left out of the batch, stop the run past
rollout.max_infra_failed_ratio, and may be played again; the policy's keep the format penalty and train."""

import threading
from dataclasses import asdict
from typing import ClassVar

import pytest

import grl.agents
import grl.envs
from grl.envs.base import Env, InfraFault, PolicyFault, step_info
from grl.rollout import TaskSpec
from grl.rollout.blame import INFRA, POLICY
from grl.rollout.env_faults import InfraFailureError
from grl.trainer.transforms import shape_batch
from tests.algo.test_infra_baselines import rollout_cfg
from tests.rollout.test_multi_turn import GREEDY, AlwaysAct, rollout, scripted


class BlamingEnv(Env):
    """Three steps of reward 1. On the seeds in `fault_seeds`, `fault` happens: `policy` raises PolicyFault
    and `infra` InfraFault (kind `database`) at step 2, `reset_infra` InfraFault (kind `service`) at reset,
    `transient` a RuntimeError at step 2 while `failures_left[seed]` lasts (counted down by each)."""

    failures_left: ClassVar[dict[int, int]] = {}
    lock = threading.Lock()

    def __init__(self, fault: str = "none", fault_seeds: list | None = None):
        self.fault, self.fault_seeds = fault, fault_seeds or []

    def reset(self, seed: int) -> str:
        if self.fault == "reset_infra" and seed in self.fault_seeds:
            raise InfraFault("the puzzle service is down", kind="service")
        self.seed, self.t = seed, 0
        return "Square 0 of 3."

    def step(self, action: str):
        self.t += 1
        if self.t == 2 and self.seed in self.fault_seeds:
            if self.fault == "policy":
                raise PolicyFault(f"{action!r} is no move in this puzzle")
            if self.fault == "infra":
                raise InfraFault("db down", kind="database")
            with self.lock:
                failing = self.failures_left.get(self.seed, 0) > 0
                self.failures_left[self.seed] = self.failures_left.get(self.seed, 0) - 1
            if self.fault == "transient" and failing:
                raise RuntimeError("a transient failure")
        done = self.t >= 3
        return f"Square {self.t} of 3.", 1.0, done, step_info(done, True, True)

    def valid_actions(self):
        return ["go", "stay"]


grl.envs.register("blaming_rollout_test", BlamingEnv)
grl.agents.register("blamingRolloutAgent", "blaming_rollout_test", AlwaysAct())


def blaming(name="blaming", **env_config):
    """Two groups of two; valid-action decoding, so every reply is a move."""
    agent_config = asdict(scripted(decoding="constrained").config.agent_config)
    block = {"agent_type": "blamingRolloutAgent", "agent_config": agent_config, "env_config": env_config}
    return TaskSpec(name, grl.agents.task_from_block(name, block), 2, 2)


def trained_uids(episodes):
    batch, _ = shape_batch(episodes, rollout_cfg(), pad_token_id=0)
    return sorted(batch.meta["uid"])


def test_a_policy_fault_keeps_the_format_penalty_and_is_trained_on(hf_engine, tokenizer):
    ro = rollout(hf_engine, tokenizer, env_error_penalty=-5.0)
    result = ro.run([blaming(fault="policy", fault_seeds=[1])], base_seed=0, sampling=GREEDY)
    failed = result.episodes[2:]
    assert all(e.blame == POLICY and e.error_kind == "policy" and "no move" in e.error for e in failed)
    assert [[t.reward for t in e.turns] for e in failed] == [
        [1.0, -0.1]
    ] * 2  # the task's format penalty, not -5
    assert (
        result.metrics["rollout/policy_failed_episodes"] == 2
        and result.metrics["rollout/infra_failed_episodes"] == 0
    )
    assert trained_uids(result.episodes) == ["0-0", "0-1", "1-0", "1-1"]


def test_infra_faults_are_counted_by_kind_and_left_out_of_the_batch(hf_engine, tokenizer):
    ro = rollout(hf_engine, tokenizer, env_error_penalty=-5.0)
    tasks = [
        blaming("db", fault="infra", fault_seeds=[1]),
        blaming("svc", fault="reset_infra", fault_seeds=[2]),
    ]
    result = ro.run(tasks, base_seed=0, sampling=GREEDY)
    assert [(e.task, e.group_id, e.blame, e.error_kind) for e in result.episodes if e.error] == [
        ("db", 1, INFRA, "database"),
        ("db", 1, INFRA, "database"),
        ("svc", 2, INFRA, "service"),
        ("svc", 2, INFRA, "service"),
    ]
    m = result.metrics
    assert (
        m["rollout/infra_failed_episodes"],
        m["rollout/infra_failed/database"],
        m["rollout/infra_failed/service"],
    ) == (
        4,
        2,
        2,
    )
    assert m["rollout/policy_failed_episodes"] == 0
    assert trained_uids(result.episodes) == ["0-0", "0-1", "3-0", "3-1"]


def test_past_max_infra_failed_ratio_the_run_stops_with_one_line(hf_engine, tokenizer):
    ro = rollout(hf_engine, tokenizer, max_infra_failed_ratio=0.25)
    with pytest.raises(InfraFailureError) as stopped:
        ro.run([blaming(fault="infra", fault_seeds=[1])], base_seed=0, sampling=GREEDY)
    message = str(stopped.value)
    assert "\n" not in message
    assert message.startswith(
        "2 of 4 episodes failed in the infrastructure, more than rollout.max_infra_failed_ratio 0.25"
    )
    assert "(2 of kind database)" in message and message.endswith(
        "task blaming seed 1 (database): grl.envs.base.InfraFault: db down"
    )
    # The policy's failures are no infrastructure failures: the same share of them goes on.
    ro.run([blaming(fault="policy", fault_seeds=[1])], base_seed=0, sampling=GREEDY)


def test_infra_retries_play_the_failed_seeds_again(hf_engine, tokenizer):
    BlamingEnv.failures_left = {1: 2}  # both attempts of group 1 fail once
    once = rollout(hf_engine, tokenizer).run(
        [blaming(fault="transient", fault_seeds=[1])], base_seed=0, sampling=GREEDY
    )
    assert (
        once.metrics["rollout/infra_failed_episodes"] == 2
        and once.metrics["rollout/infra_retried_episodes"] == 0
    )
    BlamingEnv.failures_left = {1: 2}
    ro = rollout(hf_engine, tokenizer, infra_retries=1)
    again = ro.run([blaming(fault="transient", fault_seeds=[1])], base_seed=0, sampling=GREEDY)
    assert (
        again.metrics["rollout/infra_retried_episodes"] == 2
        and again.metrics["rollout/infra_failed_episodes"] == 0
    )
    assert [(e.group_id, e.member, e.seed, e.error, len(e.turns)) for e in again.episodes] == [
        (g, m, g, None, 3) for g in range(2) for m in range(2)
    ]
    assert trained_uids(again.episodes) == ["0-0", "0-1", "1-0", "1-1"]
