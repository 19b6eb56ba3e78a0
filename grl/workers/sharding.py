"""How the driver cuts a batch for the ranks of a group: equal row shards (filler rows with an empty
loss mask even them out, as FSDP2's collectives need every rank to run the same passes) and, for an
update, the mini-batches of every PPO epoch, each sharded in turn."""

from __future__ import annotations

import torch

from grl.rollout.batch import repack
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


def plan_minibatches(rows: int, mini_batch_size: int, epochs: int, shuffle: bool, seed: int) -> list[list[int]]:
    """Row indices of each mini-batch, epoch after epoch (a fresh permutation
    per epoch when shuffling, seeded so a resumed run draws the same ones)."""
    generator = torch.Generator().manual_seed(seed)
    plan = []
    for _ in range(epochs):
        order = torch.randperm(rows, generator=generator) if shuffle else torch.arange(rows)
        plan += [order[i:i + mini_batch_size].tolist() for i in range(0, rows, mini_batch_size)]
    return plan


def minibatch_shards(tensors: dict[str, torch.Tensor], train_cfg, ranks: int, seed: int) -> list[list[dict]]:
    """Each rank's share of every mini-batch, in order: `ppo_epochs` passes over mini-batches of
    `ppo_mini_batch_size` episodes. A packed batch is repacked per mini-batch from the episodes drawn."""
    packed = "seq_ids" in tensors
    episodes = int(tensors["seq_ids"].max()) + 1 if packed else len(tensors["input_ids"])
    plan = plan_minibatches(episodes, int(train_cfg.ppo_mini_batch_size), int(train_cfg.ppo_epochs),
                            bool(train_cfg.get("shuffle", True)), seed)
    per_rank: list[list[dict]] = [[] for _ in range(ranks)]
    for picked in plan:
        chosen = repack(tensors, picked) if packed else {k: v[torch.tensor(picked)] for k, v in tensors.items()}
        mini, _ = pad_rows(chosen, ranks)
        for rank, shard in enumerate(equal_shards(mini, ranks)):
            per_rank[rank].append(shard)
    return per_rank
