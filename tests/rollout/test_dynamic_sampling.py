"""Dynamic sampling with top-up on the real rollout: the tiny model plays the CPU preset's one-gap Tetris,
and the topped-up step is checked against a slow reference built from the rounds the rollout played."""

from functools import partial

import pytest

from grl.engines.base import SamplingParams
from grl.rollout.dynamic_sampling import groups_of, has_spread, with_top_up
from tests.rollout.test_multi_turn import real_task, rollout

GROUPS, SIZE, BASE_SEED = 8, 2, 5000
SAMPLING = SamplingParams(temperature=1.0, seed=3)


@pytest.fixture(scope="module")
def played(hf_engine, tokenizer):
    """The step with 3 top-up rounds, and every round the rollout played for it, in order."""
    runner = rollout(hf_engine, tokenizer)
    task = real_task("tetrisAgent_gap_dim_4", groups=GROUPS, size=SIZE, max_turns=3)
    rounds = []

    def play(base_seed):
        result = runner.run([task], base_seed, SAMPLING)
        rounds.append((base_seed, result))
        return result

    return with_top_up(play, BASE_SEED, rounds=3), rounds, partial(runner.run, [task], sampling=SAMPLING)


def rows(members):
    return [(ep.seed, ep.member, ep.score, [t.response_ids for t in ep.turns]) for ep in members]


def flat_count(result):
    return sum(not has_spread(m) for m in groups_of(result.episodes).values())


def reference(rounds):
    """Group by group of the first round: kept if it has spread, else the first group with spread of the
    later rounds not yet taken, in round then group order (or kept flat when none is left)."""
    spare = [
        members
        for _, result in rounds[1:]
        for members in groups_of(result.episodes).values()
        if has_spread(members)
    ]
    out = []
    for members in groups_of(rounds[0][1].episodes).values():
        chosen = members if has_spread(members) or not spare else spare.pop(0)
        out.append(rows(chosen))
    return out


def test_flat_groups_are_replaced_by_fresh_groups_with_spread_as_the_reference_does(played):
    result, rounds, _ = played
    assert flat_count(rounds[0][1]) > 0, "the first round must have a flat group to replace"
    got = [rows(members) for members in groups_of(result.episodes).values()]
    assert got == reference(rounds)
    assert len(got) == GROUPS and all(len(members) == SIZE for members in got)
    assert flat_count(result) == 0 or len(rounds) == 4, (
        "rounds stop only when no flat group is left or all were drawn"
    )
    assert result.metrics["rollout/top_up_rounds"] == len(rounds) - 1
    assert result.metrics["rollout/top_up_groups"] == sum(a != b for a, b in zip(got, reference(rounds[:1])))


def test_every_round_plays_new_puzzles_and_a_group_s_seed_still_follows_its_id(played):
    result, rounds, _ = played
    seeds = [{ep.seed for ep in r.episodes} for _, r in rounds]
    assert sum(len(s) for s in seeds) == len(set().union(*seeds)) == GROUPS * len(rounds)
    assert all(ep.seed == BASE_SEED + ep.group_id for ep in result.episodes)
    assert len({ep.uid for ep in result.episodes}) == len(result.episodes)


def test_the_step_s_metrics_are_the_first_round_s(played):
    result, rounds, _ = played
    first = rounds[0][1].metrics
    assert {k: result.metrics[k] for k in first} == first
    assert result.metrics["rollout/flat_groups_sampled"] == flat_count(rounds[0][1])


def test_no_top_up_plays_once_and_changes_nothing(played):
    _, rounds, run = played
    calls = []
    result = with_top_up(lambda seed: calls.append(seed) or run(seed), BASE_SEED, rounds=0)
    assert calls == [BASE_SEED] and result.metrics["rollout/top_up_rounds"] == 0
    assert [(ep.seed, ep.score) for ep in result.episodes] == [
        (ep.seed, ep.score) for ep in rounds[0][1].episodes
    ]
