"""Rollouts ahead of the update (rollout.max_staleness) with the engine in a worker of its own.

- the engine apart at max_staleness=0 trains exactly as the engine in the actor's rank;
- at max_staleness=1 every batch is at most one version old, the correction's statistics are
  reported, and validation in the middle of the run gets the engine holding the newest weights;
- without the old-log-prob pass, PPO's old log-probs are the engine's;
- a weight transfer that hangs ends the run with one line.
"""

import time

import pytest
import torch

from grl.config import load_config
from grl.rollout.types import Episode, Turn
from grl.trainer import RunAborted
from grl.trainer.agent_trainer import AgentTrainer
from grl.trainer.transforms import drop_stale_episodes, staleness_metrics
from grl.workers.group import TEARDOWN_TIMEOUT_S

DETERMINISTIC = (
    "reward/mean",
    "reward/std",
    "response_length/mean",
    "actor/pg_loss",
    "actor/entropy",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/grad_norm",
    "training/rollout_logprob_diff_max",
    "val-env/tetrisAgent_gap_dim_4/success",
)


def config(tmp_path, name, **over):
    overrides = {
        "preset": "cpu",
        "model_path": "tiny",
        "max_response_length": 8,
        "rollout.agent_group_num": "[2]",
        "rollout.agent_group_size": "[2]",
        "rollout.rollout_filter_ratio": 1.0,
        "rollout.validation_agent_group_num": "[2]",
        "ppo_mini_batch_size": 2,
        "micro_batch_size_per_gpu": 2,
        "total_training_steps": 3,
        "test_freq": 2,
        "save_freq": -1,
        "trainer.logger": "[jsonl]",
        "trainer.export_hf": False,
        "trainer.validation_controls": "[]",
        "actor_rollout_ref.actor.optim.lr": 1e-3,
        # the corrected path; the bypass test turns it off
        "actor_rollout_ref.actor.recompute_old_log_probs": True,
        "trainer.run_dir": str(tmp_path / name / "run"),
        "trainer.default_local_dir": str(tmp_path / name / "ckpt"),
    }
    overrides.update(over)
    return load_config([f"{k}={v}" for k, v in overrides.items()])


def recorded_run(cfg, before_fit=None) -> tuple[dict, dict]:
    """step -> metrics, step -> the trained batch's token ids."""
    metrics, batches = {}, {}

    def record(trainer, step, step_metrics, batch):
        metrics[step] = dict(step_metrics)
        batches[step] = None if batch is None else batch["input_ids"].tolist()

    trainer = AgentTrainer.from_config(cfg, hooks=[record])
    if before_fit is not None:
        before_fit(trainer)
    trainer.fit()
    return metrics, batches


@pytest.mark.slow
def test_the_engine_apart_at_staleness_0_trains_as_the_engine_in_the_rank(tmp_path, ray_runtime):
    together, together_batches = recorded_run(config(tmp_path, "together"))
    apart, apart_batches = recorded_run(
        config(tmp_path, "apart", **{"actor_rollout_ref.hybrid_engine": False})
    )
    assert apart_batches == together_batches and len(together_batches) == 3
    for step in (1, 2, 3):
        compared = [k for k in DETERMINISTIC if k in together[step]]
        assert len(compared) >= 7, compared
        for key in compared:
            assert apart[step][key] == pytest.approx(together[step][key], rel=1e-5, abs=1e-6), (step, key)
        assert apart[step]["async/staleness_max"] == 0 and apart[step]["training/dropped_stale_episodes"] == 0


@pytest.mark.slow
def test_one_step_off_trains_on_episodes_at_most_one_version_old(tmp_path, ray_runtime):
    cfg = config(
        tmp_path,
        "ahead",
        total_training_steps=4,
        **{
            "actor_rollout_ref.hybrid_engine": False,
            "rollout.max_staleness": 1,
            "actor_rollout_ref.actor.tis_imp_ratio_cap": 2.0,
        },
    )
    rollouts, updates = {}, {}  # step -> (start, end) on the driver's clock
    UPDATE_AT_LEAST_S = 1.0

    def clock_rollouts_and_updates(trainer):
        rollout, update = trainer._rollout, trainer.actor.update

        def timed_rollout(step, **kwargs):
            start = time.monotonic()
            result = rollout(step, **kwargs)
            rollouts[step] = (start, time.monotonic())
            return result

        def timed_update(batch, step):
            start = time.monotonic()
            result = update(batch, step)
            # The tiny model's update (0.2 s) is shorter than the rollout worker's load of the previous
            # version
            # with its weights check; a real update outlasts it, and the order below is about that case.
            time.sleep(UPDATE_AT_LEAST_S)
            updates[step] = (start, time.monotonic())
            return result

        trainer._rollout, trainer.actor.update = timed_rollout, timed_update

    metrics, batches = recorded_run(cfg, before_fit=clock_rollouts_and_updates)
    # Ahead: each step's rollout starts before the previous step's update ends (an order of events, not a
    # speed): at max_staleness=0 it would wait for those weights.
    assert sorted(rollouts) == sorted(updates) == [1, 2, 3, 4]
    assert all(rollouts[step][0] < updates[step - 1][1] for step in (2, 3, 4)), (rollouts, updates)
    # Steps 1 and 2 are both sampled by the initial weights; from then on each by the step before last.
    assert [metrics[s]["async/staleness_max"] for s in (1, 2, 3, 4)] == [0, 1, 1, 1]
    for step in (1, 2, 3, 4):
        m = metrics[step]
        assert m["training/dropped_stale_episodes"] == 0 and batches[step] is not None
        assert 0 < m["training/is_ratio_mean"] and m["training/is_ratio_max"] >= m["training/is_ratio_mean"]
        assert 0 <= m["training/is_ratio_clipped_frac"] <= 1
        # The trainer's wait for the rollout is a part of its step.
        assert 0 < m["timing_s/wait_prev_gen"] <= m["timing_s/step"] and m["timing_s/gen"] > 0
    # Step 1 is on-policy: only the engine/trainer numerics separate the two; later steps are a version apart.
    assert (
        metrics[1]["training/rollout_logprob_diff_max"]
        < 1e-2
        < metrics[3]["training/rollout_logprob_diff_max"]
    )
    assert (
        "val-env/tetrisAgent_gap_dim_4/success" in metrics[2]
        and "val-env/tetrisAgent_gap_dim_4/success" in metrics[4]
    )


