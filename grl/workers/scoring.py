"""Per-token scores from a causal LM without vocabulary-sized peaks.

`TokenScorer` wraps a Hugging Face model (causal LM or token classifier) and
returns, for every position t, the log-prob (and entropy) of token t given
tokens < t, or the value predicted from the state before t. Position 0, padding
and the first token of every packed episode get 0. In a row whose episodes share
a prompt (`parent_ids`), the token after the prompt is scored from its last token.

The backbone runs once; the head (`lm_head`, or the tied input embedding) is
then applied to `chunk_size` hidden states at a time, and in training with more
than one chunk each is recomputed in backward, so at most one chunk of
`[tokens, vocab]` logits is alive at once.

The policy's log-probs are those of the distribution the engine sampled from:
logits divided by the rollout temperature and, for tokens decoded under a
valid-action grammar, masked to their allowed set (grl/engines/constraint.py)
before the softmax; the entropy is that distribution's. The sets come compact
(grl/rollout/allowed_sets.py) and become a vocabulary mask one chunk at a time.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from grl.rollout.allowed_sets import set_starts, spans
from grl.rollout.batch import packed_attention_mask
from grl.workers.heads import Head, check_head


def additive_packed_mask(
    segment_ids: torch.Tensor, dtype: torch.dtype, parent_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """`grl.rollout.packed_attention_mask` in the additive `[B, 1, T, T]` form the
    attention kernels take. Padding queries see themselves, so no softmax row is
    empty (an empty row is NaN in sdpa)."""
    allowed = packed_attention_mask(segment_ids, parent_ids)
    allowed |= torch.eye(segment_ids.shape[1], dtype=torch.bool, device=segment_ids.device)
    return torch.zeros(allowed.shape, dtype=dtype, device=segment_ids.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min
    )


def predecessors(
    attention_mask: torch.Tensor, segment_ids: torch.Tensor | None, parent_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """`[B, T]` column of the token each position is scored from (-1: not scored): t - 1 when
    both are real tokens of one episode; for the first token after a shared prompt, the prompt's
    last token (`parent_ids`)."""
    valid = attention_mask.bool()
    T = valid.shape[1]
    columns = torch.arange(T, device=valid.device).expand_as(valid)
    keep = torch.zeros_like(valid)
    keep[:, 1:] = valid[:, 1:] & valid[:, :-1]
    if segment_ids is not None:
        same_episode = segment_ids[:, 1:] == segment_ids[:, :-1]
        keep[:, 1:] &= same_episode
    prev = torch.where(keep, columns - 1, -1)
    if parent_ids is not None:
        last = torch.full(
            (valid.shape[0], int(segment_ids.max()) + 1), -1, dtype=torch.long, device=valid.device
        )
        last = last.scatter_reduce(1, segment_ids, columns, "amax")
        starts = torch.ones_like(valid)
        starts[:, 1:] = ~same_episode
        after_prompt = valid & starts & (parent_ids > 0)
        prev = torch.where(after_prompt, last.gather(1, parent_ids), prev)
    return prev


class TokenScorer(nn.Module):
    """With `grl.workers.heads.POLICY`: forward -> (log_probs, entropy); with `VALUE`: forward -> values.
    All `[B, T]`, aligned as described in the module doc.

    The wrapper is the FSDP2 root, so the backbone's embedding and the head are
    gathered by the root's hooks before they are used here."""

    def __init__(self, model: nn.Module, head: Head, compute_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.model = model
        self.head = check_head(head)
        self.compute_dtype = compute_dtype  # dtype of the packed attention mask

    def forward(
        self,
        input_ids,
        attention_mask,
        position_ids,
        segment_ids=None,
        chunk_size: int = 1024,
        temperature: float = 1.0,
        constraint_size=None,
        constraint_ids=None,
        loss_mask=None,
        parent_ids=None,
    ):
        """`loss_mask` (policy only): score just those positions; the vocabulary head is the
        costliest part of a small model and a multi-turn episode samples few of its tokens.
        `parent_ids`: the shared prompts of a packed row (grl/workers/sharding.py).
        `constraint_size` `[B, T]`, `constraint_ids` `[N]`: the allowed sets, compact
        (grl/rollout/allowed_sets.py)."""
        backbone = self.model.base_model
        if segment_ids is not None:
            mask = additive_packed_mask(segment_ids, self.compute_dtype, parent_ids)
        else:
            mask = attention_mask
        hidden = backbone(
            input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        B, T, H = hidden.shape
        prev = predecessors(attention_mask, segment_ids, parent_ids)
        keep = prev >= 0
        if loss_mask is not None and self.head.loss_tokens_only and bool((keep & (loss_mask > 0)).any()):
            # (With no loss token at all everything is scored, so the head still takes part in
            # backward, as FSDP2 ranks reducing gradients together need.)
            keep &= loss_mask > 0
        # Only scored positions go through the head (padding costs no vocab-sized work).
        rows, columns = keep.nonzero(as_tuple=True)
        flat_hidden = hidden[rows, prev[rows, columns]]
        flat_labels = input_ids[rows, columns]
        sizes = starts = None
        if constraint_size is not None:
            sizes, starts = constraint_size[rows, columns], set_starts(constraint_size)[rows, columns]
        layer = self.head.module(self.model)
        # Recomputing a chunk in backward keeps one chunk's logits alive at a time; with one chunk its
        # saved tensors are that one chunk anyway, so the recompute would cost time and save no memory.
        recompute = torch.is_grad_enabled() and flat_hidden.shape[0] > chunk_size
        outputs = []
        for i in range(0, flat_hidden.shape[0], chunk_size):
            part = slice(i, i + chunk_size)
            args = (layer, flat_hidden[part], flat_labels[part], temperature)
            if sizes is not None:
                args += (sizes[part], constraint_ids[spans(starts[part], sizes[part].abs())])
            outputs.append(
                checkpoint(self.head.score, *args, use_reentrant=False)
                if recompute
                else self.head.score(*args)
            )

        def assemble(parts):
            scores = torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)
            return torch.zeros(B, T, dtype=torch.float32, device=hidden.device).index_put(
                (rows, columns), scores
            )

        scores = tuple(assemble([o[j] for o in outputs]) for j in range(self.head.outputs))
        return scores if len(scores) > 1 else scores[0]


def trim_width(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
    """Cut the all-padding columns at the right end of `[B, T, ...]` tensors
    (attention is causal, so they change nothing) -> (trimmed, original T)."""
    mask = tensors["attention_mask"]
    width = mask.shape[1]
    used = mask.bool().any(0).nonzero()
    keep = int(used.max()) + 1 if used.numel() else 1
    return {
        k: (v[:, :keep] if v.dim() >= 2 and v.shape[1] == width else v) for k, v in tensors.items()
    }, width


def pad_width(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))
