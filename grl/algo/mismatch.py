"""How far the rollout engine's log-probs of the sampled tokens are from the trainer's.

Two families, because dashboards compare GRL with verl:
- `rollout_probs_diff_{mean,max,std}`: verl's metric (verl/utils/debug/metrics.py, calculate_debug_metrics),
  |p_engine - p_trainer| per token, probabilities, so at most 1; the std is torch.std's (n - 1 divisor).
- `rollout_logprob_diff_{mean,max,p99}`: |log p_engine - log p_trainer| per token, in nats. A gap on a
  rare token is visible here (log p -9 against -8 is 1 nat, but 7e-5 in probability), and the p99 is the
  tail without the single worst token, whose size grows with the number of tokens.
"""

from __future__ import annotations

import torch

PERCENTILE = 99
KEYS = (
    "rollout_probs_diff_mean",
    "rollout_probs_diff_max",
    "rollout_probs_diff_std",
    "rollout_logprob_diff_mean",
    "rollout_logprob_diff_max",
    "rollout_logprob_diff_p99",
)


def mismatch_stats(engine_log_probs: torch.Tensor, trainer_log_probs: torch.Tensor) -> dict[str, float]:
    """`KEYS` over the sampled tokens: two 1-D tensors holding the same tokens in the same order. Computed
    in float64; no token, no stats ({}). The p99 is the nearest-rank percentile: the smallest gap that at
    least 99% of the tokens are within."""
    engine, trainer = engine_log_probs.double().flatten(), trainer_log_probs.double().flatten()
    n = engine.numel()
    if n == 0:
        return {}
    probs = (engine.exp() - trainer.exp()).abs()
    logs = (engine - trainer).abs()
    rank = -(-PERCENTILE * n // 100)  # ceil(0.99 n) in integers: no float rounding moves it
    return {
        "rollout_probs_diff_mean": probs.mean().item(),
        "rollout_probs_diff_max": probs.max().item(),
        "rollout_probs_diff_std": probs.std().item() if n > 1 else 0.0,  # one token: no spread, not NaN
        "rollout_logprob_diff_mean": logs.mean().item(),
        "rollout_logprob_diff_max": logs.max().item(),
        "rollout_logprob_diff_p99": logs.kthvalue(rank).values.item(),
    }
