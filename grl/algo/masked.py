"""Masked statistics over `[batch, tokens]` tensors, and the non-finite row guard.

Every function selects with `torch.where` rather than multiplying by the mask, because
padding may hold inf or NaN (a log-prob of a pad token, an unset value) and `0 * inf`
is NaN.
"""

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `x` where `mask` is nonzero, over `dim` (all elements when None)."""
    picked = torch.where(mask > 0, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return picked.sum() if dim is None else picked.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over masked elements; 0 where the mask selects nothing."""
    count = (mask > 0).sum() if dim is None else (mask > 0).sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `x` over all masked elements (Bessel-corrected when `unbiased` and n > 1)."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    n = (mask > 0).sum()
    if unbiased and n > 1:
        var = var * n / (n - 1)
    return var


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise `x` to unit variance over masked elements (and zero mean when `shift_mean`);
    0 outside the mask."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask > 0, whitened, torch.zeros((), dtype=x.dtype, device=x.device))


def finite_rows(*tensors: torch.Tensor, loss_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Bool `[batch]`: True for rows where every given tensor is finite.

    Tensors may be `[batch]` (episode scores) or `[batch, tokens]` (rewards, advantages,
    log-ratios). With `loss_mask`, token tensors are only checked on masked positions, since
    padding is allowed to hold anything. The caller drops the False rows and counts them.
    """
    if not tensors:
        raise ValueError("finite_rows needs at least one tensor")
    ok = torch.ones(tensors[0].shape[0], dtype=torch.bool, device=tensors[0].device)
    for x in tensors:
        good = torch.isfinite(x)
        if x.dim() == 2:
            if loss_mask is not None:
                good = good | (loss_mask <= 0)
            good = good.all(dim=1)
        elif x.dim() != 1:
            raise ValueError(
                f"finite_rows takes [batch] or [batch, tokens] tensors, got shape {tuple(x.shape)}"
            )
        ok = ok & good
    return ok
