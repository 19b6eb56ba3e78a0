"""Advantage estimators, PPO losses and KL pieces: pure tensor functions (torch only).

Importing this package imports torch; only the heavy layers (workers, trainer) import it.
"""

from grl.algo.advantages import (
    ESTIMATORS,
    TurnGAE,
    compute_advantage,
    compute_bi_level_gae,
    compute_gae,
    compute_grpo,
    compute_reinforce_plus_plus,
    compute_rloo,
    compute_turn_gae,
    compute_weighted_gae,
    group_index,
    turn_ids_from_mask,
)
from grl.algo.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_estimate,
    kl_loss,
    make_kl_controller,
)
from grl.algo.losses import (
    AGG_MODES,
    agg_loss,
    entropy_bonus,
    entropy_from_logits,
    episode_masks,
    log_probs_from_logits,
    policy_loss,
    truncated_is_weights,
    value_loss,
)
from grl.algo.masked import (
    finite_episodes,
    finite_rows,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

__all__ = [
    "AGG_MODES",
    "ESTIMATORS",
    "KL_ESTIMATORS",
    "AdaptiveKLController",
    "FixedKLController",
    "TurnGAE",
    "agg_loss",
    "apply_kl_penalty",
    "compute_advantage",
    "compute_bi_level_gae",
    "compute_gae",
    "compute_grpo",
    "compute_reinforce_plus_plus",
    "compute_rloo",
    "compute_turn_gae",
    "compute_weighted_gae",
    "entropy_bonus",
    "entropy_from_logits",
    "episode_masks",
    "finite_episodes",
    "finite_rows",
    "group_index",
    "kl_estimate",
    "kl_loss",
    "log_probs_from_logits",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "policy_loss",
    "truncated_is_weights",
    "turn_ids_from_mask",
    "value_loss",
]