@pytest.mark.slow
def test_one_step_off_without_the_old_pass_clips_around_the_engines_log_probs(tmp_path, ray_runtime):
    cfg = config(
        tmp_path,
        "bypass",
        test_freq=-1,
        ppo_mini_batch_size=4,  # one optimizer step a rollout: step 1's ratios are 1 up to numerics
        **{
            "actor_rollout_ref.hybrid_engine": False,
            "rollout.max_staleness": 1,
            "actor_rollout_ref.actor.recompute_old_log_probs": False,
        },
    )
    trained = {}

    def record(trainer, step, step_metrics, batch):
        trained[step] = (
            dict(step_metrics),
            batch["old_log_probs"].clone(),
            batch["rollout_log_probs"].clone(),
        )

    AgentTrainer.from_config(cfg, hooks=[record]).fit()
    assert [trained[s][0]["async/staleness_max"] for s in (1, 2, 3)] == [0, 1, 1]
    for metrics, old, engine in trained.values():
        assert "timing_s/old_log_prob" not in metrics and "training/is_ratio_mean" not in metrics
        assert torch.equal(old, engine)
        assert 0 <= metrics["actor/pg_clipfrac"] <= 1 and metrics["timing_s/gen"] > 0
    # The ratios are taken against the engine's log-probs: at step 1 the engine held the trained weights
    # (engine/trainer numerics only); from step 2 on it sampled with weights a step older.
    kl = {step: abs(trained[step][0]["actor/ppo_kl"]) for step in (1, 2, 3)}
    assert kl[1] < 1e-4 < min(kl[2], kl[3]), kl


@pytest.mark.slow
def test_a_weight_transfer_that_hangs_ends_the_run_with_one_line(tmp_path, ray_runtime):
    cfg = config(
        tmp_path,
        "stuck",
        **{
            "actor_rollout_ref.hybrid_engine": False,
            "rollout.max_staleness": 1,
            "rollout.weight_sync_timeout": 3,
            "actor_rollout_ref.actor.tis_imp_ratio_cap": 2.0,
            "test_freq": -1,
            "trainer.val_before_train": False,
        },
    )

    started = []

    def hang_on_load(trainer):
        def stall(worker):
            import time

            worker.engine.update_weights = lambda _weights: time.sleep(3600)

        trainer.actor.engine.execute(stall)
        started.append(time.monotonic())

    with pytest.raises(RunAborted) as info:
        recorded_run(cfg, before_fit=hang_on_load)
    message = str(info.value)
    assert "did not load the weights of policy version 1 within 3 s (rollout.weight_sync_timeout)" in message
    assert "\n" not in message
    # The stuck worker is killed without the teardown wait it could not answer: the run ends about the
    # sync timeout after the stall (3.8 s on a quiet machine). A run that waited the teardown too cannot end
    # before the sync timeout plus TEARDOWN_TIMEOUT_S (13.8 s before the fix), however fast the machine, so
    # that sum is the bound: load may slow the run towards it, never the old code below it.
    ended = time.monotonic() - started[0]
    assert ended < 3 + TEARDOWN_TIMEOUT_S, ended


def test_an_episode_older_than_max_staleness_is_never_trained_on():
    episodes = [
        Episode(
            task="t",
            group_id=0,
            seed=1,
            turns=[Turn([1], [2], None, 0.0)],
            score=0.0,
            policy_version=v,
            member=i,
        )
        for i, v in enumerate([5, 4, 3, 2])
    ]
    kept, dropped = drop_stale_episodes(episodes, trained_version=5, max_staleness=1)
    assert [ep.policy_version for ep in kept] == [5, 4] and dropped == 2
    assert drop_stale_episodes(episodes, 5, 0)[1] == 3
    assert staleness_metrics(episodes, 5) == {"async/staleness_mean": 1.5, "async/staleness_max": 3.0}
