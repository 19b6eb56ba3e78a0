"""`compute_advantage`: run a registered advantage estimator (grl/algo/estimators.py) by name.

Each built-in estimator's registered function adapts the common inputs to its `compute_*` function
in grl/algo/advantages.py.
"""

from collections.abc import Sequence
from typing import NamedTuple

import torch

from grl.algo import estimators
from grl.algo.advantages import (
    compute_bi_level_gae,
    compute_gae,
    compute_gigpo,
    compute_grpo,
    compute_rebn,
    compute_reinforce_plus_plus,
    compute_rloo,
    compute_weighted_gae,
    turn_ids_from_mask,
)
from grl.algo.masked import masked_whiten


class AdvantageInputs(NamedTuple):
    """What an estimator's function gets; `compute_advantage` fills in the defaults."""

    token_rewards: torch.Tensor
    loss_mask: torch.Tensor
    values: torch.Tensor | None
    turn_ids: torch.Tensor
    group_ids: torch.Tensor | Sequence | None
    episode_scores: torch.Tensor
    turn_states: torch.Tensor | None
    gamma: float
    lam: float
    high_level_gamma: float
    high_level_lam: float
    turn_weight: float
    norm_adv_by_std: bool
    eps: float
    gigpo_step_weight: float


def gae_estimator(x: AdvantageInputs):
    return compute_gae(x.token_rewards, x.values, x.loss_mask, x.gamma, x.lam)


def bi_level_gae_estimator(x: AdvantageInputs):
    return compute_bi_level_gae(
        x.token_rewards, x.values, x.loss_mask, x.turn_ids, x.gamma, x.lam, x.high_level_gamma, x.high_level_lam
    )


def weighted_gae_estimator(x: AdvantageInputs):
    return compute_weighted_gae(
        x.token_rewards, x.values, x.loss_mask, x.turn_ids, x.gamma, x.lam, x.high_level_gamma, x.turn_weight, x.high_level_lam
    )


def grpo_estimator(x: AdvantageInputs):
    return compute_grpo(x.episode_scores, x.loss_mask, x.group_ids, x.norm_adv_by_std, x.eps)


def rloo_estimator(x: AdvantageInputs):
    return compute_rloo(x.episode_scores, x.loss_mask, x.group_ids)


def reinforce_plus_plus_estimator(x: AdvantageInputs):
    return compute_reinforce_plus_plus(x.token_rewards, x.loss_mask, x.gamma)


def gigpo_estimator(x: AdvantageInputs):
    return compute_gigpo(
        x.token_rewards,
        x.loss_mask,
        x.turn_ids,
        x.turn_states,
        x.group_ids,
        x.gamma,
        x.gigpo_step_weight,
        x.episode_scores,
        x.norm_adv_by_std,
        x.eps,
    )


def rebn_estimator(x: AdvantageInputs):
    return compute_rebn(x.token_rewards, x.loss_mask, x.turn_ids, x.gamma)


def compute_advantage(
    estimator: str,
    *,
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    values: torch.Tensor | None = None,
    turn_ids: torch.Tensor | None = None,
    group_ids=None,
    episode_scores: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    high_level_gamma: float = 1.0,
    high_level_lam: float | None = None,
    turn_weight: float = 1.0,
    norm_adv_by_std: bool = True,
    whiten: bool = True,
    eps: float = 1e-6,
    turn_states: torch.Tensor | None = None,
    gigpo_step_weight: float = 1.0,
):
    """Run one registered estimator (grl/algo/estimators.py) by name -> (advantages, returns), both `[batch, tokens]`.

    `whiten` whitens the advantages of the estimators registered with `whiten` (gae, bi_level_gae,
    weighted_gae) over the mask, as verl and RAGEN do; returns stay raw. REINFORCE++ always
    whitens (it is part of the method); GRPO and RLOO are already group-normalised, ReBN batch-normalised.
    `episode_scores` default to each row's summed rewards on generated tokens; `turn_ids`
    default to one turn per run of generated tokens; `high_level_lam` to `lam`. GiGPO needs
    `turn_states` (`[batch, turns]` state ids) and is group-normalised too.
    """
    spec = estimators.get(estimator)
    for name, value, needed in (
        ("values", values, spec.needs_critic),
        ("group_ids", group_ids, spec.group_based),
        ("turn_states", turn_states, spec.needs_step_keys),
    ):
        if needed and value is None:
            raise ValueError(f"advantage estimator '{estimator}' needs '{name}'")
    if episode_scores is None:
        episode_scores = torch.where(loss_mask > 0, token_rewards, 0.0).sum(-1)
    advantages, returns = spec.load()(
        AdvantageInputs(
            token_rewards,
            loss_mask,
            values,
            turn_ids_from_mask(loss_mask) if turn_ids is None else turn_ids,
            group_ids,
            episode_scores,
            turn_states,
            gamma,
            lam,
            high_level_gamma,
            lam if high_level_lam is None else high_level_lam,
            turn_weight,
            norm_adv_by_std,
            eps,
            gigpo_step_weight,
        )
    )
    if whiten and spec.whiten:
        advantages = masked_whiten(advantages, loss_mask)
    return advantages, returns
