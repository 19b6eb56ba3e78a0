"""Episode -> Batch: token layout, masks, reward placement, drops; and the packed layout the workers' boundary
makes of it."""

import pytest
import torch
from omegaconf import OmegaConf

from grl.rollout.batch import build_batch, pack_rows, packed_attention_mask
from grl.rollout.types import Episode, Turn
from grl.workers.sharding import computed_work, minibatch_shards, pack, row_capacity, unpack


def two_turn_episode(group_id=0, member=0):
    turns = [Turn([10, 11, 12], [20, 21], [-0.1, -0.2], 0.5), Turn([13], [22, 23, 24], None, -0.1)]
    return Episode("taskA", group_id, 7 + group_id, turns, 0.4, member=member)


def short_episode():
    return Episode("taskB", 1, 8, [Turn([1, 2], [3], [-0.3], 1.0)], 1.0)


def test_padded_layout_and_episode_reward():
    batch, metrics = build_batch([two_turn_episode(), short_episode()], pad_token_id=99)
    assert batch["input_ids"].tolist() == [[10, 11, 12, 20, 21, 13, 22, 23, 24], [1, 2, 3] + [99] * 6]
    assert batch["attention_mask"].tolist() == [[1] * 9, [1, 1, 1] + [0] * 6]
    assert batch["position_ids"].tolist() == [list(range(9)), [0, 1, 2] + [0] * 6]
    assert batch["loss_mask"].tolist() == [[0, 0, 0, 1, 1, 0, 1, 1, 1], [0, 0, 1] + [0] * 6]
    assert batch["turn_ids"].tolist() == [[0, 0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0] + [-1] * 6]
    assert batch["token_rewards"][0].tolist() == pytest.approx([0] * 8 + [0.4])
    assert batch["token_rewards"][1].tolist() == pytest.approx([0, 0, 1.0] + [0] * 6)
    assert batch["rollout_log_probs"][0].tolist() == pytest.approx([0, 0, 0, -0.1, -0.2, 0, 0, 0, 0])
    assert batch["loss_mask"].dtype == torch.float32 and batch["input_ids"].dtype == torch.long
    assert batch.meta["task"] == ["taskA", "taskB"]
    assert batch.meta["group_id"] == [0, 1] and batch.meta["seed"] == [7, 8]
    assert batch.meta["episode_score"] == [0.4, 1.0] and batch.meta["uid"] == ["0-0", "1-0"]
    assert metrics["rollout/dropped_overlong"] == 0


def test_turn_scores_sit_on_each_turns_last_sampled_token():
    batch, _ = build_batch([two_turn_episode()], use_turn_scores=True)
    assert batch["token_rewards"][0].tolist() == pytest.approx([0, 0, 0, 0, 0.5, 0, 0, 0, -0.1])


def test_normalised_scores_replace_the_episode_score():
    batch, _ = build_batch([two_turn_episode(), short_episode()], scores=[-1.5, 2.0])
    assert batch["token_rewards"].sum(-1).tolist() == pytest.approx([-1.5, 2.0])
    assert batch.meta["episode_score"] == [-1.5, 2.0] and batch.meta["raw_score"] == [0.4, 1.0]
    with pytest.raises(ValueError, match="use_turn_scores"):
        build_batch([two_turn_episode()], use_turn_scores=True, scores=[1.0])


def test_overlong_and_empty_episodes_are_dropped_and_counted():
    failed_at_reset = Episode("taskA", 2, 9, [], -0.1, error="boom")
    batch, metrics = build_batch([two_turn_episode(), short_episode(), failed_at_reset], max_episode_length=8)
    assert len(batch) == 1 and batch.meta["task"] == ["taskB"]
    assert metrics["rollout/dropped_overlong"] == 1 and metrics["rollout/dropped_empty"] == 1
    empty, metrics = build_batch([two_turn_episode()], max_episode_length=3)
    assert len(empty) == 0 and metrics["rollout/dropped_overlong"] == 1


