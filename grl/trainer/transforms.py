"""The training step's pure transforms between the rollout and the workers: episode scores shaped
and filtered into a token batch, advantages (with KL in the reward), and the non-finite drop.
No model, no Ray: plain functions of a Batch and the config."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from grl.algo import ESTIMATORS, apply_kl_penalty, compute_advantage, finite_episodes, finite_rows
from grl.rollout import Batch, Episode, build_batch, filter_groups, normalize_episode_scores, unpack
from grl.trainer.metrics import episode_token_counts, task_metrics


def shape_batch(episodes: list[Episode], r: DictConfig, pad_token_id: int) -> tuple[Batch, dict[str, float]]:
    """Normalise episode scores (`rollout.reward_normalization`), keep the groups
    with the most reward spread (`rollout_filter_ratio`), and lay the kept
    episodes out as a token batch."""
    normalized = r.reward_normalization.method != "identity"
    scores = normalize_episode_scores(episodes, r.reward_normalization.grouping, r.reward_normalization.method)
    kept, filter_metrics = filter_groups(episodes, r.rollout_filter_ratio, r.rollout_filter_type)
    kept_groups = {ep.group_id for ep in kept}  # whole groups are kept, in their order
    kept_scores = [score for ep, score in zip(episodes, scores) if ep.group_id in kept_groups]
    batch, build_metrics = build_batch(
        kept, use_turn_scores=r.use_turn_scores, max_episode_length=r.max_episode_length, packing=r.packing,
        pad_token_id=pad_token_id, scores=kept_scores if normalized else None)
    return batch, {**task_metrics(filter_metrics, "train"), **build_metrics}


def add_advantages(batch: Batch, algo: DictConfig, kl_ctrl) -> dict[str, float]:
    """KL-in-reward (if enabled, updating `kl_ctrl`), then the configured
    estimator: writes `token_rewards`, `advantages` and `returns` into the batch."""
    metrics = {}
    if algo.use_kl_in_reward:
        batch["token_rewards"], mean_kl = apply_kl_penalty(
            batch["token_rewards"], batch["old_log_probs"], batch["ref_log_probs"], batch["loss_mask"],
            kl_ctrl.value, algo.kl_penalty)
        metrics["actor/reward_kl_penalty"] = mean_kl.item()
        metrics["actor/reward_kl_penalty_coeff"] = kl_ctrl.value
    view = EpisodeView(batch)
    if algo.use_kl_in_reward:
        kl_ctrl.update(mean_kl.item(), n_steps=len(view.group_ids))  # episodes, not packed rows
    advantages, returns = compute_advantage(
        algo.adv_estimator, token_rewards=view.rows(batch["token_rewards"]), loss_mask=view.rows(batch["loss_mask"]),
        values=view.rows(batch["values"]) if "values" in batch else None, turn_ids=view.rows(batch["turn_ids"]),
        group_ids=view.group_ids, gamma=algo.gamma, lam=algo.lam, high_level_gamma=algo.high_level_gamma,
        turn_weight=algo.turn_advantage_weight, norm_adv_by_std=algo.norm_adv_by_std_in_grpo,
        turn_states=view.turn_states() if ESTIMATORS[algo.adv_estimator].needs_step_keys else None,
        gigpo_step_weight=algo.gigpo_step_weight)
    batch["advantages"], batch["returns"] = view.back(advantages), view.back(returns)
    return metrics


class EpisodeView:
    """Token tensors with one episode per row. A padded batch already is one; a
    packed batch is unpacked for the advantage and packed back, so that no
    advantage runs across two episodes that share a row."""

    def __init__(self, batch: Batch):
        self.seq_ids = batch.tensors.get("seq_ids")
        self.position_ids = batch["position_ids"]  # packed: each episode's tokens count from 0
        self.group_ids = self._episodes(batch.meta["group_id"])
        self.state_keys = self._episodes(batch.meta["state_keys"])

    def _episodes(self, meta: list) -> list:
        """A meta list with one entry per episode (a packed row lists its episodes)."""
        return meta if self.seq_ids is None else [x for row in meta for x in row]

    def turn_states(self) -> torch.Tensor:
        """`[episodes, turns]` dense ids of the state keys (-1 past an episode's last turn)."""
        ids: dict = {}
        width = max((len(keys) for keys in self.state_keys), default=0)
        return torch.tensor([[ids.setdefault(k, len(ids)) for k in keys] + [-1] * (width - len(keys)) for keys in self.state_keys],
                            dtype=torch.long).view(len(self.state_keys), width)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.seq_ids is None else unpack(x, self.seq_ids)

    def back(self, x: torch.Tensor) -> torch.Tensor:
        if self.seq_ids is None:
            return x
        out = x.new_zeros(self.seq_ids.shape)
        real = self.seq_ids >= 0
        out[real] = x[self.seq_ids[real], self.position_ids[real]]
        return out


# What the updates read on a trained token: an episode with NaN/inf in any of them is trained on by
# neither the actor nor the critic. The workers trust the batch they get, so this is the one drop.
UPDATE_INPUTS = ("token_rewards", "advantages", "returns", "old_log_probs", "ref_log_probs", "values")


def drop_nonfinite_rows(batch: Batch) -> tuple[Batch, int]:
    """Drop the episodes with NaN/inf in an update input on a trained token: their rows in a padded
    batch, their loss tokens in a packed one (the episodes sharing the row stay).
    -> (batch, episodes dropped)."""
    tensors = [batch[key] for key in UPDATE_INPUTS if key in batch]
    seg = batch.tensors.get("segment_ids")
    if seg is None:
        keep = finite_rows(*tensors, loss_mask=batch["loss_mask"])
        dropped = int((~keep).sum())
        return (batch.select(keep) if dropped else batch), dropped
    ok = finite_episodes(*tensors, loss_mask=batch["loss_mask"], segment_ids=seg)
    before = len(episode_token_counts(batch, "loss_mask").nonzero())
    batch["loss_mask"] = torch.where(ok, batch["loss_mask"], torch.zeros_like(batch["loss_mask"]))
    return batch, before - len(episode_token_counts(batch, "loss_mask").nonzero())


