"""Packed rows aggregate per episode: every loss of a packed layout equals the padded one's."""

import math

import pytest
import torch

from grl.algo import AGG_MODES, agg_loss, finite_episodes, policy_loss, truncated_is_weights
from grl.rollout.batch import repack, unpack
from grl.workers.update import loss_units, split_rows

LENGTHS = [5, 3, 6, 2]
LAYOUT = [[0, 1], [2, 3]]  # two packed rows of two episodes each


def padded_and_packed(seed=0):
    g = torch.Generator().manual_seed(seed)
    width = max(LENGTHS)
    loss = torch.randn(len(LENGTHS), width, generator=g)
    mask = torch.zeros(len(LENGTHS), width)
    for i, n in enumerate(LENGTHS):
        mask[i, 1:n] = 1.0
    packed_width = max(sum(LENGTHS[i] for i in row) for row in LAYOUT)
    p_loss, p_mask = torch.zeros(len(LAYOUT), packed_width), torch.zeros(len(LAYOUT), packed_width)
    seg = torch.zeros(len(LAYOUT), packed_width, dtype=torch.long)
    seq = torch.full((len(LAYOUT), packed_width), -1, dtype=torch.long)
    for r, row in enumerate(LAYOUT):
        start = 0
        for s, i in enumerate(row, start=1):
            n = LENGTHS[i]
            p_loss[r, start:start + n], p_mask[r, start:start + n] = loss[i, :n], mask[i, :n]
            seg[r, start:start + n], seq[r, start:start + n] = s, i
            start += n
    return (loss, mask), (p_loss, p_mask, seg, seq)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_agg_loss_of_packed_rows_equals_padded(mode):
    (loss, mask), (p_loss, p_mask, seg, _) = padded_and_packed()
    want = agg_loss(loss, mask, mode)
    assert agg_loss(p_loss, p_mask, mode, seg).item() == pytest.approx(want.item(), abs=1e-6)
    if mode != "token-mean":  # without segment ids a packed row would count as one episode
        assert agg_loss(p_loss, p_mask, mode).item() != pytest.approx(want.item(), abs=1e-3)
    assert loss_units(p_mask, mode, seg) == loss_units(mask, mode)


def test_truncated_is_weights_cap_and_scale_the_policy_loss():
    old = torch.tensor([[-1.0, -2.0, -0.5]])
    rollout = torch.tensor([[-1.5, -1.0, -0.5]])
    w = truncated_is_weights(old, rollout, cap=1.2)
    assert w[0].tolist() == pytest.approx([1.2, math.exp(-1.0), 1.0])
    mask, adv = torch.ones(1, 3), torch.tensor([[1.0, -2.0, 0.5]])
    plain, _ = policy_loss(old, old, adv, mask)
    weighted, _ = policy_loss(old, old, adv, mask, is_weights=w)
    assert weighted.item() == pytest.approx((-(adv * w)).mean().item()) and plain.item() == pytest.approx(-adv.mean().item())


def test_a_non_finite_episode_drops_alone_from_its_packed_row():
    (_, _), (p_loss, p_mask, seg, _) = padded_and_packed()
    p_loss[0, 6] = math.nan  # episode 1 (second in row 0)
    ok = finite_episodes(p_loss, loss_mask=p_mask, segment_ids=seg)
    assert ok[0].tolist() == [True] * 5 + [False] * 3
    assert ok[1].all()
    assert not finite_episodes(p_loss, loss_mask=p_mask)[0].any()  # unpacked view: the whole row


def test_repack_keeps_the_chosen_episodes_whole():
    (loss, _), (p_loss, p_mask, seg, seq) = padded_and_packed()
    tensors = {"loss": p_loss, "loss_mask": p_mask, "segment_ids": seg, "seq_ids": seq}
    mini = repack(tensors, [3, 0])
    assert sorted(set(mini["seq_ids"][mini["seq_ids"] >= 0].tolist())) == [0, 3]
    restored = unpack(mini["loss"], torch.where(mini["seq_ids"] == 3, 1, torch.where(mini["seq_ids"] == 0, 0, -1)))
    assert torch.equal(restored[0, :LENGTHS[0]], loss[0, :LENGTHS[0]])
    assert torch.equal(restored[1, :LENGTHS[3]], loss[3, :LENGTHS[3]])
    assert set(mini["segment_ids"].unique().tolist()) <= {0, 1, 2}


def test_micro_batches_count_episodes():
    seg = torch.tensor([[1, 1, 2], [1, 2, 2], [1, 0, 0], [1, 1, 1]])
    parts = split_rows({"segment_ids": seg}, 3)
    assert [len(p["segment_ids"]) for p in parts] == [1, 2, 1]  # 2 | 2 + 1 | 1