def test_pack_rows_first_fit_decreasing():
    assert pack_rows([9, 3, 5, 4], 9) == [[0], [2, 3], [1]]
    rows = pack_rows([3, 7, 2, 2, 6, 1], 8)
    assert sorted(i for r in rows for i in r) == list(range(6))
    assert all(sum([3, 7, 2, 2, 6, 1][i] for i in r) <= 8 for r in rows)


def test_packed_rows_restart_positions_and_unpack_to_the_padded_batch():
    eps = [two_turn_episode(0, 0), short_episode(), two_turn_episode(2, 1)]
    padded, _ = build_batch(eps)
    packed, where = pack(padded.tensors, capacity=12)
    # lengths 9, 3, 9 into rows of 12: [0, 1], [2]
    assert packed["input_ids"].shape == (2, 12)
    assert packed["position_ids"][0].tolist() == list(range(9)) + [0, 1, 2]
    assert packed["segment_ids"].tolist() == [[1] * 9 + [2] * 3, [1] * 9 + [0] * 3]
    assert where == [[(0, 0, 9)], [(0, 9, 3)], [(1, 0, 9)]]
    for key in ("input_ids", "loss_mask", "token_rewards", "rollout_log_probs"):
        assert torch.equal(unpack(packed[key], where, padded[key].shape[1]), padded[key]), key


def replied(episode, first_reply):
    """`episode` with another first reply: a group member that saw the same prompt."""
    first, *rest = episode.turns
    turns = [Turn(first.prompt_ids, first_reply, None, first.reward), *rest]
    return Episode(
        episode.task, episode.group_id, episode.seed, turns, episode.score, member=episode.member + 1
    )


def test_episodes_that_share_a_prompt_hold_it_once():
    a = two_turn_episode()  # prompt [10, 11, 12], then 6 more tokens
    eps = [a, short_episode(), replied(a, [25]), replied(a, [26, 27, 28])]
    padded, _ = build_batch(eps)
    packed, where = pack(padded.tensors, capacity=21, share_prompts=True)
    # row 0: the prompt (3 tokens) once, then the rests of episodes 0, 2, 3 (6, 5, 7); row 1: episode 1
    assert packed["input_ids"][0].tolist() == [
        10,
        11,
        12,
        20,
        21,
        13,
        22,
        23,
        24,
        25,
        13,
        22,
        23,
        24,
        26,
        27,
        28,
        13,
        22,
        23,
        24,
    ]
    assert packed["segment_ids"][0].tolist() == [1] * 3 + [2] * 6 + [3] * 5 + [4] * 7
    assert packed["parent_ids"].tolist() == [[0] * 3 + [1] * 18, [0] * 21]
    assert where == [[(0, 0, 3), (0, 3, 6)], [(1, 0, 3)], [(0, 0, 3), (0, 9, 5)], [(0, 0, 3), (0, 14, 7)]]
    assert packed["position_ids"][0, 9:14].tolist() == [3, 4, 5, 6, 7]  # a rest goes on from the prompt
    for key in ("input_ids", "loss_mask", "token_rewards", "rollout_log_probs", "position_ids"):
        assert torch.equal(unpack(packed[key], where, padded[key].shape[1]), padded[key]), key
    tight, where = pack(padded.tensors, capacity=20, share_prompts=True)
    assert where[3] == [(1, 0, 10)]  # the prompt and three rests no longer fit: the last goes whole
    alone, _ = pack(padded.tensors, capacity=20)
    assert "parent_ids" not in alone  # without share_prompts: today's packing


