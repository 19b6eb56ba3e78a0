"""Random multi-turn batches laid out like the rollout layer's Batch, for the algo tests and bench."""

import random

import torch


def random_episode_batch(
    batch: int,
    seed: int,
    max_turns: int = 4,
    max_env: int = 4,
    max_reply: int = 6,
    pad_to: int | None = None,
    garbage=float("nan"),
):
    """-> dict of float64 [B, T] tensors (token_rewards, values, loss_mask) and long turn_ids.

    Each row: turns of (prompt/env tokens, mask 0) + (reply tokens, mask 1), reward on the last
    reply token and now and then on another reply token; some replies are empty and some rows
    have no turn at all. Non-generated positions get random values/rewards (they must be
    ignored) and padding gets `garbage`.
    """
    rng = random.Random(seed)
    rows = []
    for _ in range(batch):
        mask, tids = [], []
        for k in range(rng.randint(0, max_turns)):
            n_env, n_gen = rng.randint(1 if k == 0 else 0, max_env), rng.randint(0, max_reply)
            mask += [0.0] * n_env + [1.0] * n_gen
            tids += [k] * (n_env + n_gen)
        rows.append((mask, tids))
    T = max([len(m) for m, _ in rows] + [1]) + rng.randint(0, 3)
    T = max(T, pad_to or 0)
    loss_mask = torch.zeros(batch, T, dtype=torch.float64)
    turn_ids = torch.full((batch, T), -1, dtype=torch.long)
    values = torch.full((batch, T), garbage, dtype=torch.float64)
    rewards = torch.full((batch, T), garbage, dtype=torch.float64)
    for b, (mask, tids) in enumerate(rows):
        n = len(mask)
        loss_mask[b, :n] = torch.tensor(mask, dtype=torch.float64)
        turn_ids[b, :n] = torch.tensor(tids, dtype=torch.long)
        values[b, :n] = torch.tensor([rng.gauss(0, 1) for _ in range(n)], dtype=torch.float64)
        rewards[b, :n] = torch.tensor([rng.gauss(0, 1) if m == 0 else 0.0 for m in mask], dtype=torch.float64)
        for t in range(n):
            turn_ends = mask[t] > 0 and (t + 1 == n or mask[t + 1] == 0)
            if turn_ends or (mask[t] > 0 and rng.random() < 0.1):
                rewards[b, t] = rng.choice([0.0, 1.0, -0.5, rng.gauss(0, 1)])
    return {"token_rewards": rewards, "values": values, "loss_mask": loss_mask, "turn_ids": turn_ids}
