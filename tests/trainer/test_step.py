"""The pure phases of a training step: shape, advantage, non-finite rows."""

import random
from dataclasses import replace

import pytest
import torch
from omegaconf import OmegaConf

from grl.algo import make_kl_controller
from grl.rollout.types import Batch, Episode, Turn
from grl.run_plan import RunPlan
from grl.trainer.transforms import add_advantages, drop_nonfinite_rows, shape_batch
from grl.trainer.metrics import batch_metrics, reward_metrics, task_metrics


def episodes(num_groups=3, group_size=4, seed=0, shared_prompts=False):
    """`shared_prompts`: a group's episodes begin with the same prompt, as a group's do in a run."""
    rng = random.Random(seed)
    out = []
    for g in range(num_groups):
        first = [rng.randrange(1, 50) for _ in range(rng.randint(2, 6))] if shared_prompts else None
        for m in range(group_size):
            turns = [
                Turn(
                    prompt_ids=list(first)
                    if shared_prompts and k == 0
                    else [rng.randrange(1, 50) for _ in range(rng.randint(2, 6))],
                    response_ids=[rng.randrange(1, 50) for _ in range(rng.randint(1, 5))],
                    response_log_probs=None,
                    reward=rng.choice([0.0, 1.0, -0.1]),
                    state_key=f"s{(k + m) % 2}",
                )
                for k in range(rng.randint(1, 3))
            ]
            out.append(
                Episode(
                    task="t",
                    group_id=g,
                    seed=100 + g,
                    turns=turns,
                    score=sum(t.reward for t in turns),
                    metrics={"success": float(rng.random() < 0.5)},
                    member=m,
                )
            )
    return out


def rollout_cfg(**over):
    cfg = {
        "use_turn_scores": False,
        "max_episode_length": 4096,
        "rollout_filter_ratio": 1.0,
        "rollout_filter_type": "std",
        "reward_normalization": {"grouping": "state", "method": "identity"},
    }
    cfg.update(over)
    return OmegaConf.create(cfg)


def algo_cfg(estimator, **over):
    cfg = {
        "adv_estimator": estimator,
        "gamma": 1.0,
        "lam": 0.95,
        "high_level_gamma": 0.95,
        "turn_advantage_weight": 1.0,
        "gigpo_step_weight": 1.0,
        "norm_adv_by_std_in_grpo": True,
        "kl_penalty": "kl",
        "use_kl_in_reward": False,
        "opd_divergence": "reverse",
    }
    cfg.update(over)
    return OmegaConf.create(cfg)


def score(batch, seed=1):
    """Stand-in worker outputs: fixed pseudo-random values/log-probs per token id and position."""
    gen = torch.Generator().manual_seed(seed)
    ids = batch["input_ids"].float()
    batch["values"] = torch.sin(ids * 0.37 + batch["position_ids"]) * batch["attention_mask"]
    batch["old_log_probs"] = -torch.rand(ids.shape, generator=gen) * batch["loss_mask"]
    batch["ref_log_probs"] = batch["old_log_probs"] - 0.1 * batch["loss_mask"]


def recording(group, sent):
    """`group.call_sharded` that notes, per call, whether the ranks were sent packed rows."""
    real = group.call_sharded

    def call(method, shards, *args):
        parts = [part for rank in shards for part in rank] if method == "update" else shards
        sent.append((method, "segment_ids" in parts[0], any("parent_ids" in part for part in parts)))
        return real(method, shards, *args)

    return call