def test_packed_rows_are_at_most_twice_the_longest_episode():
    """A packed row's attention covers every pair of its tokens: the rows sent to the ranks stay
    within twice the longest episode however large rollout.max_episode_length is."""
    a = two_turn_episode()
    eps = [a, short_episode(), replied(a, [25]), replied(a, [26, 27, 28])]  # lengths 9, 3, 8, 10
    padded, _ = build_batch(eps)
    assert row_capacity(padded.tensors, 4096) == 20
    assert row_capacity(padded.tensors, 12) == 12
    train = OmegaConf.create({"ppo_mini_batch_size": 4, "ppo_epochs": 1, "shuffle": False})
    (shards,) = minibatch_shards(padded.tensors, train, ranks=1, seed=0, capacity=4096, share_prompts=True)
    (mini,) = shards
    assert mini["input_ids"].shape[1] <= 20
    # every token is there; episodes 0 and 2 share the 3-token prompt (with 3 too the row would pass 20)
    assert int(mini["attention_mask"].sum()) == 9 + 3 + 8 + 10 - 3


def test_the_update_counts_the_work_its_ranks_compute():
    """perf/mfu/actor's numerator: a shared prompt once, each rest against it, the head on the loss
    tokens, filler rows not at all; every epoch counts."""
    a = two_turn_episode()  # 9 tokens: a 3-token prompt, then 6 (5 of them sampled)
    eps = [a, short_episode(), replied(a, [25]), replied(a, [26, 27, 28])]  # 9, 3, 8, 10 tokens
    padded, _ = build_batch(eps)
    sampled = 5 + 1 + 4 + 6
    train = OmegaConf.create({"ppo_mini_batch_size": 4, "ppo_epochs": 2, "shuffle": False})

    unpacked = minibatch_shards(padded.tensors, train, ranks=1, seed=0)
    assert computed_work(sum(unpacked, [])) == {
        "tokens": 2 * (9 + 3 + 8 + 10),
        "attention_pairs": 2 * (81 + 9 + 64 + 100),
        "head_tokens": 2 * sampled,
    }
    # Rows of at most 20 tokens (twice the longest): episodes 0 and 2 share their prompt (3 + 6 + 5),
    # episode 3 would pass 20 beside them and goes whole, episode 1 has a prompt of its own.
    packed = minibatch_shards(padded.tensors, train, ranks=1, seed=0, capacity=4096, share_prompts=True)
    assert computed_work(sum(packed, [])) == {
        "tokens": 2 * (3 + 6 + 5 + 10 + 3),
        "attention_pairs": 2 * (3**2 + (9**2 - 3**2) + (8**2 - 3**2) + 10**2 + 3**2),
        "head_tokens": 2 * sampled,
    }
    # Three episodes on two ranks: a filler copy evens the shards out and counts nothing.
    odd = build_batch(eps[:3])[0].tensors
    one = OmegaConf.create({"ppo_mini_batch_size": 3, "ppo_epochs": 1, "shuffle": False})
    assert computed_work(sum(minibatch_shards(odd, one, ranks=2, seed=0), [])) == {
        "tokens": 9 + 3 + 8,
        "attention_pairs": 81 + 9 + 64,
        "head_tokens": 5 + 1 + 4,
    }


def test_packed_attention_mask_is_block_diagonal_causal():
    mask = packed_attention_mask(torch.tensor([[1, 1, 2, 2, 0]]))[0, 0].int().tolist()
    assert mask == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 0]]


def test_packed_forward_matches_separate_forwards(hf_engine):
    """The documented worker recipe gives each episode the logits it gets alone."""
    model = hf_engine.model
    eps = [two_turn_episode(), short_episode()]
    padded, _ = build_batch(eps)
    packed, _ = pack(padded.tensors, capacity=16)
    with torch.no_grad():
        mask = packed_attention_mask(packed["segment_ids"])
        joint = model(
            input_ids=packed["input_ids"], attention_mask=mask, position_ids=packed["position_ids"]
        ).logits
        for k, ep in enumerate(eps):
            where = packed["segment_ids"][0] == k + 1
            ids = packed["input_ids"][0][where][None]
            alone = model(input_ids=ids).logits[0]
            assert torch.allclose(joint[0][where], alone, atol=1e-4), k


