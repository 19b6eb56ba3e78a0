"""Dynamic sampling with top-up (DAPO): a group whose attempts all scored alike has no reward spread, so a
group-relative estimator gives it zero advantage and the update learns nothing from it. With
`rollout.top_up_rounds` > 0 a step plays fresh puzzles (each round the step's group count again, at seeds
no other group of the run uses) and puts groups that have spread in the place of flat ones, task by task,
until no flat group is left or the rounds are spent. The batch keeps its size: the update's cost does not
grow, only generation's, and only while groups are flat.

The step's training metrics (success, turns, ...) stay those of the first round: a sample of the task as
it is, not of the groups picked for their spread."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from grl.rollout.clock import add_times
from grl.rollout.multi_turn import RolloutResult
from grl.rollout.shaping import STD_EPS, sample_std
from grl.rollout.types import Episode


def groups_of(episodes: list[Episode]) -> dict[int, list[Episode]]:
    groups: dict[int, list[Episode]] = {}
    for ep in episodes:
        groups.setdefault(ep.group_id, []).append(ep)
    return groups


def has_spread(members: list[Episode]) -> bool:
    return sample_std([ep.score for ep in members]) > STD_EPS


def flat_group_count(episodes: list[Episode]) -> int:
    return sum(not has_spread(members) for members in groups_of(episodes).values())


def replace_flat_groups(
    episodes: list[Episode], extra: list[Episode], id_offset: int
) -> tuple[list[Episode], int]:
    """`episodes` with each flat group replaced, in order and within its task, by the next group of `extra`
    of that task that has spread (its group id moved up by `id_offset`, so ids stay unique).
    -> (episodes, groups replaced)."""
    spare: dict[str, list[list[Episode]]] = {}
    for members in groups_of(extra).values():
        if has_spread(members):
            spare.setdefault(members[0].task, []).append(members)
    out, replaced = [], 0
    for members in groups_of(episodes).values():
        fresh = spare.get(members[0].task)
        if not has_spread(members) and fresh:
            members = [replace(ep, group_id=ep.group_id + id_offset) for ep in fresh.pop(0)]
            replaced += 1
        out += members
    return out, replaced


def with_top_up(play: Callable[[int], RolloutResult], base_seed: int, rounds: int) -> RolloutResult:
    """`play(base_seed)` once, then up to `rounds` more times at fresh base seeds while groups are flat.
    A group's seed is its base seed + its group id (grl.rollout.multi_turn), so round r starts at
    base_seed + r x (the step's group count): every round's puzzles differ from every other's."""
    first = play(base_seed)
    episodes, group_count = first.episodes, len(groups_of(first.episodes))
    drawn = replaced = 0
    flat_before = flat_group_count(episodes)
    times = first.times
    while drawn < rounds and flat_group_count(episodes) > 0:
        drawn += 1
        offset = drawn * group_count
        more = play(base_seed + offset)
        episodes, count = replace_flat_groups(episodes, more.episodes, offset)
        replaced += count
        times = add_times(times, more.times)
    metrics = {
        **first.metrics,
        "rollout/flat_groups_sampled": float(flat_before),
        "rollout/top_up_rounds": float(drawn),
        "rollout/top_up_groups": float(replaced),
    }
    return RolloutResult(episodes, metrics, times)
