"""How the driver cuts a batch for the ranks of a group: equal row shards (filler rows with an empty
loss mask even them out, as FSDP2's collectives need every rank to run the same passes) and, for an
update, the mini-batches of every PPO epoch, each sharded in turn.

The trainer's batch holds one right-padded episode per row. With `rollout.packing` the rows go to
the ranks packed (`pack`): the ranks compute on fewer, fuller rows, and what they score comes back
one row per episode (`unpack`), so nothing before this boundary knows of packing."""

from __future__ import annotations

import torch

from grl.rollout.allowed_sets import IDS, SIZES, row_count, take_rows, take_tokens
from grl.rollout.batch import pack_rows
from grl.rollout.types import Batch


def pick(batch: Batch, keys: tuple[str, ...]) -> dict[str, torch.Tensor]:
    return {k: batch[k].detach().cpu() for k in keys if k in batch}


def pad_rows(tensors: dict[str, torch.Tensor], multiple: int) -> tuple[dict[str, torch.Tensor], int]:
    """Append copies of row 0 (with an empty loss mask) so the row count divides
    by `multiple`. -> (padded, original row count)."""
    n = row_count(tensors)
    extra = (-n) % multiple
    if extra == 0:
        return tensors, n
    padded = {}
    for key, value in tensors.items():
        if key == IDS:  # row 0's sets, once per copy
            padded[key] = torch.cat([value, value[: int(tensors[SIZES][0].abs().sum())].repeat(extra)])
            continue
        filler = value[:1].expand(extra, *value.shape[1:])
        if key == "loss_mask":
            filler = torch.zeros_like(filler)
        padded[key] = torch.cat([value, filler])
    return padded, n


def equal_shards(tensors: dict[str, torch.Tensor], parts: int) -> list[dict[str, torch.Tensor]]:
    n = row_count(tensors)
    size = n // parts
    return [take_rows(tensors, slice(i * size, (i + 1) * size)) for i in range(parts)]


def _prompt_families(
    tensors: dict[str, torch.Tensor], lengths: list[int], capacity: int
) -> list[tuple[list[int], int]]:
    """The packing units: (episodes, shared prefix length). Episodes that begin with the same
    prompt (every token before the first sampled one: a GRPO group's question, a game's first
    board) form one unit holding the prompt once, split into several when they would not fit in
    `capacity` tokens together; any other episode is a unit of its own (prefix 0)."""
    prompts = prompts_of(tensors)
    groups = prompt_groups(prompts)
    units: list[tuple[list[int], int]] = [(members, 0) for members in groups if not prompts[members[0]]]
    for members in (members for members in groups if prompts[members[0]]):
        p = len(prompts[members[0]])
        chunk, size = [], p
        for i in members + [None]:
            if i is None or (chunk and size + lengths[i] - p > capacity):
                units.append((chunk, p) if len(chunk) > 1 else (chunk, 0))
                chunk, size = [], p
            if i is not None:
                chunk.append(i)
                size += lengths[i] - p
    return units


def prompts_of(tensors: dict[str, torch.Tensor]) -> list[tuple[int, ...]]:
    """Each episode's prompt: its tokens before the first sampled one (empty if it sampled none)."""
    sampled = tensors["loss_mask"] > 0
    firsts = [int(row.int().argmax()) if bool(row.any()) else 0 for row in sampled]
    return [tuple(tensors["input_ids"][i, :first].tolist()) for i, first in enumerate(firsts)]


