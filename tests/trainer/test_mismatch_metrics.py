"""The engine/trainer mismatch metrics: verl's `training/rollout_probs_diff_*` (|delta p|) and GRL's
`training/rollout_logprob_diff_*` (|delta log p|), against slow references; and the update that skips
the old-log-prob pass reports the same figures as the pass, over every rank's tokens."""

import math
import random
import statistics

import pytest
import torch

from grl.algo.mismatch import KEYS, mismatch_stats
from grl.rollout.types import Batch
from grl.trainer.metrics import on_policy_mismatch, rollout_mismatch_metrics


def slow_stats(engine: list[float], trainer: list[float]) -> dict[str, float]:
    """Token by token in Python floats; verl's std divides by n - 1 (torch.std); the p99 is the smallest
    gap that at least 99% of the tokens are within."""
    probs = [abs(math.exp(a) - math.exp(b)) for a, b in zip(engine, trainer)]
    logs = sorted(abs(a - b) for a, b in zip(engine, trainer))
    within = next(g for g in logs if sum(x <= g for x in logs) >= 0.99 * len(logs))
    return {
        "rollout_probs_diff_mean": sum(probs) / len(probs),
        "rollout_probs_diff_max": max(probs),
        "rollout_probs_diff_std": statistics.stdev(probs),
        "rollout_logprob_diff_mean": sum(logs) / len(logs),
        "rollout_logprob_diff_max": logs[-1],
        "rollout_logprob_diff_p99": within,
    }


@pytest.mark.parametrize("n", [2, 7, 100, 101, 1000, 1501])
def test_stats_equal_the_slow_reference(n):
    rng = random.Random(n)
    trainer = [math.log(rng.uniform(1e-6, 1.0)) for _ in range(n)]
    engine = [t + rng.gauss(0, 0.05) * (10 if rng.random() < 0.02 else 1) for t in trainer]
    got = mismatch_stats(torch.tensor(engine), torch.tensor(trainer))
    want = slow_stats([float(x) for x in torch.tensor(engine)], [float(x) for x in torch.tensor(trainer)])
    assert set(got) == set(KEYS) == set(want)
    for key in KEYS:
        assert got[key] == pytest.approx(want[key], rel=1e-9, abs=1e-12), key


def test_probability_gap_and_log_gap_tell_different_tokens_apart():
    """A rare token 1 nat apart barely moves its probability; a likely token 0.1 nat apart moves it by
    ~0.09: verl's metric sees the second, the log-space one the first."""
    engine = torch.tensor([-9.0, -0.1])
    trainer = torch.tensor([-8.0, -0.2])
    got = mismatch_stats(engine, trainer)
    assert got["rollout_logprob_diff_max"] == pytest.approx(1.0)
    assert got["rollout_probs_diff_max"] == pytest.approx(math.exp(-0.1) - math.exp(-0.2))
    assert got["rollout_probs_diff_mean"] == pytest.approx(
        (math.exp(-8) - math.exp(-9) + math.exp(-0.1) - math.exp(-0.2)) / 2
    )


def test_one_token_has_no_spread_and_no_token_has_no_stats():
    one = mismatch_stats(torch.tensor([-1.0]), torch.tensor([-1.5]))
    assert one["rollout_probs_diff_std"] == 0.0 and one["rollout_logprob_diff_p99"] == pytest.approx(0.5)
    assert mismatch_stats(torch.tensor([]), torch.tensor([])) == {}


def test_the_batch_metrics_read_the_sampled_tokens_only():
    old = torch.log(torch.tensor([[0.5, 0.25, 0.9, 0.1], [0.2, 0.7, 0.3, 0.6]]))
    rollout = old + torch.tensor([[5.0, 0.1, -0.2, 5.0], [0.3, -5.0, 0.05, 0.0]])  # 5: prompt tokens
    mask = torch.tensor([[0, 1, 1, 0], [1, 0, 1, 1]])
    got = rollout_mismatch_metrics(
        Batch({"old_log_probs": old, "rollout_log_probs": rollout, "loss_mask": mask})
    )
    sampled = mask > 0
    want = slow_stats(rollout[sampled].tolist(), old[sampled].tolist())
    assert got == pytest.approx({f"training/{k}": v for k, v in want.items()})


@pytest.mark.slow  # Ray and two ranks
def test_an_on_policy_update_reports_the_mismatch_the_pass_would(ray_runtime):
    """Without old log-probs the update scores the sampled tokens itself; what it reports, from the
    tokens of both ranks, equals `rollout_mismatch_metrics` over the whole batch after a scoring pass.
    The engine's gaps grow with the row, so each rank's rows alone would give other figures."""
    from grl.trainer.transforms import add_advantages, shape_batch
    from grl.algo import make_kl_controller
    from grl.workers import ActorRolloutRefGroup
    from grl.run_plan import RunPlan
    from test_step import algo_cfg, episodes, rollout_cfg, two_rank_one_mini_batch_config

    cfg = two_rank_one_mini_batch_config()
    assert not RunPlan.from_config(cfg).old_log_prob_pass(12)
    actor = ActorRolloutRefGroup.from_config(cfg, RunPlan.from_config(cfg))
    try:
        batch, _ = shape_batch(episodes(), rollout_cfg(), pad_token_id=0)
        behaviour, _ = actor.compute_log_probs(batch)
        rows = torch.arange(len(batch), dtype=torch.float32)[:, None]
        noise = torch.randn(behaviour.shape, generator=torch.Generator().manual_seed(3)) * 0.02 * (1 + rows)
        batch["rollout_log_probs"] = behaviour + noise * batch["loss_mask"]
        add_advantages(batch, algo_cfg("grpo"), make_kl_controller("fixed", 0.0))
        reported = on_policy_mismatch(actor.update(batch, step=1))
    finally:
        actor.shutdown()
    batch["old_log_probs"] = behaviour
    want = rollout_mismatch_metrics(batch)
    assert set(want) == {f"training/{k}" for k in KEYS}
    for key, value in want.items():
        assert reported[key] == pytest.approx(value, rel=1e-4, abs=1e-9), key
