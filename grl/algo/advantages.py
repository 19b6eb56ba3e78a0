"""Advantage estimators for multi-turn episodes laid out as right-padded `[batch, tokens]` tensors.

Conventions (docs/CONTRACTS.md):
- `loss_mask[b, t]` is 1.0 exactly on tokens the model sampled (every turn's reply), 0 on
  system/user/env/template tokens and padding. "Generated" below means `loss_mask > 0`.
- `values[b, t]` is the critic's estimate at token t (aligned to the token, like log-probs).
- `token_rewards[b, t]` holds rewards on the last generated token of a turn or of the episode;
  rewards sitting on non-generated positions are ignored by every estimator.
- `turn_ids[b, t]` is the turn a token belongs to (-1 on padding).
- Every returned tensor is 0 outside the loss mask.

The MDP the critic-based estimators see is the sequence of generated tokens only: environment
tokens are part of the next state, not actions, so they are skipped rather than discounted over.

Each estimator is registered on its function (`@register_estimator`, grl/algo/registry.py); its
parameters name what it reads. torch is imported when an estimator first runs, not with this module:
the config reads these registrations before anything heavy loads.
"""

from __future__ import annotations

from typing import NamedTuple

from grl.algo.registry import ImportedOnFirstUse, register_estimator

torch = ImportedOnFirstUse("torch")


def _zero(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


class _Packing:
    """Where each generated token goes when every sequence's generated tokens are packed left.

    A sequence is a whole row, or with `segments` one (row, segment) pair (a turn). In packed
    form `[num_sequences, n]` "the next generated token" is simply the next column and each row
    ends in zeros, which is what makes environment tokens invisible to the scans below. Tokens
    of one segment must be contiguous among the row's generated tokens (turn ids never go back).
    """

    def __init__(self, gen: torch.Tensor, segments: torch.Tensor | None = None):
        B, T = gen.shape
        rank = gen.long().cumsum(1) - 1  # rank among the row's generated tokens
        if segments is None:
            seq, in_seq, S = torch.arange(B, device=gen.device)[:, None].expand(B, T), rank, 1
        else:
            seg = torch.where(gen, segments.long(), 0)
            S = int(seg.max()) + 1 if gen.numel() else 1
            seq = torch.arange(B, device=gen.device)[:, None] * S + seg
            # each segment's first rank; non-generated tokens report to a dump slot
            start = rank.new_full((B * S + 1,), T).scatter_reduce(
                0, torch.where(gen, seq, B * S).flatten(), rank.flatten(), "amin"
            )
            in_seq = rank - start[seq]
        n = int(torch.where(gen, in_seq, -1).max()) + 1 if gen.numel() else 0
        self.gen, self.shape = gen, (B * S, n)
        self.dest = torch.where(gen, seq * n + in_seq, B * S * n)  # the last slot is a dump

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """`[B, T] -> [num_sequences, n]`: generated entries in order, 0 after each sequence's last."""
        flat = x.new_zeros(self.shape[0] * self.shape[1] + 1).scatter(0, self.dest.flatten(), x.flatten())
        return flat[:-1].view(self.shape)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """Inverse of `pack`: back to `[B, T]`, 0 on non-generated positions."""
        flat = torch.cat([packed.flatten(), packed.new_zeros(1)])
        return torch.where(self.gen, flat[self.dest], _zero(packed))


def _shift_left(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[:, 1:], x.new_zeros(x.shape[0], 1)], dim=1)