def prompt_groups(prompts: list[tuple[int, ...]]) -> list[list[int]]:
    """Episodes grouped by their prompt (`prompts_of`), in order of first appearance; an episode that
    sampled nothing is a group of its own."""
    groups: dict[tuple[int, ...] | int, list[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(prompt or i, []).append(i)
    return list(groups.values())


def row_capacity(tensors: dict[str, torch.Tensor], max_tokens: int) -> int:
    """Tokens of a packed row for these episodes: `max_tokens`, and at most twice the longest episode.
    A packed row's attention is computed over every pair of its tokens, masked or not, so its cost
    grows with the square of the row's length where padded rows' grows with their number. Measured,
    fwd+bwd of the 135M model on 8 episodes of 630 tokens (a 5-turn game, groups of 4 sharing a
    198-token prompt): padded 29 s, one packed row of 3,852 tokens 49 s, rows of <= 1,260 tokens 29 s;
    on 8 of 244 (GSM8K-like): padded 9.8 s, one row 5.5 s, rows of <= 488 4.8 s."""
    longest = int(tensors["attention_mask"].sum(-1).max()) if len(tensors["attention_mask"]) else 1
    return min(max_tokens, 2 * longest)


def pack(
    tensors: dict[str, torch.Tensor], capacity: int, share_prompts: bool = False
) -> tuple[dict[str, torch.Tensor], list[list[tuple[int, int, int]]]]:
    """Right-padded episode rows laid side by side, first-fit decreasing into rows of `capacity`
    tokens (a longer episode gets a row of its own), with `segment_ids` 1, 2, ... per episode of a
    row (0 on padding). Each episode's tokens keep their values, so its `position_ids` (and
    `context_ids`) restart where it starts. Padding is 0 everywhere: outside every mask. The ids
    of the tokens' allowed sets follow their tokens.

    `share_prompts`: episodes that begin with the same prompt hold it once (`_prompt_families`):
    the prompt is a segment of its own, followed by each episode's rest, whose `parent_ids` name
    the prompt's segment (0 elsewhere); a token sees its own segment and its parent's, and the
    first token after the prompt is scored from the prompt's last. Not with `context_ids`, whose
    spans restart within an episode.
    -> (packed, where), `where[i]` = episode i's pieces (row, start, length), in order."""
    lengths = [int(n) for n in tensors["attention_mask"].sum(-1).tolist()]
    if share_prompts and "context_ids" not in tensors and "loss_mask" in tensors:
        units = _prompt_families(tensors, lengths, capacity)
    else:
        units = [([i], 0) for i in range(len(lengths))]
    sizes = [p + sum(lengths[i] - p for i in members) for members, p in units]
    layout = pack_rows(sizes, capacity)
    width = max((sum(sizes[u] for u in row) for row in layout), default=0)
    dense = {k: v for k, v in tensors.items() if k != IDS}
    out = {k: v.new_zeros((len(layout), width, *v.shape[2:])) for k, v in dense.items()}
    out["segment_ids"] = torch.zeros(len(layout), width, dtype=torch.long)
    parents = torch.zeros(len(layout), width, dtype=torch.long)
    # each packed token's index in the padded rows, for the allowed sets' ids to follow their tokens
    sources = torch.full((len(layout), width), -1, dtype=torch.long) if IDS in tensors else None
    padded_width = tensors["attention_mask"].shape[1]
    where: list[list[tuple[int, int, int]]] = [[] for _ in lengths]

    for r, row in enumerate(layout):
        start, segment = 0, 0

        def place(i: int, a: int, b: int, parent: int) -> None:
            nonlocal start, segment
            segment += 1
            for k, v in dense.items():
                out[k][r, start : start + b - a] = v[i, a:b]
            if sources is not None:
                sources[r, start : start + b - a] = torch.arange(i * padded_width + a, i * padded_width + b)
            out["segment_ids"][r, start : start + b - a] = segment
            parents[r, start : start + b - a] = parent
            start += b - a

        for u in row:
            members, p = units[u]
            prompt = []
            if p:
                prompt = [(r, start, p)]
                place(members[0], 0, p, 0)
            parent = segment if p else 0
            for i in members:
                where[i] = prompt + [(r, start, lengths[i] - p)]
                place(i, p, lengths[i], parent)
    if bool(parents.any()):
        out["parent_ids"] = parents
    if IDS in tensors:
        out[IDS] = take_tokens(tensors[SIZES], tensors[IDS], sources[sources >= 0])
    return out, where


def unpack(values: torch.Tensor, where: list[list[tuple[int, int, int]]], width: int) -> torch.Tensor:
    """A per-token result of packed rows back to one right-padded row per episode (0 on padding,
    as a padded row is scored), `width` wide; a shared prompt's results go to each of its episodes."""
    out = values.new_zeros((len(where), width, *values.shape[2:]))
    for i, pieces in enumerate(where):
        at = 0
        for r, start, n in pieces:
            out[i, at : at + n] = values[r, start : start + n]
            at += n
    return out


def computed_work(shards: list[dict[str, torch.Tensor]]) -> dict[str, int]:
    """What the ranks compute over these shards, for the update's FLOPs (grl.planner.train_flops):
    `tokens` through the backbone, a shared prompt once; `attention_pairs`, n^2 for an episode of n as
    verl counts them, where an episode's rest of r tokens after a shared prompt of p adds (p + r)^2 - p^2;
    `head_tokens`, the loss-mask tokens the policy's head scores. Filler rows (`pad_rows`: an empty loss
    mask) are computed but count nothing: no episode needs them."""
    work = {"tokens": 0, "attention_pairs": 0, "head_tokens": 0}
    for shard in shards:
        real = shard["loss_mask"].flatten(1).any(-1)
        work["head_tokens"] += int((shard["loss_mask"][real] > 0).sum())
        if "segment_ids" not in shard:
            lengths = (shard["attention_mask"][real] > 0).sum(-1)
            work["tokens"] += int(lengths.sum())
            work["attention_pairs"] += int((lengths * lengths).sum())
            continue
        parents = shard.get("parent_ids", torch.zeros_like(shard["segment_ids"]))
        for segments, parent_of in zip(shard["segment_ids"][real], parents[real]):
            sizes = torch.bincount(segments, minlength=int(segments.max()) + 1)
            work["tokens"] += int(sizes[1:].sum())
            for segment in range(1, len(sizes)):
                n = int(sizes[segment])
                first = int((segments == segment).int().argmax())
                p = int(sizes[parent_of[first]]) if int(parent_of[first]) else 0
                work["attention_pairs"] += (p + n) ** 2 - p * p
    return work


def plan_minibatches(
    rows: int,
    mini_batch_size: int,
    epochs: int,
    shuffle: bool,
    seed: int,
    groups: list[list[int]] | None = None,
) -> list[list[int]]:
    """Row indices of each mini-batch, epoch after epoch (a fresh permutation
    per epoch when shuffling, seeded so a resumed run draws the same ones).
    `groups` (rows that share a prompt) are shuffled as wholes and kept side by side, so a
    mini-batch holds whole groups where their sizes allow and computes each prompt once."""
    generator = torch.Generator().manual_seed(seed)
    groups = groups or [[row] for row in range(rows)]
    plan = []
    for _ in range(epochs):
        order = torch.randperm(len(groups), generator=generator).tolist() if shuffle else range(len(groups))
        flat = [row for g in order for row in groups[g]]
        plan += [flat[i : i + mini_batch_size] for i in range(0, rows, mini_batch_size)]
    return plan


def minibatch_shards(
    tensors: dict[str, torch.Tensor],
    train_cfg,
    ranks: int,
    seed: int,
    capacity: int | None = None,
    share_prompts: bool = False,
) -> list[list[dict]]:
    """Each rank's share of every mini-batch, in order: `ppo_epochs` passes over mini-batches of
    `ppo_mini_batch_size` episodes, each packed into rows of at most `capacity` tokens when one is
    given (`row_capacity`; `pack`'s `share_prompts`, which also keeps a prompt's episodes in one
    mini-batch where they fit: drawn one by one, a group of 4 in a batch of 8 groups would rarely meet)."""
    shared = (
        capacity is not None and share_prompts and "context_ids" not in tensors and "loss_mask" in tensors
    )
    plan = plan_minibatches(
        len(tensors["input_ids"]),
        train_cfg.ppo_mini_batch_size,
        train_cfg.ppo_epochs,
        train_cfg.shuffle,
        seed,
        prompt_groups(prompts_of(tensors)) if shared else None,
    )
    per_rank: list[list[dict]] = [[] for _ in range(ranks)]
    for picked in plan:
        chosen = take_rows(tensors, torch.tensor(picked))
        if capacity is not None:
            chosen, _ = pack(chosen, row_capacity(chosen, capacity), share_prompts)
        mini, _ = pad_rows(chosen, ranks)
        for rank, shard in enumerate(equal_shards(mini, ranks)):
            per_rank[rank].append(shard)
    return per_rank
