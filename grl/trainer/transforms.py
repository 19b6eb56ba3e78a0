"""The training step's pure transforms between the rollout and the workers: episode scores shaped
and filtered into a token batch, advantages (with KL in the reward), and the non-finite drop.
No model, no Ray: plain functions of a Batch and the config."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from grl.algo import (
    ESTIMATORS,
    apply_kl_penalty,
    compute_advantage,
    distill_metrics,
    finite_rows,
    teacher_advantage,
)
from grl.rollout import Batch, Episode, build_batch, filter_groups, normalize_episode_scores
from grl.rollout.blame import without_infra_failures
from grl.schema import Algorithm
from grl.trainer.metrics import task_metrics


def shape_batch(episodes: list[Episode], r: DictConfig, pad_token_id: int) -> tuple[Batch, dict[str, float]]:
    """Leave out the infrastructure's failures (grl/rollout/blame.py), normalise episode scores
    (`rollout.reward_normalization`), keep the groups with the most reward spread (`rollout_filter_ratio`),
    and lay the kept episodes out as a token batch."""
    episodes, infra_dropped = without_infra_failures(episodes)
    normalized = r.reward_normalization.method != "identity"
    scores = normalize_episode_scores(
        episodes, r.reward_normalization.grouping, r.reward_normalization.method
    )
    kept, filter_metrics = filter_groups(episodes, r.rollout_filter_ratio, r.rollout_filter_type)
    kept_groups = {ep.group_id for ep in kept}  # whole groups are kept, in their order
    kept_scores = [score for ep, score in zip(episodes, scores) if ep.group_id in kept_groups]
    batch, build_metrics = build_batch(
        kept,
        use_turn_scores=r.use_turn_scores,
        max_episode_length=r.max_episode_length,
        pad_token_id=pad_token_id,
        scores=kept_scores if normalized else None,
    )
    return batch, {
        **task_metrics(filter_metrics, "train"),
        **build_metrics,
        "training/dropped_infra_episodes": float(infra_dropped),
    }


def add_advantages(batch: Batch, algo: Algorithm, kl_ctrl, teacher_coef: float = 0.0) -> dict[str, float]:
    """KL-in-reward (if enabled, updating `kl_ctrl`), then the estimator `algo` (the typed `algorithm`
    section) names, plus `teacher_coef` times the teacher's per-token advantage where a teacher scored
    the batch (an estimator that reads the teacher, opd, is that term alone): writes `token_rewards`,
    `advantages` and `returns` into the batch."""
    metrics = {}
    if algo.use_kl_in_reward:
        batch["token_rewards"], mean_kl = apply_kl_penalty(
            batch["token_rewards"],
            batch["old_log_probs"],
            batch["ref_log_probs"],
            batch["loss_mask"],
            kl_ctrl.value,
            algo.kl_penalty,
        )
        metrics["actor/reward_kl_penalty"] = mean_kl.item()
        metrics["actor/reward_kl_penalty_coeff"] = kl_ctrl.value
        kl_ctrl.update(mean_kl.item(), n_steps=len(batch))
    inputs = {key: batch[key] for key in ("token_rewards", "loss_mask", "turn_ids", "values") if key in batch}
    inputs["group_ids"] = batch.meta["group_id"]
    estimator = ESTIMATORS[algo.adv_estimator]
    if estimator.needs_step_keys:  # only an estimator that reads them pays for the ids
        inputs["turn_states"] = turn_states(batch.meta["state_keys"])
    if "teacher_log_probs" in batch:
        inputs["teacher_log_probs"] = batch["teacher_log_probs"]
        inputs["student_log_probs"] = student_log_probs(batch)
    batch["advantages"], batch["returns"] = compute_advantage(inputs, algo)
    if "teacher_log_probs" in batch:
        if not estimator.needs_teacher:
            batch["advantages"] = batch["advantages"] + teacher_coef * teacher_advantage(
                inputs["teacher_log_probs"],
                inputs["student_log_probs"],
                batch["loss_mask"],
                algo.opd_divergence,
            )
        metrics.update(
            distill_metrics(
                inputs["teacher_log_probs"],
                inputs["student_log_probs"],
                batch["loss_mask"],
                batch["turn_ids"],
            )
        )
    return metrics


def student_log_probs(batch: Batch) -> torch.Tensor:
    """The sampling policy's log-probs of the sampled tokens: PPO's old ones where a pass scored them, else
    the engine's (the same policy: the step samples with the weights it trains, and every step logs how
    far the two are apart)."""
    return batch["old_log_probs"] if "old_log_probs" in batch else batch["rollout_log_probs"]


def turn_states(state_keys: list[list]) -> torch.Tensor:
    """`[episodes, turns]` dense ids of the state keys (-1 past an episode's last turn)."""
    ids: dict = {}
    width = max((len(keys) for keys in state_keys), default=0)
    return torch.tensor(
        [[ids.setdefault(k, len(ids)) for k in keys] + [-1] * (width - len(keys)) for keys in state_keys],
        dtype=torch.long,
    ).view(len(state_keys), width)


def drop_stale_episodes(
    episodes: list[Episode], trained_version: int, max_staleness: int
) -> tuple[list[Episode], int]:
    """The episodes at most `max_staleness` policy versions older than the weights the update
    trains (`trained_version`), and how many older ones were left out."""
    kept = [ep for ep in episodes if trained_version - ep.policy_version <= max_staleness]
    return kept, len(episodes) - len(kept)


def staleness_metrics(episodes: list[Episode], trained_version: int) -> dict[str, float]:
    """verl's `async/staleness_*`: how many versions behind the trained weights the episodes were sampled."""
    lags = [trained_version - ep.policy_version for ep in episodes] or [0]
    return {"async/staleness_mean": sum(lags) / len(lags), "async/staleness_max": float(max(lags))}


# What the updates read on a trained token: an episode with NaN/inf in any of them is trained on by
# neither the actor nor the critic. The workers trust the batch they get, so this is the one drop.
UPDATE_INPUTS = (
    "token_rewards",
    "advantages",
    "returns",
    "old_log_probs",
    "ref_log_probs",
    "teacher_log_probs",
    "values",
)


def drop_nonfinite_rows(batch: Batch) -> tuple[Batch, int]:
    """Drop the episodes (rows) with NaN/inf in an update input on a trained token.
    -> (batch, episodes dropped)."""
    keep = finite_rows(*[batch[key] for key in UPDATE_INPUTS if key in batch], loss_mask=batch["loss_mask"])
    dropped = int((~keep).sum())
    return (batch.select(keep) if dropped else batch), dropped
