"""Attention for the HF engine on CPU: grouped-query heads without copying the keys and values.

transformers' `sdpa` attention, given a mask (the engine always gives one: its rows are padded), repeats
each key/value head for every query head that shares it before calling PyTorch's kernel, because CUDA's
fast kernels take no mask with grouped heads. On CPU that copy is pure cost: SmolLM2-135M has 9 query
heads over 3 key/value heads, so every layer of every forward copies the whole KV cache (an episode's
thousand tokens, a batch of 64 rows) three times over, and then attends over the copy. PyTorch's CPU
kernel takes the mask and the grouped heads together (`enable_gqa`), with the same result.
bench/bench_hf_kernels.py measures it on the Sokoban preset's rollout.

`use_on(model)` switches a loaded model to it; everything it does not cover (no mask, no grouped heads,
an accelerator) goes to the stock `sdpa` function unchanged.
"""

from __future__ import annotations

import torch
from torch.nn import functional
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "grl_cpu_gqa_sdpa"


def cpu_gqa_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers' attention-function signature: `[B, heads, T, dim]` query, `[B, kv_heads, S, dim]`
    key and value -> (`[B, T, heads, dim]`, None)."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = (
        query.device.type != "cpu"
        or attention_mask is None
        or not grouped
        or kwargs.get("position_bias") is not None
        or kwargs.get("cache") is not None
        or kwargs.get("output_attentions", False)
    )
    if plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    out = functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, cpu_gqa_sdpa)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # the same boolean masks `sdpa` is given


def use_on(model: torch.nn.Module) -> None:
    """Run `model`'s attention through `cpu_gqa_sdpa` where it now runs transformers' `sdpa`."""
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(NAME)
