"""PPO losses over `[batch, tokens]` tensors: loss aggregation, clipped policy loss (clip-higher,
dual-clip), clipped value loss, entropy and log-probs from logits.

Positions outside `loss_mask` may hold inf/NaN (pad log-probs, unset advantages); they are
removed with `torch.where` before any arithmetic so neither the loss nor its gradient sees them.
"""

import torch

from grl.algo.masked import masked_mean
from grl.schema.workers import AGG_MODES  # what agg_loss computes: the loss_agg_mode keys' choices


def _clean(x: torch.Tensor, gen: torch.Tensor) -> torch.Tensor:
    return torch.where(gen, x, torch.zeros((), dtype=x.dtype, device=x.device))


def episode_masks(loss_mask: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """`[batch, tokens, episodes]` selector of each episode's loss tokens: a padded batch has one
    episode per row; a packed row has one per `segment_ids` value (1, 2, ...; 0 is padding)."""
    gen = loss_mask > 0
    if segment_ids is None:
        return gen.unsqueeze(-1)
    n = int(segment_ids.max().item()) if segment_ids.numel() else 0
    return gen.unsqueeze(-1) & (
        segment_ids.unsqueeze(-1) == torch.arange(1, n + 1, device=segment_ids.device)
    )


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: str = "token-mean",
    segment_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    token-mean            sum over all masked tokens / number of masked tokens
    seq-mean-token-sum    mean over episodes of each episode's masked sum
    seq-mean-token-mean   mean over episodes of each episode's masked mean
    An episode is a row, or a `segment_ids` span of a packed row, so both layouts give one loss.
    Episodes without masked tokens are left out of the seq-mean modes; an empty mask gives 0.
    """
    if mode not in AGG_MODES:  # a caller past the config's check would otherwise get seq-mean-token-mean
        raise ValueError(f"unknown loss_agg_mode {mode!r}; choose one of: {', '.join(AGG_MODES)}")
    gen = loss_mask > 0
    if mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    episodes = episode_masks(loss_mask, segment_ids).to(loss_mat.dtype)
    sums = torch.einsum("bt,bte->be", _clean(loss_mat, gen), episodes)
    counts = episodes.sum(1)
    per_episode = sums if mode == "seq-mean-token-sum" else sums / counts.clamp(min=1)
    return masked_mean(per_episode, counts)


def policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    loss_agg_mode: str = "token-mean",
    segment_ids: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped PPO surrogate -> (loss, metrics).

    is_weights (optional, per token): truncated importance-sampling weights for the gap between
    the engine that sampled and the trainer's old policy; each token's loss is multiplied by them.

    ratio = exp(log_probs - old_log_probs) (log-ratio clamped to +-20);
    loss_t = max(-A * ratio, -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high));
    dual-clip (Ye et al. 2020): where A < 0 the loss is further capped at -A * clip_ratio_c,
    so a huge ratio on a bad action cannot blow up the update (None turns it off).
    metrics (detached): pg_clipfrac (share of tokens where clipping bound the loss),
    pg_clipfrac_lower (share where the dual-clip cap bound it), ppo_kl (masked mean of
    old - new log-prob, the k1 estimate of KL(old || new)).
    """
    gen = loss_mask > 0
    log_ratio = _clean(log_probs - old_log_probs, gen).clamp(-20.0, 20.0)
    advantages = _clean(advantages, gen)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    metrics = {"pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).to(log_ratio.dtype), loss_mask)}
    capped = torch.zeros_like(gen)
    if clip_ratio_c is not None:
        loss_cap = -advantages * clip_ratio_c
        capped = (advantages < 0) & (loss_ppo > loss_cap)
        loss_ppo = torch.where(capped, loss_cap, loss_ppo)
    metrics["pg_clipfrac_lower"] = masked_mean(capped.to(log_ratio.dtype), loss_mask)
    metrics["ppo_kl"] = masked_mean(-log_ratio, loss_mask)
    if is_weights is not None:
        loss_ppo = loss_ppo * _clean(is_weights, gen)
    loss = agg_loss(loss_ppo, loss_mask, loss_agg_mode, segment_ids)
    return loss, {k: v.detach() for k, v in metrics.items()}


def value_loss(
    values_pred: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_mask: torch.Tensor,
    cliprange_value: float | None = 0.5,
    loss_agg_mode: str = "token-mean",
    segment_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss (as verl) -> (loss, metrics).

    v_clipped = old_values + clip(values_pred - old_values, -cliprange_value, cliprange_value);
    loss = 0.5 * agg(max((values_pred - R)^2, (v_clipped - R)^2)). metrics: vf_clipfrac (share
    of tokens where the clipped error was the larger one). cliprange_value None: plain MSE.
    """
    gen = loss_mask > 0
    values_pred, old_values, returns = _clean(values_pred, gen), _clean(old_values, gen), _clean(returns, gen)
    err_unclipped = (values_pred - returns) ** 2
    if cliprange_value is None:
        err, clipfrac = err_unclipped, torch.zeros((), dtype=values_pred.dtype, device=values_pred.device)
    else:
        v_clipped = old_values + (values_pred - old_values).clamp(-cliprange_value, cliprange_value)
        err_clipped = (v_clipped - returns) ** 2
        err = torch.maximum(err_unclipped, err_clipped)
        clipfrac = masked_mean((err_clipped > err_unclipped).to(values_pred.dtype), loss_mask)
    loss = 0.5 * agg_loss(err, loss_mask, loss_agg_mode, segment_ids)
    return loss, {"vf_clipfrac": clipfrac.detach()}


def _chunked_rows(fn, logits: torch.Tensor, *extra: torch.Tensor, chunk_size: int | None):
    """Apply `fn` row-chunk by row-chunk over the flattened leading dims of `logits`."""
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    flat_extra = [e.reshape(-1) for e in extra]
    step = flat.shape[0] if not chunk_size else chunk_size
    parts = [
        fn(flat[i : i + step], *(e[i : i + step] for e in flat_extra))
        for i in range(0, flat.shape[0], max(step, 1))
    ]
    out = torch.cat(parts) if parts else flat.new_zeros(0)
    return out.reshape(lead)


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    # bf16 logsumexp is too coarse for PPO ratios; chunking keeps the fp32 copy small
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    # H = logsumexp(z) - sum softmax(z) * z: no log(0) for tokens with zero probability. Tokens
    # masked out (z = -inf, probability 0) add nothing; a finite stand-in keeps 0 * inf out.
    logits = _upcast(logits)
    finite = torch.where(
        torch.isfinite(logits), logits, torch.zeros((), dtype=logits.dtype, device=logits.device)
    )
    return torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * finite).sum(-1)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy of the categorical over the last dim: `[..., vocab] -> [...]` (fp32 for half inputs).
    `chunk_size` rows at a time bounds the softmax temporaries for big vocabularies."""
    return _chunked_rows(_entropy, logits, chunk_size=chunk_size)


def _token_log_prob(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = _upcast(logits)
    return logits.gather(-1, labels[:, None]).squeeze(-1) - torch.logsumexp(logits, -1)


def log_probs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_size: int | None = None
) -> torch.Tensor:
    """log softmax(logits)[label] for each position: `[..., vocab], [...] -> [...]` (fp32 for half inputs)."""
    return _chunked_rows(_token_log_prob, logits, labels, chunk_size=chunk_size)


def entropy_bonus(
    entropy: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    segment_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Aggregated entropy; the actor loss subtracts entropy_coeff times this."""
    return agg_loss(entropy, loss_mask, loss_agg_mode, segment_ids)


def truncated_is_weights(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, cap: float
) -> torch.Tensor:
    """Truncated importance sampling (as verl's and SkyRL's TIS): min(pi_old / pi_rollout, cap) per
    token, a constant (no gradient) correcting for the engine sampling from a slightly different policy."""
    return torch.exp((old_log_probs - rollout_log_probs).clamp(max=20.0)).clamp(max=cap).detach()
