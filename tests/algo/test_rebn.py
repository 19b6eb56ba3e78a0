"""ReBN (GEM's per-turn discounted returns with return batch normalisation) against a Python loop."""

import math
import statistics

import pytest
import torch

from grl.algo import compute_advantage, compute_rebn
from grl.schema import Algorithm
from tests.algo.batches import random_episode_batch


def ref_rebn(batch, gamma, eps=1e-9):
    """GEM's trainer, transition by transition: each turn is a transition with reward = its summed reward
    tokens; returns run backwards over an episode's turns; all transitions of the batch are normalised with
    the population std; a transition's advantage sits on each of its generated tokens."""
    m, r, tids = batch["loss_mask"], batch["token_rewards"], batch["turn_ids"]
    transitions = []  # (row, generated positions, return)
    for b in range(m.shape[0]):
        turns = {}
        for t in range(m.shape[1]):
            if m[b, t] > 0:
                turns.setdefault(int(tids[b, t]), []).append(t)
        episode = [
            (positions, sum(float(r[b, t]) for t in positions)) for _, positions in sorted(turns.items())
        ]
        future = 0.0
        for positions, reward in reversed(episode):
            future = reward + gamma * future
            transitions.append((b, positions, future))
    returns = [g for _, _, g in transitions]
    mean, std = statistics.fmean(returns), statistics.pstdev(returns)
    adv, ret = torch.zeros_like(m), torch.zeros_like(m)
    for b, positions, g in transitions:
        for t in positions:
            adv[b, t], ret[b, t] = (g - mean) / (std + eps), g
    return adv, ret


@pytest.mark.parametrize("seed", range(6))
def test_rebn_matches_the_loop(seed):
    batch = random_episode_batch(20, 4100 + seed, max_turns=5)
    gamma = [1.0, 0.9, 0.5][seed % 3]
    adv, ret = compute_advantage(batch, Algorithm(adv_estimator="rebn", gamma=gamma))
    ref_adv, ref_ret = ref_rebn(batch, gamma)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ret, ref_ret, rtol=1e-9, atol=1e-9)
    turn_adv = [a for a in adv[batch["loss_mask"] > 0].tolist()]
    assert len(set(turn_adv)) > 2  # the batch really has several distinct returns


def test_rebn_by_hand():
    # row 0: turns with rewards 0, 1 -> returns 0.5, 1 at gamma 0.5; row 1: one turn, reward -1
    m = torch.tensor([[0, 1, 1, 0, 1], [0, 1, 0, 0, 0]], dtype=torch.float64)
    tids = torch.tensor([[0, 0, 0, 1, 1], [0, 0, -1, -1, -1]])
    r = torch.tensor([[0, 0, 0, 0, 1], [0, -1, 0, 0, 0]], dtype=torch.float64)
    adv, ret = compute_rebn(r, m, tids, 0.5)
    returns = [0.5, 1.0, -1.0]
    mean, std = sum(returns) / 3, math.sqrt(sum((g - sum(returns) / 3) ** 2 for g in returns) / 3)
    z = [(g - mean) / (std + 1e-9) for g in returns]
    torch.testing.assert_close(
        ret, torch.tensor([[0, 0.5, 0.5, 0, 1.0], [0, -1.0, 0, 0, 0]], dtype=torch.float64)
    )
    torch.testing.assert_close(
        adv, torch.tensor([[0, z[0], z[0], 0, z[1]], [0, z[2], 0, 0, 0]], dtype=torch.float64)
    )


def test_rebn_needs_no_critic_in_the_config():
    from grl.config import load_config

    cfg = load_config(["algorithm.adv_estimator=rebn", "critic.enable=false"])
    assert cfg.algorithm.adv_estimator == "rebn"


@pytest.mark.slow
def test_a_short_training_run_on_a_gem_game(tmp_path, ray_runtime):
    """The tiny model trains two steps with ReBN on GEM's Guess the Number, one move per reply drawn from
    the game's valid moves."""
    from grl.config import load_config
    from grl.tracking import METRICS_FILE, read_jsonl
    from grl.trainer.agent_trainer import AgentTrainer

    task = "gemAgent_GuessTheNumber_easy"
    overrides = {
        "model_path": "tiny",
        "n_gpus_per_node": 1,
        "trainer.device": "cpu",
        "actor_rollout_ref.rollout.name": "hf",
        "max_response_length": 16,
        "rollout.training": f"[{task}]",
        "rollout.validation": f"[{task}]",
        "rollout.agent_group_num": "[2]",
        "rollout.agent_group_size": "[2]",
        f"{task}.agent_config.action_decoding": "constrained",
        "algorithm.adv_estimator": "rebn",
        "algorithm.gamma": 0.9,
        "critic.enable": False,
        "ppo_mini_batch_size": 2,
        "micro_batch_size_per_gpu": 2,
        "total_training_steps": 2,
        "test_freq": -1,
        "trainer.val_before_train": False,
        "save_freq": -1,
        "trainer.logger": "[jsonl]",
        "trainer.run_dir": str(tmp_path / "run"),
        "trainer.default_local_dir": str(tmp_path / "ckpt"),
        "actor_rollout_ref.actor.optim.lr": 1e-3,
    }
    AgentTrainer.from_config(load_config([f"{k}={v}" for k, v in overrides.items()])).fit()
    history = {r["step"]: r for r in read_jsonl(tmp_path / "run" / METRICS_FILE)}
    assert sorted(history) == [1, 2]
    for step in (1, 2):
        assert math.isfinite(history[step]["actor/pg_loss"]) and history[step]["actor/grad_norm"] > 0
        assert (
            history[step][f"train/{task}/action_is_valid"] == 1.0
        )  # constrained: every move is a valid guess
