"""An infrastructure failure is never a training sample: a group with a failed member gives its other members
exactly the advantages (and the critic exactly the targets) of the same group without that member, for every
estimator in the registry; a group left with one member is left out whole; the policy's failures stay."""

import math
import random

import pytest
import torch
from omegaconf import OmegaConf

from grl.algo import ESTIMATORS, make_kl_controller
from grl.rollout.blame import INFRA, POLICY
from grl.rollout.types import Episode, Turn
from grl.trainer.transforms import add_advantages, shape_batch

GROUP_ESTIMATORS = {"grpo", "rloo", "gigpo", "rebn"}  # the issue's; the test runs every registered one


def episode(rng: random.Random, group: int, member: int, **failure) -> Episode:
    turns = [
        Turn(
            prompt_ids=[rng.randrange(1, 50) for _ in range(rng.randint(2, 5))],
            response_ids=[rng.randrange(1, 50) for _ in range(rng.randint(1, 4))],
            response_log_probs=None,
            reward=rng.choice([0.0, 1.0, -0.1, 0.5]),
            # shared states, so that GiGPO's step groups are not all singletons
            state_key=f"s{(k + member) % 2}",
        )
        for k in range(rng.randint(1, 3))
    ]
    return Episode("t", group, 100 + group, turns, sum(t.reward for t in turns), member=member, **failure)


def step_episodes():
    """Four groups of four. Group 0: member 1 failed in the infrastructure (its reward, the env-error penalty,
    would lower group 0's baseline). Group 1: three members failed, so one is left. Group 2: member 2 failed
    by
    the policy's doing (trained on). -> (all episodes, the reference: the same without what must be left
    out)."""
    rng = random.Random(7)
    infra = {"error": "RuntimeError: disk on fire", "error_kind": "exception", "blame": INFRA}
    policy = {"error": "PolicyFault: no such move", "error_kind": "policy", "blame": POLICY}
    failures = {(0, 1): infra, (1, 0): infra, (1, 1): infra, (1, 3): infra, (2, 2): policy}
    every = [episode(rng, g, m, **failures.get((g, m), {})) for g in range(4) for m in range(4)]
    for ep in every:
        if ep.blame == INFRA:
            ep.turns[-1].reward = ep.score = -5.0
    reference = [ep for ep in every if ep.blame != INFRA and ep.group_id != 1]
    return every, reference


def rollout_cfg(method="identity"):
    return OmegaConf.create(
        {
            "use_turn_scores": method == "identity",  # turn rewards take no normalised episode score
            "max_episode_length": 4096,
            "rollout_filter_ratio": 1.0,
            "rollout_filter_type": "std",
            "reward_normalization": {"grouping": "state", "method": method},
        }
    )


def algorithm(name):
    from grl.schema import Algorithm

    return Algorithm(adv_estimator=name, lam=0.9, high_level_gamma=0.9, gamma=0.95)


def scored(episodes, name, method="identity"):
    """The step's pure path on `episodes`: shaped, critic values (a fixed function of each token and its
    position, as a critic would give the same row the same values), advantages. -> {uid: (adv, returns)} on
    the trained tokens, and the uids of the batch."""
    batch, metrics = shape_batch(episodes, rollout_cfg(method), pad_token_id=0)
    positions = torch.arange(batch["input_ids"].shape[1], dtype=torch.float32)
    batch["values"] = (
        torch.sin(0.37 * batch["input_ids"].float() + 0.11 * positions) * batch["attention_mask"]
    )
    # a teacher's log-probs, a fixed function of each token and its position too (opd reads them)
    batch["teacher_log_probs"] = -torch.sigmoid(batch["input_ids"].float() - positions) * batch["loss_mask"]
    batch["rollout_log_probs"] = -0.5 * batch["loss_mask"]
    add_advantages(batch, algorithm(name), make_kl_controller("fixed", 0.0))
    trained = batch["loss_mask"] > 0
    rows = {
        uid: (batch["advantages"][i][trained[i]], batch["returns"][i][trained[i]])
        for i, uid in enumerate(batch.meta["uid"])
    }
    return rows, metrics


def test_the_issue_s_group_estimators_are_registered():
    assert GROUP_ESTIMATORS <= set(ESTIMATORS)


@pytest.mark.parametrize("method", ["identity", "mean_std"])
@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_an_infra_failure_leaves_the_others_advantages_and_critic_targets_as_without_it(name, method):
    every, reference = step_episodes()
    got, metrics = scored(every, name, method)
    want, _ = scored(reference, name, method)
    assert sorted(got) == sorted(want)  # group 1 (one member left) is out whole; the policy's failure is in
    assert "2-2" in got and not any(uid.startswith("1-") for uid in got)
    assert metrics["training/dropped_infra_episodes"] == 5.0  # the 4 failures and group 1's last member
    for uid, (advantages, returns) in want.items():
        assert torch.equal(got[uid][0], advantages), (name, uid)
        assert torch.equal(got[uid][1], returns), (
            name,
            uid,
        )  # the critic's targets, for the critic's estimators


def test_the_policy_s_failure_keeps_its_penalty_in_the_baseline():
    every, _ = step_episodes()
    got, _ = scored(every, "rloo")
    failed = next(ep for ep in every if ep.blame == POLICY)
    others = [ep.score for ep in every if ep.group_id == failed.group_id and ep is not failed]
    assert math.isclose(float(got[failed.uid][0][0]), failed.score - sum(others) / len(others), rel_tol=1e-6)
