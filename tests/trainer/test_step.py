"""The pure phases of a training step: shape, advantage, non-finite rows."""

import random

import pytest
import torch
from omegaconf import OmegaConf

from grl.algo import make_kl_controller
from grl.rollout.types import Episode, Turn
from grl.trainer.transforms import add_advantages, drop_nonfinite_rows, shape_batch
from grl.trainer.metrics import batch_metrics, reward_metrics, task_metrics


def episodes(num_groups=3, group_size=4, seed=0):
    rng = random.Random(seed)
    out = []
    for g in range(num_groups):
        for m in range(group_size):
            turns = [Turn(prompt_ids=[rng.randrange(1, 50) for _ in range(rng.randint(2, 6))],
                          response_ids=[rng.randrange(1, 50) for _ in range(rng.randint(1, 5))],
                          response_log_probs=None, reward=rng.choice([0.0, 1.0, -0.1]), state_key=f"s{(k + m) % 2}")
                     for k in range(rng.randint(1, 3))]
            out.append(Episode(task="t", group_id=g, seed=100 + g, turns=turns, score=sum(t.reward for t in turns),
                               metrics={"success": float(rng.random() < 0.5)}, member=m))
    return out


def rollout_cfg(**over):
    cfg = {"use_turn_scores": False, "max_episode_length": 4096, "packing": False, "rollout_filter_ratio": 1.0,
           "rollout_filter_type": "std", "reward_normalization": {"grouping": "state", "method": "identity"}}
    cfg.update(over)
    return OmegaConf.create(cfg)


def algo_cfg(estimator, **over):
    cfg = {"adv_estimator": estimator, "gamma": 1.0, "lam": 0.95, "high_level_gamma": 0.95,
           "turn_advantage_weight": 1.0, "gigpo_step_weight": 1.0, "norm_adv_by_std_in_grpo": True, "kl_penalty": "kl",
           "use_kl_in_reward": False}
    cfg.update(over)
    return OmegaConf.create(cfg)


def score(batch, seed=1):
    """Stand-in worker outputs: fixed pseudo-random values/log-probs per token id and position."""
    gen = torch.Generator().manual_seed(seed)
    ids = batch["input_ids"].float()
    batch["values"] = torch.sin(ids * 0.37 + batch["position_ids"]) * batch["attention_mask"]
    batch["old_log_probs"] = -torch.rand(ids.shape, generator=gen) * batch["loss_mask"]
    batch["ref_log_probs"] = batch["old_log_probs"] - 0.1 * batch["loss_mask"]


def per_episode(batch, key):
    """{uid: values on that episode's tokens} for padded or packed batches."""
    out = {}
    if "seq_ids" not in batch:
        for row, uid in enumerate(batch.meta["uid"]):
            out[uid] = batch[key][row][batch["attention_mask"][row] > 0]
        return out
    uids = [u for row in batch.meta["uid"] for u in row]
    for k, uid in enumerate(uids):
        out[uid] = batch[key][batch["seq_ids"] == k]
    return out


@pytest.mark.parametrize("estimator", ["gae", "bi_level_gae", "grpo", "rloo", "reinforce_plus_plus", "gigpo", "rebn"])
def test_packed_batch_gets_the_same_advantages_as_padded(estimator):
    eps = episodes()
    results = []
    for packing in (False, True):
        batch, _ = shape_batch(eps, rollout_cfg(packing=packing, max_episode_length=40), pad_token_id=0)
        score(batch)
        # values must match per token for the comparison: recompute them from (token, position)
        add_advantages(batch, algo_cfg(estimator), make_kl_controller("fixed", 0.0))
        results.append((per_episode(batch, "advantages"), per_episode(batch, "returns")))
    (adv_a, ret_a), (adv_b, ret_b) = results
    assert adv_a.keys() == adv_b.keys()
    for uid in adv_a:
        torch.testing.assert_close(adv_a[uid], adv_b[uid])
        torch.testing.assert_close(ret_a[uid], ret_b[uid])