def windowed_episode():
    """Three turns, each prompted afresh (agent_config.max_context_window): every prompt is whole."""
    turns = [
        Turn([5, 6, 7], [30, 31], [-0.1, -0.2], 0.0, new_context=True),
        Turn([5, 6, 8], [32], [-0.3], 0.0, new_context=True),
        Turn([5, 9], [33, 34, 35], [-0.4, -0.5, -0.6], 1.0, new_context=True),
    ]
    return Episode("taskW", 2, 9, turns, 1.0)


def test_windowed_turns_restart_positions_and_number_their_contexts():
    batch, _ = build_batch([windowed_episode(), short_episode()], pad_token_id=0)
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2, 3, 4]
    assert batch["context_ids"][0].tolist() == [1] * 5 + [2] * 4 + [3] * 5
    assert batch["context_ids"][1].tolist() == [1] * 3 + [0] * 11  # one whole-episode chat, then padding
    plain, _ = build_batch([two_turn_episode(), short_episode()])
    assert "context_ids" not in plain  # a run without windows keeps today's batch, tensor for tensor
    assert plain["position_ids"][0].tolist() == list(range(plain["input_ids"].shape[1]))


@pytest.mark.parametrize("packing", [False, True])
def test_windowed_rows_score_each_turn_prompt_as_if_alone(hf_engine, packing):
    """The worker's scorer, given `attention_spans`, scores every reply from its own prompt only:
    what the engine sampled it from."""
    from grl.rollout.batch import attention_spans
    from grl.workers.heads import POLICY
    from grl.workers.scoring import TokenScorer

    model = hf_engine.model
    eps = [windowed_episode(), two_turn_episode(), short_episode()]
    batch, _ = build_batch(eps, max_episode_length=32)
    tensors, place = pack(batch.tensors, capacity=32) if packing else (batch.tensors, None)
    if packing:  # the windowed episode shares its row, and keeps its context ids
        assert tensors["segment_ids"][place[0][0][0]].max() > 1
        assert torch.equal(
            unpack(tensors["context_ids"], place, batch["context_ids"].shape[1]), batch["context_ids"]
        )
    spans = attention_spans(tensors)
    with torch.no_grad():
        scored, _ = TokenScorer(model, POLICY)(
            tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"], spans, chunk_size=4
        )
        blind, _ = TokenScorer(model, POLICY)(
            tensors["input_ids"],
            tensors["attention_mask"],
            tensors["position_ids"],
            tensors.get("segment_ids"),
            chunk_size=4,
        )
    if packing:
        scored, blind = (unpack(x, place, batch["input_ids"].shape[1]) for x in (scored, blind))
    row, where = 0, batch["attention_mask"][0] > 0
    got, mask = scored[row][where], batch["loss_mask"][row][where]
    start = 0
    for turn in eps[0].turns:
        ids = torch.tensor(turn.prompt_ids + turn.response_ids)
        with torch.no_grad():
            alone = model(input_ids=ids[None]).logits[0].log_softmax(-1)
        want = alone[:-1].gather(-1, ids[1:, None])[:, 0][-len(turn.response_ids) :]
        span = slice(start + len(turn.prompt_ids), start + len(ids))
        assert mask[span].tolist() == [1.0] * len(turn.response_ids)
        assert torch.allclose(got[span], want, atol=1e-4)
        start += len(ids)
    # Scored as one chat (no spans), the later turns' replies see the earlier prompts: other values.
    assert not torch.allclose(blind[row][where][mask > 0], got[mask > 0], atol=1e-3)