def _discounted_reverse_sum(x: torch.Tensor, decay: float, chunk: int = 64) -> torch.Tensor:
    """out[:, j] = x[:, j] + decay * out[:, j + 1] over the columns of a packed `[S, n]` tensor.

    Blocked scan: inside a chunk of C columns the recurrence is one matmul with the transfer
    matrix M[i, j] = decay^(j - i) (j >= i); only the carries between chunks run in a Python
    loop, n / C steps instead of n, and powers stay within decay^C so nothing underflows.
    """
    S, n = x.shape
    if n == 0:
        return x.clone()
    C = min(chunk, n)
    nc = -(-n // C)
    blocks = torch.nn.functional.pad(x, (0, nc * C - n)).view(S, nc, C)
    i = torch.arange(C, device=x.device)
    lag = (i[None, :] - i[:, None]).to(x.dtype)
    M = torch.where(lag >= 0, decay ** lag.clamp(min=0), _zero(x))
    local = blocks @ M.T  # the discounted sum that stays inside each chunk
    to_next = decay ** (C - i).to(x.dtype)  # weight of the next chunk's first output at column i
    heads, carry = [None] * nc, x.new_zeros(S)
    for c in range(nc - 1, -1, -1):
        carry = local[:, c, 0] + to_next[0] * carry
        heads[c] = carry
    next_heads = torch.stack(heads[1:] + [x.new_zeros(S)], dim=1)
    return (local + to_next * next_heads[..., None]).reshape(S, nc * C)[:, :n]


def _packed_gae(token_rewards, values, gen, gamma, lam, segments=None):
    """GAE over each sequence's generated tokens (whole rows, or each segment on its own)."""
    packing = _Packing(gen, segments)
    rewards, vals = packing.pack(token_rewards), packing.pack(values)
    deltas = rewards + gamma * _shift_left(vals) - vals
    advantages = packing.unpack(_discounted_reverse_sum(deltas, gamma * lam))
    return advantages, torch.where(gen, advantages + values, _zero(values))


@register_estimator("gae", hyperparameters=("gamma", "lam"), whiten=True)
def compute_gae(
    token_rewards: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked multi-turn GAE -> (advantages, returns).

    Over generated tokens only: delta_t = r_t + gamma * V(next generated token) - V_t, where the
    next generated token of a turn's last token is the first generated token of the next turn,
    and 0 after the episode's last one; A_t = delta_t + gamma * lam * A(next generated token).
    returns = advantages + values. Not whitened (the dispatcher does that).
    """
    return _packed_gae(token_rewards, values, loss_mask > 0, gamma, lam)


def turn_ids_from_mask(loss_mask: torch.Tensor) -> torch.Tensor:
    """Turn index per token when only the mask is known: each maximal run of generated tokens
    is one turn, and the non-generated tokens before a run (its prompt) belong to that turn.
    A token's turn is the number of runs that ended before it."""
    gen = (loss_mask > 0).long()
    ends = torch.cat([gen.new_zeros(gen.shape[0], 1), gen[:, :-1] * (1 - gen[:, 1:])], dim=1)
    return ends.cumsum(1)


def _turn_layout(turn_ids: torch.Tensor, gen: torch.Tensor):
    """Per row and turn: first and last generated position, and whether the turn has any.

    Returns (tid, first, last, has_turn, K): `tid` is the turn id on generated tokens and K (a
    dump slot) elsewhere; `first`, `last`, `has_turn` are `[batch, K]`.
    """
    if bool((gen & (turn_ids < 0)).any()):
        raise ValueError("turn_ids must be >= 0 on every generated token (loss_mask > 0)")
    if bool((gen & (turn_ids < torch.where(gen, turn_ids, -1).cummax(1).values)).any()):
        raise ValueError("turn_ids must not decrease along a row's generated tokens")
    B, T = gen.shape
    K = int(torch.where(gen, turn_ids, -1).max()) + 1 if gen.numel() else 0
    tid = torch.where(gen, turn_ids.long(), K)
    pos = torch.arange(T, device=gen.device).expand(B, T)
    first = pos.new_full((B, K + 1), T).scatter_reduce(1, tid, pos, "amin")[:, :K]
    last = pos.new_full((B, K + 1), -1).scatter_reduce(1, tid, pos, "amax")[:, :K]
    return tid, first, last, last >= 0, K


def _to_tokens(per_turn: torch.Tensor, tid: torch.Tensor, gen: torch.Tensor) -> torch.Tensor:
    """Broadcast a `[batch, K]` per-turn quantity onto the generated tokens of each turn."""
    padded = torch.cat([per_turn, per_turn.new_zeros(per_turn.shape[0], 1)], dim=1)
    return torch.where(gen, padded.gather(1, tid), _zero(per_turn))


class TurnGAE(NamedTuple):
    """Per-turn results, `[batch, K]` with K = 1 + the largest turn id on a generated token."""

    advantages: torch.Tensor
    returns: torch.Tensor
    turn_mask: torch.Tensor  # True where the row has a turn k with at least one generated token
    last: torch.Tensor  # position of each turn's last generated token (-1 where there is none)
    token_turn: torch.Tensor  # `[batch, tokens]`: turn id on generated tokens, K elsewhere


def compute_turn_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    turn_ids: torch.Tensor,
    high_level_gamma: float,
    high_level_lam: float,
) -> TurnGAE:
    """High-level (turn) GAE.

    Turn k of a row is the set of its generated tokens with turn_ids == k; turns without a
    generated token are skipped. Turn reward R_k = sum of the turn's token rewards; turn value
    V_k = value at the turn's first generated token (the state the reply was written from).
    GAE over the row's turns: delta_k = R_k + high_level_gamma * V_{k+1} - V_k (0 after the
    last turn), A_k = delta_k + high_level_gamma * high_level_lam * A_{k+1}, G_k = A_k + V_k.
    """
    gen = loss_mask > 0
    tid, first, last, has_turn, K = _turn_layout(turn_ids, gen)
    B, T = gen.shape
    per_token = torch.where(gen, token_rewards, _zero(token_rewards))
    turn_rewards = token_rewards.new_zeros(B, K + 1).scatter_add(1, tid, per_token)[:, :K]
    turn_values = torch.where(has_turn, values.gather(1, first.clamp(max=T - 1)), _zero(values))
    turn_adv, turn_ret = compute_gae(
        turn_rewards, turn_values, has_turn.to(values.dtype), high_level_gamma, high_level_lam
    )
    return TurnGAE(turn_adv, turn_ret, has_turn, last, tid)


@register_estimator("bi_level_gae", hyperparameters=("gamma", "lam", "high_level_gamma"), whiten=True)
def compute_bi_level_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    turn_ids: torch.Tensor,
    gamma: float,
    lam: float,
    high_level_gamma: float,
    high_level_lam: float | None = None,
):
    """Bi-level (turn-level) GAE as in RAGEN -> (advantages, returns).

    1. High level: `compute_turn_gae` gives each turn its lambda-return
       G_k = R_k + high_level_gamma * ((1 - high_level_lam) * V_{k+1} + high_level_lam * G_{k+1}).
    2. Low level: inside each turn, token GAE with (gamma, lam) where the turn's last generated
       token receives reward G_k and bootstraps nothing further (the next turn is already in G_k);
       other tokens of the turn get reward 0 (their rewards are counted in R_k).
    returns = advantages + values. `high_level_lam` defaults to `lam` (RAGEN uses one lambda).
    """
    high_level_lam = lam if high_level_lam is None else high_level_lam
    gen = loss_mask > 0
    turns = compute_turn_gae(token_rewards, values, loss_mask, turn_ids, high_level_gamma, high_level_lam)
    B, T = gen.shape
    is_last = gen.new_zeros(B, T + 1).scatter(1, torch.where(turns.turn_mask, turns.last, T), True)[:, :T]
    low_rewards = torch.where(is_last, _to_tokens(turns.returns, turns.token_turn, gen), _zero(values))
    return _packed_gae(low_rewards, values, gen, gamma, lam, segments=turn_ids)


@register_estimator(
    "weighted_gae", hyperparameters=("gamma", "lam", "high_level_gamma", "turn_advantage_weight"), whiten=True
)
def compute_weighted_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    turn_ids: torch.Tensor,
    gamma: float,
    lam: float,
    high_level_gamma: float,
    turn_advantage_weight: float,
    high_level_lam: float | None = None,
):
    """Token + turn advantage -> (advantages, returns).

    A = A_token + turn_advantage_weight * A_turn, where A_token is `compute_gae` (multi-turn, env tokens
    skipped) and A_turn is the high-level advantage of `compute_turn_gae` broadcast to every
    generated token of its turn. returns are the token-level GAE returns (what the critic fits).
    """
    high_level_lam = lam if high_level_lam is None else high_level_lam
    gen = loss_mask > 0
    token_adv, returns = compute_gae(token_rewards, values, loss_mask, gamma, lam)
    turns = compute_turn_gae(token_rewards, values, loss_mask, turn_ids, high_level_gamma, high_level_lam)
    return token_adv + turn_advantage_weight * _to_tokens(turns.advantages, turns.token_turn, gen), returns
