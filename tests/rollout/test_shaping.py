"""Reward normalisation and group filtering against hand-computed values."""

import math

import pytest

from grl.rollout.shaping import (
    filter_groups,
    normalize,
    normalize_episode_scores,
    sample_std,
)
from grl.rollout.types import Episode


def episodes(spec):
    """spec: list of (task, group_id, [scores])."""
    return [
        Episode(task, gid, 100 + gid, [], s, member=m)
        for task, gid, scores in spec
        for m, s in enumerate(scores)
    ]


def test_sample_std_uses_n_minus_one():
    assert sample_std([1, 0, 0, 0]) == pytest.approx(0.5)
    assert sample_std([0, 10]) == pytest.approx(math.sqrt(50))
    assert sample_std([3.0]) == 0.0


def test_mean_std_per_state_group():
    eps = episodes([("a", 0, [1, 0, 0, 0]), ("a", 1, [2, 2]), ("a", 2, [0, 10])])
    got = normalize_episode_scores(eps, "state", "mean_std")
    s = math.sqrt(50)
    want = [0.75 / 0.5, -0.25 / 0.5, -0.25 / 0.5, -0.25 / 0.5, 0.0, 0.0, -5 / s, 5 / s]
    assert got == pytest.approx(want, rel=1e-5)


def test_asym_clip_clips_to_minus_one_and_three():
    one_success = [10.0] + [0.0] * 19  # z = 9.5 / sqrt(5) = 4.25 -> 3; failures -0.5 / sqrt(5)
    one_failure = [0.0] + [10.0] * 19  # z = -4.25 -> -1; successes +0.2236
    got = normalize(one_success + one_failure, [0] * 20 + [1] * 20, "asym_clip")
    assert got[0] == 3.0
    assert got[1:20] == pytest.approx([-0.5 / math.sqrt(5)] * 19, rel=1e-5)
    assert got[20] == -1.0
    assert got[21:] == pytest.approx([0.5 / math.sqrt(5)] * 19, rel=1e-5)
    assert normalize(one_success, [0] * 20, "mean_std")[0] == pytest.approx(9.5 / math.sqrt(5), rel=1e-5)


def test_batch_and_inductive_grouping():
    eps = episodes([("a", 0, [0, 2]), ("b", 1, [4, 6]), ("a", 2, [1, 1])])
    scores = [0, 2, 4, 6, 1, 1]
    mean, std = sum(scores) / 6, sample_std(scores)
    assert normalize_episode_scores(eps, "batch", "mean_std") == pytest.approx(
        [(x - mean) / std for x in scores], rel=1e-5
    )
    a = [0, 2, 1, 1]  # task a: mean 1, std sqrt(2/3)
    sa = math.sqrt(2 / 3)
    got = normalize_episode_scores(eps, "inductive", "mean_std")
    assert got == pytest.approx([-1 / sa, 1 / sa, -1 / math.sqrt(2), 1 / math.sqrt(2), 0, 0], rel=1e-5)
    assert sample_std(a) == pytest.approx(sa)


def test_identity_and_singleton_sets_leave_scores():
    eps = episodes([("a", 0, [3]), ("a", 1, [5])])
    assert normalize_episode_scores(eps, "state", "mean_std") == [3.0, 5.0]  # every set has one episode
    assert normalize_episode_scores(eps, "batch", "identity") == [3.0, 5.0]


def test_filter_keeps_largest_or_smallest_spread():
    # stds: g0 0, g1 sqrt(2), g2 sqrt(0.5), g3 sqrt(8)
    eps = episodes([("a", 0, [1, 1]), ("a", 1, [0, 2]), ("a", 2, [0, 1]), ("a", 3, [0, 4])])
    kept, metrics = filter_groups(eps, 0.5, "std")
    assert sorted({e.group_id for e in kept}) == [1, 3]
    assert len(kept) == 4
    assert metrics["a/kept_groups"] == 2
    assert metrics["a/in_group_std"] == pytest.approx((0 + math.sqrt(2) + math.sqrt(0.5) + math.sqrt(8)) / 4)
    assert metrics["a/chosen_in_group_std"] == pytest.approx((math.sqrt(2) + math.sqrt(8)) / 2)
    assert metrics["a/chosen_in_group_max"] == pytest.approx(3.0)
    kept, metrics = filter_groups(eps, 0.5, "std_rev")
    assert sorted({e.group_id for e in kept}) == [0, 2]
    assert metrics["rollout/kept_episodes"] == 4
    kept, _ = filter_groups(eps, 1.0, "std")
    assert kept == eps


def test_filter_is_per_task():
    # Task a's groups all spread more than task b's: a global top-half would drop b entirely.
    eps = episodes([("a", 0, [0, 10]), ("a", 1, [0, 8]), ("b", 2, [0, 1]), ("b", 3, [0, 0.5])])
    kept, metrics = filter_groups(eps, 0.5, "std")
    assert sorted({e.group_id for e in kept}) == [0, 2]
    assert metrics["a/kept_groups"] == 1 and metrics["b/kept_groups"] == 1
    assert metrics["rollout/kept_groups"] == 2
    # At least one group per task survives a tiny ratio; ties go to the earlier group.
    kept, _ = filter_groups(episodes([("a", 0, [1, 1]), ("a", 1, [2, 2])]), 0.1, "std")
    assert {e.group_id for e in kept} == {0}
