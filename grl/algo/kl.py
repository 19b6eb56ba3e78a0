"""KL estimators between the policy and the reference model, KL-in-reward, and KL controllers.

Estimators act per token on log-probs of the sampled token (Schulman, "Approximating KL
divergence"): with log_ratio = log p - log p_ref,
  kl  (k1)          log_ratio
  abs               |log_ratio|
  mse (k2)          0.5 * log_ratio**2
  low_var_kl (k3)   exp(-log_ratio) + log_ratio - 1, clamped as verl does
"""

import torch

from grl.algo.losses import agg_loss
from grl.algo.masked import masked_mean
from grl.schema.workers import KL_ESTIMATORS  # the kl_loss_type and kl_penalty keys' choices


def kl_estimate(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of `kind` (aliases: k1 = kl, k2 = mse, k3 = low_var_kl)."""
    kind = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}.get(kind, kind)
    log_ratio = log_probs - ref_log_probs
    if kind == "kl":
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind == "mse":
        return 0.5 * log_ratio.square()
    if kind == "low_var_kl":
        # clamps keep exp() finite when the two models disagree wildly on a token
        ref_over_pi = (-log_ratio).clamp(-20, 20)
        return (ref_over_pi.exp() - ref_over_pi - 1).clamp(-10, 10)
    raise ValueError(
        f"unknown KL estimator '{kind}'; choose one of: {', '.join(KL_ESTIMATORS)} (or k1, k2, k3)"
    )


def apply_kl_penalty(
    token_rewards: torch.Tensor,
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    kl_coef: float,
    kl_penalty: str = "kl",
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL-in-reward -> (new_rewards, mean_kl).

    new_rewards = token_rewards - kl_coef * kl on every generated token, kl being the estimator
    named by `kl_penalty` (unchanged elsewhere).
    mean_kl is the batch mean of each row's masked-mean KL (rows without generated tokens are
    left out); feed it to the KL controller's `update`.
    """
    gen = loss_mask > 0
    zero = torch.zeros((), dtype=token_rewards.dtype, device=token_rewards.device)
    kld = torch.where(gen, kl_estimate(log_probs, ref_log_probs, kl_penalty), zero)
    new_rewards = token_rewards - kl_coef * kld
    has_tokens = gen.any(-1)
    mean_kl = masked_mean(masked_mean(kld, loss_mask, dim=-1), has_tokens)
    return new_rewards, mean_kl.detach()


def kl_loss(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    kind: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
    segment_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """KL term added to the actor loss (GRPO-style) aggregated over the mask."""
    return agg_loss(kl_estimate(log_probs, ref_log_probs, kind), loss_mask, loss_agg_mode, segment_ids)


class FixedKLController:
    """Constant KL coefficient."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019): move the coefficient so that the measured
    KL approaches `target_kl`, by at most 20% of the error per `horizon` samples:
    value *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        self.value, self.target, self.horizon = init_kl_coef, target_kl, horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1, -0.2), 0.2)
        self.value *= 1 + error * n_steps / self.horizon


def make_kl_controller(kind: str, kl_coef: float, target_kl: float | None = None, horizon: int | None = None):
    """The `algorithm.kl_ctrl` controller (`fixed` or `adaptive`, values the config schema checked)."""
    if kind == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    return FixedKLController(kl_coef)