def test_kl_in_reward_lowers_rewards_and_moves_the_adaptive_coefficient():
    batch, _ = shape_batch(episodes(), rollout_cfg(), pad_token_id=0)
    score(batch)
    before = batch["token_rewards"].clone()
    ctrl = make_kl_controller("adaptive", 0.5, target_kl=0.01, horizon=10)
    metrics = add_advantages(batch, algo_cfg("gae", use_kl_in_reward=True), ctrl)
    mask = batch["loss_mask"] > 0
    torch.testing.assert_close(batch["token_rewards"][mask], before[mask] - 0.5 * 0.1)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.1)
    assert ctrl.value > 0.5  # measured KL 0.1 is above the 0.01 target


def test_normalisation_and_filtering_shape_the_batch():
    eps = episodes(num_groups=4, group_size=4, seed=3)
    batch, metrics = shape_batch(eps, rollout_cfg(rollout_filter_ratio=0.5,
                                                  reward_normalization={"grouping": "state", "method": "mean_std"}),
                                 pad_token_id=0)
    assert metrics["train/t/kept_groups"] == 2 and len(batch) == 8
    by_group = {}
    for g, s in zip(batch.meta["group_id"], batch.meta["episode_score"]):
        by_group.setdefault(g, []).append(s)
    for scores in by_group.values():  # mean_std within each kept group
        assert sum(scores) == pytest.approx(0.0, abs=1e-6)
    # the normalised score sits on the last sampled token of each row
    last = [row.nonzero().max().item() for row in batch["loss_mask"]]
    placed = [batch["token_rewards"][r, t].item() for r, t in enumerate(last)]
    assert placed == pytest.approx(batch.meta["episode_score"])


def test_nonfinite_rows_are_dropped_and_counted():
    batch, _ = shape_batch(episodes(), rollout_cfg(), pad_token_id=0)
    score(batch)
    add_advantages(batch, algo_cfg("gae"), make_kl_controller("fixed", 0.0))
    assert drop_nonfinite_rows(batch)[1] == 0
    first_token = batch["loss_mask"][2].nonzero()[0].item()
    batch["advantages"][2, first_token] = float("nan")
    batch["returns"][5, 0] = float("inf")  # a prompt token: not trained on, so harmless
    batch["token_rewards"][7, batch["loss_mask"][7].nonzero()[-1].item()] = float("-inf")
    # What the workers read is checked here too: they trust the batch they get.
    batch["old_log_probs"][4, batch["loss_mask"][4].nonzero()[0].item()] = float("nan")
    batch["values"][6, batch["loss_mask"][6].nonzero()[-1].item()] = float("inf")
    kept, dropped = drop_nonfinite_rows(batch)
    assert dropped == 4 and len(kept) == len(batch) - 4
    assert not {batch.meta["uid"][i] for i in (2, 4, 6, 7)} & set(kept.meta["uid"])


def test_metrics_of_a_step():
    eps = episodes()
    rewards = reward_metrics(eps)
    scores = [e.score for e in eps]
    assert rewards["reward/mean"] == pytest.approx(sum(scores) / len(scores))
    assert rewards["reward/max"] == max(scores)
    batch, _ = shape_batch(eps, rollout_cfg(), pad_token_id=0)
    m = batch_metrics(batch)
    assert m["response_length/mean"] == pytest.approx(
        sum(len(t.response_ids) for e in eps for t in e.turns) / len(eps))
    assert 0 <= m["perf/padding_ratio"] < 1
    assert task_metrics({"t/success": 0.5, "rollout/env_errors": 1.0}, "val-env") == {
        "val-env/t/success": 0.5, "val-rollout/env_errors": 1.0}
    assert task_metrics({"t/success": 0.5, "rollout/env_errors": 1.0}, "train") == {
        "train/t/success": 0.5, "rollout/env_errors": 1.0}


def test_finish_report_names_first_best_and_last_validation(tmp_path):
    from grl.trainer.agent_trainer import finish_report

    text = finish_report({"gsm8k": [(0, 0.25), (2, 0.5), (4, 0.5), (6, 0.375)]}, tmp_path / "global_step_6",
                         tmp_path / "hf_actor")
    assert text.splitlines()[0] == ("finished gsm8k: validation success 0.250 at step 0, best 0.500 at step 2, "
                                    "last 0.375 at step 6")
    assert str(tmp_path / "hf_actor") in text and str(tmp_path / "global_step_6") in text
    assert "no validation ran" in finish_report({}, None, None)