@pytest.mark.slow
def test_packing_at_the_workers_scores_and_trains_as_padded_rows(tmp_path, monkeypatch, ray_runtime):
    """The trainer's batch is one episode per row either way; with rollout.packing the groups send
    the ranks packed rows, each group's prompt held once (rollout.share_prompts), and hand back the
    same log-probs, values and updates."""
    from grl.config import compose
    from grl.workers import ActorRolloutRefGroup, CriticGroup

    cfg = compose(
        [
            "model_path=tiny",
            "n_gpus_per_node=2",
            "nnodes=1",
            "ppo_mini_batch_size=6",
            "micro_batch_size_per_gpu=2",
            "trainer.device=cpu",
            "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.actor.logits_chunk_size=5",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "rollout.max_episode_length=40",
            "actor_rollout_ref.actor.shuffle=false",
        ]
    )
    actor = critic = None  # unshuffled, the groups' mini-batches are the same rows packed or padded
    try:
        actor, critic = (
            ActorRolloutRefGroup.from_config(cfg, RunPlan.from_config(cfg)),
            CriticGroup.from_config(cfg, RunPlan.from_config(cfg)),
        )
        sent = []
        for group in (actor, critic):
            monkeypatch.setattr(group, "call_sharded", recording(group, sent))
            group.save_checkpoint(tmp_path / group.role)
        results = []
        for packing in (False, True):
            for group in (actor, critic):
                group.plan = replace(group.plan, packing_capacity=40 if packing else None)
            batch, _ = shape_batch(
                episodes(shared_prompts=True), rollout_cfg(max_episode_length=40), pad_token_id=0
            )
            batch["old_log_probs"], batch["entropy"] = actor.compute_log_probs(batch)
            batch["ref_log_probs"] = actor.compute_ref_log_probs(batch)
            batch["values"] = critic.compute_values(batch)
            add_advantages(batch, algo_cfg("gae"), make_kl_controller("fixed", 0.0))
            metrics = {**critic.update(batch, step=1), **actor.update(batch, step=1)}
            after = {"log_probs": actor.compute_log_probs(batch)[0], "values": critic.compute_values(batch)}
            results.append((batch, metrics, after))
            for group in (actor, critic):
                group.load_checkpoint(tmp_path / group.role)
        assert {packed for _, packed, _ in sent} == {False, True}
        assert all(packed == shared == (i >= len(sent) // 2) for i, (_, packed, shared) in enumerate(sent))
        (padded, padded_m, padded_after), (packed, packed_m, packed_after) = results
        assert len(packed) == len(padded) == 12 and packed.meta == padded.meta
        for key in ("old_log_probs", "entropy", "ref_log_probs", "values", "advantages", "returns"):
            torch.testing.assert_close(packed[key], padded[key], atol=1e-5, rtol=0, msg=key)
        assert padded["old_log_probs"].abs().max() > 0
        for key in (
            "actor/pg_loss",
            "actor/entropy",
            "actor/kl_loss",
            "actor/grad_norm",
            "critic/vf_loss",
            "critic/grad_norm",
        ):
            assert packed_m[key] == pytest.approx(padded_m[key], abs=1e-5), key
        for key, value in padded_after.items():  # the same steps: the same weights after them
            torch.testing.assert_close(packed_after[key], value, atol=1e-5, rtol=0)
            assert (value - padded[key if key == "values" else "old_log_probs"]).abs().max() > 1e-4, key
    finally:
        for group in (actor, critic):
            if group is not None:
                group.shutdown()


def two_rank_one_mini_batch_config():
    """Two CPU ranks on the tiny model whose 12 episodes are one mini-batch: the update is on-policy."""
    from grl.config import compose

    return compose(
        [
            "model_path=tiny",
            "n_gpus_per_node=2",
            "ppo_mini_batch_size=12",
            "micro_batch_size_per_gpu=2",
            "trainer.device=cpu",
            "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.actor.logits_chunk_size=5",
        ]
    )


@pytest.mark.slow
def test_an_on_policy_update_needs_no_old_log_prob_pass(tmp_path, ray_runtime):
    """One epoch over one mini-batch: the update's own log-probs are the behaviour policy's, so the
    pass that computes them beforehand changes nothing (TRL's num_iterations=1); without it the
    update reports the engine/trainer mismatch that the pass would have."""
    from grl.rollout.types import Batch
    from grl.workers import ActorRolloutRefGroup

    cfg = two_rank_one_mini_batch_config()
    assert not RunPlan.from_config(cfg).old_log_prob_pass(12)
    assert RunPlan.from_config(cfg).old_log_prob_pass(13)  # a second mini-batch trains on a moved policy
    actor = None
    try:
        actor = ActorRolloutRefGroup.from_config(cfg, RunPlan.from_config(cfg))
        actor.save_checkpoint(tmp_path)
        batch, _ = shape_batch(episodes(), rollout_cfg(), pad_token_id=0)
        behaviour, _ = actor.compute_log_probs(batch)
        batch["rollout_log_probs"] = behaviour - 0.01 * batch["loss_mask"]  # an engine a little off
        add_advantages(batch, algo_cfg("grpo"), make_kl_controller("fixed", 0.0))
        with_pass = actor.update(Batch({**batch.tensors, "old_log_probs": behaviour}, batch.meta), step=1)
        after = actor.compute_log_probs(batch)[0]
        actor.load_checkpoint(tmp_path)
        without = actor.update(batch, step=1)
        for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/ppo_kl", "actor/pg_clipfrac"):
            assert without[key] == pytest.approx(with_pass[key], abs=1e-6), key
        assert with_pass["actor/grad_norm"] > 0
        torch.testing.assert_close(actor.compute_log_probs(batch)[0], after, atol=1e-6, rtol=0)
        assert (after - behaviour).abs().max() > 1e-4  # the step moved the policy
        assert "actor/rollout_logprob_diff_max" not in with_pass
        assert without["actor/rollout_logprob_diff_mean"] == pytest.approx(0.01, abs=1e-5)
        assert without["actor/rollout_logprob_diff_max"] == pytest.approx(0.01, abs=1e-5)
    finally:
        if actor is not None:
            actor.shutdown()


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
    batch, metrics = shape_batch(
        eps,
        rollout_cfg(
            rollout_filter_ratio=0.5, reward_normalization={"grouping": "state", "method": "mean_std"}
        ),
        pad_token_id=0,
    )
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
        sum(len(t.response_ids) for e in eps for t in e.turns) / len(eps)
    )
    assert 0 <= m["perf/padding_ratio"] < 1
    assert task_metrics({"t/success": 0.5, "rollout/env_errors": 1.0}, "val-env") == {
        "val-env/t/success": 0.5,
        "val-rollout/env_errors": 1.0,
    }
    assert task_metrics({"t/success": 0.5, "rollout/env_errors": 1.0}, "train") == {
        "train/t/success": 0.5,
        "rollout/env_errors": 1.0,
    }


def test_each_turns_advantage_is_the_mean_over_the_tokens_it_wrote():
    """Against a loop over every token: turns are 1-based, only written tokens (loss_mask) count, and a
    turn no episode reached has no metric."""
    eps = episodes()
    batch, _ = shape_batch(eps, rollout_cfg(), pad_token_id=0)
    batch["advantages"] = torch.randn(batch["loss_mask"].shape, generator=torch.Generator().manual_seed(0))
    sums, counts = {}, {}
    for row in range(len(batch)):
        for t in range(batch["loss_mask"].shape[1]):
            if batch["loss_mask"][row, t] > 0:
                turn = int(batch["turn_ids"][row, t]) + 1
                sums[turn] = sums.get(turn, 0.0) + float(batch["advantages"][row, t])
                counts[turn] = counts.get(turn, 0) + 1
    logged = {k: v for k, v in batch_metrics(batch).items() if k.startswith("critic/advantages/turn_")}
    assert len(counts) >= 2
    assert logged == pytest.approx({f"critic/advantages/turn_{k}": sums[k] / counts[k] for k in counts})


def test_finish_report_names_first_best_and_last_validation(tmp_path):
    from grl.trainer.report import finish_report

    text = finish_report(
        {"gsm8k": [(0, 0.25), (2, 0.5), (4, 0.5), (6, 0.375)]},
        tmp_path / "global_step_6",
        tmp_path / "hf_actor",
    )
    assert text.splitlines()[0] == (
        "finished gsm8k: validation success 0.250 at step 0, best 0.500 at step 2, last 0.375 at step 6"
    )
    assert str(tmp_path / "hf_actor") in text and str(tmp_path / "global_step_6") in text
    assert "no validation ran" in finish_report({}, None, None)
    assert (
        "(the actor of step 2, the best validation; the checkpoint holds the last step's)"
        in finish_report({"gsm8k": [(2, 0.5)]}, None, tmp_path / "hf_actor", export_step=2)
    )


def test_best_validation_is_the_highest_mean_success_after_training_a_tie_to_the_later_step():
    from grl.trainer.validation import BestValidation

    history = [
        (0, {"a": 0.875, "b": 0.875}),
        (1, {"a": 0.5, "b": 0.25}),
        (2, {"a": 0.25, "b": 0.5}),
        (3, {"a": 0.375, "b": 0.375}),
        (4, {"a": 0.0, "b": 0.125}),
        (5, {"a": 0.625}),
    ]
    best, chosen = BestValidation(), []
    for step, success in history:
        if best.offer(
            step,
            {f"val-env/{t}/success": v for t, v in success.items()} | {"val-env/a/reward": 9.0},
            ["a", "b"],
        ):
            chosen.append(step)
    # reference: the running maximum of the mean over the tasks present, steps >= 1, ties to the later step
    means = {step: sum(s.values()) / len(s) for step, s in history if step >= 1}
    running = [s for s in means if all(means[s] >= means[t] for t in means if t < s)]
    assert chosen == running == [1, 2, 3, 5] and (best.step, best.score) == (5, 0.625)


def test_a_teacher_s_term_is_added_to_any_estimator_s_advantages_with_its_coefficient():
    """GRPO plus the teacher: the group advantages plus coef x (log p_teacher - log p_student); opd alone is
    that term, unweighted; the student's log-probs are the engine's where no pass scored old ones."""
    batch, _ = shape_batch(episodes(), rollout_cfg(), pad_token_id=0)
    score(batch)
    gen = torch.Generator().manual_seed(5)
    batch["teacher_log_probs"] = -torch.rand(batch["loss_mask"].shape, generator=gen) * batch["loss_mask"]
    batch["rollout_log_probs"] = batch["old_log_probs"] + 0.01 * batch["loss_mask"]
    mask = batch["loss_mask"]
    term = (batch["teacher_log_probs"] - batch["old_log_probs"]) * mask

    plain = Batch(dict(batch.tensors), batch.meta)
    del plain.tensors["teacher_log_probs"]
    add_advantages(plain, algo_cfg("grpo"), make_kl_controller("fixed", 0.0))
    metrics = add_advantages(batch, algo_cfg("grpo"), make_kl_controller("fixed", 0.0), teacher_coef=0.5)
    torch.testing.assert_close(batch["advantages"], plain["advantages"] + 0.5 * term)
    assert metrics["teacher/reverse_kl_per_token"] == pytest.approx(float(-term.sum() / mask.sum()), abs=1e-6)

    alone = Batch(dict(batch.tensors), batch.meta)
    add_advantages(alone, algo_cfg("opd"), make_kl_controller("fixed", 0.0), teacher_coef=0.5)
    torch.testing.assert_close(alone["advantages"], term)
    del alone.tensors["old_log_probs"]  # an on-policy step skipped their pass: the engine's stand in
    add_advantages(alone, algo_cfg("opd"), make_kl_controller("fixed", 0.0))
    torch.testing.assert_close(
        alone["advantages"], (batch["teacher_log_probs"] - batch["rollout_log_probs"]) * mask
    )
