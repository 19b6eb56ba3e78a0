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
    kl_loss,
    kl_estimate,
    make_kl_controller,
)
from grl.algo.losses import (
    AGG_MODES,
    agg_loss,
    entropy_bonus,
    entropy_from_logits,
    log_probs_from_logits,
    policy_loss,
    value_loss,
)
from grl.algo.masked import finite_rows, masked_mean, masked_sum, masked_var, masked_whiten