def constrained_episodes(seed=0, huge=5000):
    """Episodes whose replies carry allowed sets: small allowed and denied sets, unconstrained
    tokens, one huge set, and a group of episodes that share their first prompt."""
    import random

    rng = random.Random(seed)

    def sets(n):
        kinds = [(0, ())] + [
            (sign * k, tuple(rng.sample(range(1, 3000), k))) for sign in (1, -1) for k in (1, 3)
        ]
        return [rng.choice(kinds) for _ in range(n)]

    def episode(g, member, prompt, replies):
        turns = [
            Turn(prompt if k == 0 else [13, 14], r, None, 0.0, response_allowed=sets(len(r)))
            for k, r in enumerate(replies)
        ]
        return Episode("t", g, g, turns, 1.0, member=member)

    eps = [
        episode(g, m, [10 + g, 11, 12], [[20 + m, 21, 22][: 1 + (g + m) % 3], [23, 24]])
        for g in range(3)
        for m in range(3)
    ]
    eps[4].turns[1].response_allowed[0] = (huge, tuple(range(1, huge + 1)))
    return eps


def padded_sets(sizes, ids, width):
    """The padded form the batch held before: `[rows, T, width]` ids, zero after each set."""
    out = torch.zeros(*sizes.shape, width, dtype=torch.long)
    at = 0
    for r in range(sizes.shape[0]):
        for t in range(sizes.shape[1]):
            n = abs(int(sizes[r, t]))
            out[r, t, :n] = ids[at : at + n]
            at += n
    assert at == len(ids)
    return out


def test_a_huge_set_costs_its_own_ids_only():
    eps = constrained_episodes()
    batch, _ = build_batch(eps)
    total = sum(abs(size) for ep in eps for turn in ep.turns for size, _ in turn.response_allowed)
    assert batch["constraint_ids"].shape == (total,) and batch["constraint_ids"].dtype == torch.int32
    assert (
        padded_sets(batch["constraint_size"], batch["constraint_ids"], 5000).numel()
        == batch["input_ids"].numel() * 5000
    )
    flat = [
        allowed
        for ep in eps
        for turn in ep.turns
        for allowed in [(0, ())] * len(turn.prompt_ids) + turn.response_allowed
    ]
    listed = [s for s in batch["constraint_size"].flatten().tolist() if s]
    assert listed == [size for size, _ in flat if size]
    assert batch["constraint_ids"].tolist() == [i for _, members in flat for i in members]


@pytest.mark.parametrize("share_prompts", [False, True])
def test_every_row_and_token_move_takes_the_sets_along(share_prompts):
    """Each move of the worker boundary, applied to the compact sets, gives what it gives the padded
    form (carried alongside as an ordinary tensor, moved as every tensor was before)."""
    from grl.workers.sharding import equal_shards, pad_rows
    from grl.workers.update import split_rows

    batch, _ = build_batch(constrained_episodes())
    width = int(batch["constraint_size"].abs().max())
    batch["reference_sets"] = padded_sets(batch["constraint_size"], batch["constraint_ids"], width)

    def check(tensors):
        assert torch.equal(
            padded_sets(tensors["constraint_size"], tensors["constraint_ids"], width),
            tensors["reference_sets"],
        )
        return tensors

    check(batch.tensors)
    check(batch.select(torch.tensor([True, False, True, True, False, True, False, True, True])).tensors)
    packed, _ = pack(
        check(batch.select([8, 3, 4, 0, 5, 1]).tensors), capacity=24, share_prompts=share_prompts
    )
    assert ("parent_ids" in packed) == share_prompts
    padded, _ = pad_rows(check(packed), 4)
    assert padded["input_ids"].shape[0] == 4
    for shard in equal_shards(check(padded), 2):
        for micro in split_rows(check(shard), 1, 2):
            check(micro)
    train = OmegaConf.create({"ppo_mini_batch_size": 4, "ppo_epochs": 2, "shuffle": True})
    for capacity in (None, 24):
        for shards in minibatch_shards(batch.tensors, train, 2, 5, capacity, share_prompts):
            for shard in shards:
                check(shard)
