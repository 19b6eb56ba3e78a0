"""Packed rows aggregate per episode: every loss of a packed layout equals the padded one's."""

import math

import pytest
import torch

from grl.algo import AGG_MODES, agg_loss, policy_loss, truncated_is_weights
from grl.workers.sharding import pack, unpack
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
            p_loss[r, start : start + n], p_mask[r, start : start + n] = loss[i, :n], mask[i, :n]
            seg[r, start : start + n], seq[r, start : start + n] = s, i
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
    assert weighted.item() == pytest.approx((-(adv * w)).mean().item()) and plain.item() == pytest.approx(
        -adv.mean().item()
    )


def test_pack_lays_episodes_side_by_side_and_unpack_restores_them():
    (loss, mask), (p_loss, p_mask, seg, _) = padded_and_packed()
    lengths = torch.tensor(LENGTHS)
    attention = (torch.arange(loss.shape[1]) < lengths[:, None]).long()
    packed, where = pack({"loss": loss, "loss_mask": mask, "attention_mask": attention}, capacity=8)
    assert where == [
        [(1, 0, 5)],
        [(1, 5, 3)],
        [(0, 0, 6)],
        [(0, 6, 2)],
    ]  # first-fit decreasing: 6 + 2 and 5 + 3
    assert packed["segment_ids"].tolist() == [[1] * 6 + [2] * 2, [1] * 5 + [2] * 3]
    assert torch.equal(packed["loss"][1], torch.cat([loss[0, :5], loss[1, :3]]))
    short, _ = pack({"loss": loss[:2], "attention_mask": attention[:2]}, capacity=8)  # 5 + 3 fill one row
    assert packed["loss"].shape == (2, 8) and short["segment_ids"].tolist() == [[1] * 5 + [2] * 3]
    assert torch.equal(unpack(packed["loss"], where, loss.shape[1]), loss * attention)
    assert torch.equal(unpack(packed["loss_mask"], where, mask.shape[1]), mask)


def test_micro_batches_count_episodes():
    seg = torch.tensor([[1, 1, 2], [1, 2, 2], [1, 0, 0], [1, 1, 1]])
    parts = split_rows({"segment_ids": seg}, 3)
    assert [len(p["segment_ids"]) for p in parts] == [1, 2, 1]  # 2 | 2 + 1 | 1
    shared = {
        "segment_ids": torch.tensor([[1, 2, 3, 4], [1, 2, 0, 0]]),  # row 0: a prompt (1) and 3 rests
        "parent_ids": torch.tensor([[0, 1, 1, 1], [0, 0, 0, 0]]),
    }
    assert [len(p["segment_ids"]) for p in split_rows(shared, 3)] == [
        1,
        1,
    ]  # 3 | 2: a shared prompt is no episode
    assert [len(p["segment_ids"]) for p in split_rows(shared, 5)] == [2]


def test_an_unknown_aggregation_mode_is_refused_not_read_as_another():
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'seq-sum'; choose one of: token-mean"):
        agg_loss(torch.ones(1, 3), torch.ones(1, 3), "seq-sum")
