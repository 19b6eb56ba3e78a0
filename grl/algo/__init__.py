"""Advantage estimators, PPO losses and KL pieces: pure tensor functions (torch only).

The names below load their module, and torch, on first use: the config reads the estimator
registry (grl.algo.estimators) without torch. A new estimator is a function with
`@register_estimator` (grl/algo/registry.py) and, for a new hyperparameter, its `algorithm` key.
"""

import importlib

_EXPORTS = {
    "grl.algo.estimators": ("BATCH_INPUTS", "ESTIMATORS", "Estimator", "register_estimator"),
    "grl.algo.dispatch": ("compute_advantage",),
    "grl.algo.advantages": (
        "TurnGAE",
        "compute_bi_level_gae",
        "compute_gae",
        "compute_turn_gae",
        "compute_weighted_gae",
        "turn_ids_from_mask",
    ),
    "grl.algo.group_advantages": (
        "compute_gigpo",
        "compute_grpo",
        "compute_rebn",
        "compute_reinforce_plus_plus",
        "compute_rloo",
        "group_index",
    ),
    "grl.algo.distill": ("compute_opd", "distill_metrics", "teacher_advantage"),
    "grl.algo.kl": (
        "KL_ESTIMATORS",
        "AdaptiveKLController",
        "FixedKLController",
        "apply_kl_penalty",
        "kl_estimate",
        "kl_loss",
        "make_kl_controller",
    ),
    "grl.algo.losses": (
        "AGG_MODES",
        "agg_loss",
        "entropy_bonus",
        "entropy_from_logits",
        "episode_masks",
        "log_probs_from_logits",
        "policy_loss",
        "truncated_is_weights",
        "value_loss",
    ),
    "grl.algo.masked": ("finite_rows", "masked_mean", "masked_sum", "masked_var", "masked_whiten"),
}

__all__ = sorted(name for names in _EXPORTS.values() for name in names)


def __getattr__(name: str):
    for module, names in _EXPORTS.items():
        if name in names:
            value = globals()[name] = getattr(importlib.import_module(module), name)
            return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
