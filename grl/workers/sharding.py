"""How the driver cuts a batch for the ranks of a group: equal row shards (filler rows with an empty
loss mask even them out, as FSDP2's collectives need every rank to run the same passes) and, for an
update, the mini-batches of every PPO epoch, each sharded in turn.

The trainer's batch holds one right-padded episode per row. With `rollout.packing` the rows go to
the ranks packed (`pack`): the ranks compute on fewer, fuller rows, and what they score comes back
one row per episode (`unpack`), so nothing before this boundary knows of packing."""

from __future__ import annotations

import torch

from grl.rollout.batch import pack_rows
from grl.rollout.types import Batch


def pick(batch: Batch, keys: tuple[str, ...]) -> dict[str, torch.Tensor]:
    return {k: batch[k].detach().cpu() for k in keys if k in batch}


def pad_rows(tensors: dict[str, torch.Tensor], multiple: int) -> tuple[dict[str, torch.Tensor], int]:
    """Append copies of row 0 (with an empty loss mask) so the row count divides
    by `multiple`. -> (padded, original row count)."""
    n = next(iter(tensors.values())).shape[0]
    extra = (-n) % multiple
    if extra == 0:
        return tensors, n
    padded = {}
    for key, value in tensors.items():
        filler = value[:1].expand(extra, *value.shape[1:])
        if key == "loss_mask":
            filler = torch.zeros_like(filler)
        padded[key] = torch.cat([value, filler])
    return padded, n


def equal_shards(tensors: dict[str, torch.Tensor], parts: int) -> list[dict[str, torch.Tensor]]:
    n = next(iter(tensors.values())).shape[0]
    size = n // parts
    return [{k: v[i * size:(i + 1) * size] for k, v in tensors.items()} for i in range(parts)]


def pack(tensors: dict[str, torch.Tensor], capacity: int) -> tuple[dict[str, torch.Tensor], list[tuple[int, int, int]]]:
    """Right-padded episode rows laid side by side, first-fit decreasing into rows of `capacity`
    tokens (a longer episode gets a row of its own), with `segment_ids` 1, 2, ... per episode of a
    row (0 on padding). Each episode's tokens keep their values, so its `position_ids` (and
    `context_ids`) restart where it starts. Padding is 0 everywhere: outside every mask.
    -> (packed, where), `where[i]` = (row, start, length) of episode i."""
    lengths = [int(n) for n in tensors["attention_mask"].sum(-1).tolist()]
    layout = pack_rows(lengths, capacity)
    width = max((sum(lengths[i] for i in members) for members in layout), default=0)
    out = {k: v.new_zeros((len(layout), width, *v.shape[2:])) for k, v in tensors.items()}
    out["segment_ids"] = torch.zeros(len(layout), width, dtype=torch.long)
    where: list[tuple[int, int, int]] = [(0, 0, 0)] * len(lengths)
    for r, members in enumerate(layout):
        start = 0
        for segment, i in enumerate(members, start=1):
            n = lengths[i]
            for k, v in tensors.items():
                out[k][r, start:start + n] = v[i, :n]
            out["segment_ids"][r, start:start + n] = segment
            where[i] = (r, start, n)
            start += n
    return out, where


def unpack(values: torch.Tensor, where: list[tuple[int, int, int]], width: int) -> torch.Tensor:
    """A per-token result of packed rows back to one right-padded row per episode (0 on padding,
    as a padded row is scored), `width` wide."""
    out = values.new_zeros((len(where), width, *values.shape[2:]))
    for i, (r, start, n) in enumerate(where):
        out[i, :n] = values[r, start:start + n]
    return out


def plan_minibatches(rows: int, mini_batch_size: int, epochs: int, shuffle: bool, seed: int) -> list[list[int]]:
    """Row indices of each mini-batch, epoch after epoch (a fresh permutation
    per epoch when shuffling, seeded so a resumed run draws the same ones)."""
    generator = torch.Generator().manual_seed(seed)
    plan = []
    for _ in range(epochs):
        order = torch.randperm(rows, generator=generator) if shuffle else torch.arange(rows)
        plan += [order[i:i + mini_batch_size].tolist() for i in range(0, rows, mini_batch_size)]
    return plan


def minibatch_shards(tensors: dict[str, torch.Tensor], train_cfg, ranks: int, seed: int,
                     capacity: int | None = None) -> list[list[dict]]:
    """Each rank's share of every mini-batch, in order: `ppo_epochs` passes over mini-batches of
    `ppo_mini_batch_size` episodes, each packed into rows of `capacity` tokens when one is given."""
    plan = plan_minibatches(len(tensors["input_ids"]), int(train_cfg.ppo_mini_batch_size), int(train_cfg.ppo_epochs),
                            bool(train_cfg.get("shuffle", True)), seed)
    per_rank: list[list[dict]] = [[] for _ in range(ranks)]
    for picked in plan:
        chosen = {k: v[torch.tensor(picked)] for k, v in tensors.items()}
        if capacity is not None:
            chosen, _ = pack(chosen, capacity)
        mini, _ = pad_rows(chosen, ranks)
        for rank, shard in enumerate(equal_shards(mini, ranks)):
            per_rank[rank].append(shard)
    return per_rank
