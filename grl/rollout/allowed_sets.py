"""A batch's per-token allowed sets (constrained decoding) in compact form, and the row and token
moves that keep them aligned with the batch's other tensors.

`constraint_size` `[rows, T]` is each token's signed set size (+n: n ids allowed, -n: n ids denied,
0: any token); `constraint_ids` `[N]` lists the ids of every set, token after token in row-major
order (CSR with implicit offsets: a token's ids start where the sizes of the tokens before it add
up to). N is the sum of the sets, so a forced tool call's few huge sets no longer pad every token of
the batch to their width. Whatever selects, copies, shards or packs rows or tokens takes the ids
along (`take_rows`, `take_tokens`); padding tokens are unconstrained, so adding or cutting padding
columns moves no id. The scorer expands the sets to a vocabulary mask one chunk of tokens at a time
(grl/workers/scoring.py).
"""

from __future__ import annotations

from itertools import chain

import numpy as np
import torch

SIZES, IDS = "constraint_size", "constraint_ids"


def compact_sets(
    rows: list[list[tuple[int, tuple[int, ...]]]], width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's per-token allowed sets (a row shorter than `width` is unconstrained past its end)
    -> (`constraint_size` `[rows, width]` long, `constraint_ids` `[N]`: int32 when every id fits)."""
    sizes = np.zeros((len(rows), width), np.int64)
    for r, row in enumerate(rows):
        sizes[r, : len(row)] = np.fromiter((size for size, _ in row), np.int64, len(row))
    total = int(np.abs(sizes).sum())
    ids = np.fromiter(chain.from_iterable(members for row in rows for _, members in row), np.int64, total)
    if total == 0 or int(ids.max()) <= np.iinfo(np.int32).max:
        ids = ids.astype(np.int32)
    return torch.from_numpy(sizes), torch.from_numpy(ids)


def row_count(tensors: dict) -> int:
    """Rows of a batch's tensors: every one is `[rows, ...]` but the sets' flat ids."""
    return next(v.shape[0] for k, v in tensors.items() if k != IDS)


def set_starts(sizes: torch.Tensor) -> torch.Tensor:
    """Where each token's ids start in `constraint_ids` (same shape as `sizes`)."""
    counts = sizes.abs().flatten()
    return (counts.cumsum(0) - counts).view_as(sizes)


def spans(starts: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The positions `starts[i]`, ..., `starts[i] + counts[i] - 1` for each i in turn, as one index."""
    total = int(counts.sum())
    before = counts.cumsum(0) - counts
    return torch.repeat_interleave(starts - before, counts, output_size=total) + torch.arange(
        total, device=counts.device
    )


def take_tokens(sizes: torch.Tensor, ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The ids of the tokens `tokens` (indices into `sizes.flatten()`), in that order."""
    return ids[spans(set_starts(sizes).flatten()[tokens], sizes.abs().flatten()[tokens])]


def take_rows(tensors: dict, rows) -> dict:
    """`v[rows]` of every `[rows, ...]` tensor (`rows`: a slice or an index), the ids of those rows' sets with
    them."""
    if IDS not in tensors:
        return {k: v[rows] for k, v in tensors.items()}
    sizes = tensors[SIZES]
    width = sizes.shape[1]
    picked = torch.arange(len(sizes), device=sizes.device)[rows]
    tokens = (picked[:, None] * width + torch.arange(width, device=sizes.device)).flatten()
    ids = take_tokens(sizes, tensors[IDS], tokens)
    return {k: ids if k == IDS else v[rows] for k, v in tensors.items()}
