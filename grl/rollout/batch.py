"""Episodes -> Batch: token ids, masks, turn indices and token-level rewards.

Each episode is its turns' ids concatenated (template/env ids, then the
sampled ids, turn after turn). `loss_mask` is 1.0 exactly on sampled ids;
`turn_ids` gives each token its turn (the template ids before a reply belong
to that reply's turn); rewards sit on the last sampled token of the turn that
earned them (`use_turn_scores`) or, as the episode score, on the last sampled
token of the episode. Turn rewards already include the format penalty.

Layout: one episode per row, right-padded; `position_ids` count from 0 per row;
padding has attention_mask 0 and turn_ids -1; meta holds one entry per row.
A windowed episode (turns prompted afresh, `agent_config.max_context_window`) adds
`context_ids` (1, 2, ... per turn prompt of an episode, 0 on padding): `position_ids`
restart at 0 with every turn prompt, and a token attends only within its span of
`attention_spans` (its turn prompt).

Packing (`rollout.packing`) is the worker boundary's business (grl/workers/sharding.py):
it lays several episode rows side by side (`pack_rows`), `segment_ids` numbering them
1, 2, ... (0 on padding), and the ranks keep attention within an episode
(`packed_attention_mask`, `attention_spans`). Episodes that begin with the same prompt may hold
it once (`rollout.share_prompts`): it becomes a segment of its own that the episodes' rests see
through `parent_ids`.

Constrained decoding: when any reply of the batch was decoded under a
grammar, the batch also holds each token's allowed set, compact:
`constraint_size` `[rows, T]` (+n: n ids allowed, -n: n ids denied, 0: any
token) and `constraint_ids` `[N]` (every set's ids, token after token;
grl/rollout/allowed_sets.py), so the trainer scores every sampled token with the
masked softmax it was drawn from.

An episode longer than `max_episode_length` tokens, or one with no sampled
token (its env failed at reset), is dropped and counted, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from grl.rollout.types import Batch, Episode

TENSOR_KEYS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "loss_mask",
    "turn_ids",
    "token_rewards",
    "rollout_log_probs",
)

META_KEYS = (
    "task",
    "group_id",
    "seed",
    "episode_score",
    "raw_score",
    "uid",
    "state_keys",
)  # state_keys: one per turn


@dataclass
class EpisodeTokens:
    """One episode as flat per-token lists."""

    input_ids: list[int]
    loss_mask: list[float]
    turn_ids: list[int]
    token_rewards: list[float]
    rollout_log_probs: list[float]
    allowed: list[tuple[int, tuple[int, ...]]]  # per token; (0, ()) where the token was not constrained
    position_ids: list[int]  # from 0, and from 0 again at every turn prompted afresh (Turn.new_context)
    context_ids: list[int]  # 1, 2, ...: the turn prompt a token belongs to; one for a whole-episode chat


def episode_tokens(ep: Episode, use_turn_scores: bool, score: float | None = None) -> EpisodeTokens:
    """Flatten an episode; `score` replaces `ep.score` on the final token
    (a normalised score) when rewards are per episode."""
    ids: list[int] = []
    mask: list[float] = []
    turn_ids: list[int] = []
    log_probs: list[float] = []
    turn_ends: list[int] = []
    allowed: list[tuple[int, tuple[int, ...]]] = []
    positions: list[int] = []
    contexts: list[int] = []
    for k, turn in enumerate(ep.turns):
        n_prompt, n_reply = len(turn.prompt_ids), len(turn.response_ids)
        if not ids:
            start, context = 0, 1
        elif turn.new_context:  # a whole prompt of its own: positions restart, a new span of attention
            start, context = 0, contexts[-1] + 1
        else:
            start, context = positions[-1] + 1, contexts[-1]
        positions += range(start, start + n_prompt + n_reply)
        contexts += [context] * (n_prompt + n_reply)
        ids += turn.prompt_ids + turn.response_ids
        mask += [0.0] * n_prompt + [1.0] * n_reply
        turn_ids += [k] * (n_prompt + n_reply)
        reply_lp = turn.response_log_probs if turn.response_log_probs is not None else [0.0] * n_reply
        log_probs += [0.0] * n_prompt + [float(x) for x in reply_lp]
        allowed += [(0, ())] * n_prompt + (
            list(turn.response_allowed) if turn.response_allowed is not None else [(0, ())] * n_reply
        )
        turn_ends.append(len(ids))
    rewards = [0.0] * len(ids)
    sampled = [i for i, m in enumerate(mask) if m]
    if sampled:
        if use_turn_scores:
            for turn, end in zip(ep.turns, turn_ends):
                # An empty reply's reward goes to the latest sampled token before it (or the first one).
                before = [i for i in sampled if i < end]
                rewards[before[-1] if before else sampled[0]] += float(turn.reward)
        else:
            rewards[sampled[-1]] += float(ep.score if score is None else score)
    return EpisodeTokens(ids, mask, turn_ids, rewards, log_probs, allowed, positions, contexts)


def build_batch(
    episodes: list[Episode],
    *,
    use_turn_scores: bool = False,
    max_episode_length: int | None = None,
    pad_token_id: int = 0,
    scores: list[float] | None = None,
) -> tuple[Batch, dict[str, float]]:
    """The training batch of `episodes` and the drop counts.

    `scores` (one per episode, e.g. normalised) replaces the episode scores
    placed on the final tokens; meta `episode_score` is the score placed,
    `raw_score` the env's.
    """
    if scores is not None and len(scores) != len(episodes):
        raise ValueError(f"scores: {len(scores)} values for {len(episodes)} episodes")
    if scores is not None and use_turn_scores:
        raise ValueError(
            "rollout.use_turn_scores: turn rewards cannot take normalised episode scores "
            "(set rollout.reward_normalization.method=identity)"
        )
    kept: list[tuple[Episode, float, EpisodeTokens]] = []
    too_long = empty = 0
    for i, ep in enumerate(episodes):
        score = ep.score if scores is None else float(scores[i])
        tokens = episode_tokens(ep, use_turn_scores, score)
        if not any(tokens.loss_mask):
            empty += 1
        elif max_episode_length is not None and len(tokens.input_ids) > max_episode_length:
            too_long += 1
        else:
            kept.append((ep, score, tokens))
    metrics = {
        "rollout/dropped_overlong": float(too_long),
        "rollout/dropped_empty": float(empty),
        "rollout/batch_episodes": float(len(kept)),
    }
    windowed = any(t.context_ids[-1] > 1 for _, _, t in kept)
    return _padded(kept, pad_token_id, windowed), metrics


def _meta(ep: Episode, score: float) -> dict:
    return {
        "task": ep.task,
        "group_id": ep.group_id,
        "seed": ep.seed,
        "episode_score": score,
        "raw_score": ep.score,
        "uid": ep.uid,
        "state_keys": [t.state_key for t in ep.turns],
    }


def _tensors(rows: list[dict[str, list]], width: int, pad_token_id: int) -> dict:
    import torch

    pads = {
        "input_ids": pad_token_id,
        "attention_mask": 0,
        "position_ids": 0,
        "loss_mask": 0.0,
        "turn_ids": -1,
        "token_rewards": 0.0,
        "rollout_log_probs": 0.0,
        "context_ids": 0,
    }
    floats = ("loss_mask", "token_rewards", "rollout_log_probs")
    out = {}
    for key in rows[0] if rows else TENSOR_KEYS:
        if key == "allowed":
            continue
        data = [row[key] + [pads[key]] * (width - len(row[key])) for row in rows]
        out[key] = torch.tensor(data, dtype=torch.float32 if key in floats else torch.long).reshape(
            len(rows), width
        )
    allowed = [row["allowed"] for row in rows if "allowed" in row]
    if any(size for row in allowed for size, _ in row):
        from grl.rollout.allowed_sets import compact_sets

        out["constraint_size"], out["constraint_ids"] = compact_sets(allowed, width)
    return out


def _row(tokens: EpisodeTokens, windowed: bool) -> dict[str, list]:
    n = len(tokens.input_ids)
    row = {
        "input_ids": tokens.input_ids,
        "attention_mask": [1] * n,
        "position_ids": tokens.position_ids,
        "loss_mask": tokens.loss_mask,
        "turn_ids": tokens.turn_ids,
        "token_rewards": tokens.token_rewards,
        "rollout_log_probs": tokens.rollout_log_probs,
        "allowed": tokens.allowed,
    }
    if windowed:
        row["context_ids"] = tokens.context_ids
    return row


def _padded(kept, pad_token_id: int, windowed: bool) -> Batch:
    rows = [_row(tokens, windowed) for _, _, tokens in kept]
    width = max((len(r["input_ids"]) for r in rows), default=0)
    metas = [_meta(ep, score) for ep, score, _ in kept]
    meta = {k: [m[k] for m in metas] for k in META_KEYS}
    return Batch(_tensors(rows, width, pad_token_id), meta)


def pack_rows(lengths: list[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: item indices per row, each row summing to at most
    `capacity` (an item longer than that gets a row of its own)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rows: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(capacity - lengths[i])
    return rows


def packed_attention_mask(segment_ids, parent_ids=None):
    """`[rows, 1, T, T]` boolean mask: token i sees token j iff j <= i and j belongs to the same
    episode of the row as i, or to the segment `parent_ids[i]` names (a prompt several episodes
    share, grl/workers/sharding.py)."""
    import torch

    same = segment_ids.unsqueeze(-1) == segment_ids.unsqueeze(-2)
    if parent_ids is not None:
        same |= (parent_ids > 0).unsqueeze(-1) & (parent_ids.unsqueeze(-1) == segment_ids.unsqueeze(-2))
    real = (segment_ids > 0).unsqueeze(-1) & (segment_ids > 0).unsqueeze(-2)
    T = segment_ids.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=segment_ids.device).tril()
    return (same & real & causal).unsqueeze(1)


def attention_spans(tensors: dict):
    """`[rows, T]` ids of the spans within which tokens attend to each other (0: padding): the
    episodes of a packed row (`segment_ids`), cut further into the turns of an episode that were
    prompted afresh (`context_ids`). None: each row is one span (use `attention_mask`)."""
    import torch

    segments, contexts = tensors.get("segment_ids"), tensors.get("context_ids")
    if contexts is None:
        return segments
    base = segments if segments is not None else tensors["attention_mask"].long()
    return torch.where(base > 0, base * (int(contexts.max()) + 1) + contexts, 0)
