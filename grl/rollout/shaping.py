"""Reward normalisation and group filtering, as RAGEN defines them.

Normalisation (`rollout.reward_normalization`) rescales episode scores within
sets of episodes chosen by `grouping`:
- `state`: the episodes of one group (same seed, so the same puzzle);
- `inductive`: the episodes of one task instance;
- `batch`: all episodes of the step.
and `method`:
- `identity`: unchanged;
- `mean_std`: (x - mean) / (std + 1e-6) with the sample standard deviation
  (n - 1 in the denominator); a set whose std is at most 1e-6 (all equal, or
  a single episode) becomes all zeros;
- `asym_clip`: mean_std, then clipped to [-1, 3], so that a rare success in a
  hard group keeps a large push while failures are not punished below -1.
As in RAGEN, when every set holds a single episode (e.g. group size 1 under
`state`), nothing is normalised. Scores include the format penalty. A
non-finite score (which the env checks keep out; defence in depth) is left
as it is, for the trainer to drop, and takes no part in its set's statistics.

Filtering (`rollout_filter_ratio`, `rollout_filter_type`) keeps, per task,
the `floor(ratio * groups)` groups (at least one) with the largest (`std`)
or smallest (`std_rev`) sample standard deviation of raw episode scores;
ties go to the earlier group. Groups of a single episode have std 0; the
statistics of a group skip its non-finite scores.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from grl.rollout.episode_stats import finite
from grl.rollout.types import Episode

STD_EPS = 1e-6
ASYM_CLIP = (-1.0, 3.0)


def sample_std(values: Sequence[float]) -> float:
    values = finite(values)
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def normalize(scores: Sequence[float], keys: Sequence[Hashable], method: str) -> list[float]:
    """Scores normalised within the sets of equal `keys`."""
    out = [float(s) for s in scores]
    sets: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        sets.setdefault(key, []).append(i)
    if method == "identity" or len(sets) == len(out):
        return out
    for members in sets.values():
        values = finite(out[i] for i in members)
        mean, std = sum(values) / max(len(values), 1), sample_std(values)
        for i in members:
            if not math.isfinite(out[i]):
                continue
            z = (out[i] - mean) / (std + STD_EPS) if std > STD_EPS else 0.0
            out[i] = min(max(z, ASYM_CLIP[0]), ASYM_CLIP[1]) if method == "asym_clip" else z
    return out


GROUPINGS = {"state": lambda ep: ep.group_id, "inductive": lambda ep: ep.task, "batch": lambda ep: 0}


def grouping_keys(episodes: Sequence[Episode], grouping: str) -> list[Hashable]:
    return [GROUPINGS[grouping](ep) for ep in episodes]


def normalize_episode_scores(episodes: Sequence[Episode], grouping: str, method: str) -> list[float]:
    """One normalised score per episode (to pass to `build_batch(scores=...)`)."""
    return normalize([ep.score for ep in episodes], grouping_keys(episodes, grouping), method)


def filter_groups(
    episodes: Sequence[Episode], ratio: float, kind: str = "std"
) -> tuple[list[Episode], dict[str, float]]:
    """Keep the groups with the most (`std`) or least (`std_rev`) reward spread, per task."""
    groups: dict[int, list[Episode]] = {}
    for ep in episodes:
        groups.setdefault(ep.group_id, []).append(ep)
    by_task: dict[str, list[int]] = {}
    for gid, members in groups.items():
        by_task.setdefault(members[0].task, []).append(gid)

    kept_ids: set[int] = set()
    metrics: dict[str, float] = {}
    all_stats, kept_stats = [], []
    for task, gids in by_task.items():
        stats = {g: _group_stats([ep.score for ep in groups[g]]) for g in gids}
        count = max(1, int(ratio * len(gids) + 1e-9))
        sign = -1.0 if kind == "std" else 1.0
        position = {g: n for n, g in enumerate(gids)}
        chosen = sorted(gids, key=lambda g: (sign * stats[g][0], position[g]))[:count]
        kept_ids.update(chosen)
        for name, values in (
            ("in_group", [stats[g] for g in gids]),
            ("chosen_in_group", [stats[g] for g in chosen]),
        ):
            for j, stat in enumerate(("std", "max", "mean")):
                metrics[f"{task}/{name}_{stat}"] = sum(v[j] for v in values) / len(values)
        metrics[f"{task}/kept_groups"] = float(len(chosen))
        all_stats += [stats[g] for g in gids]
        kept_stats += [stats[g] for g in chosen]
    kept = [ep for ep in episodes if ep.group_id in kept_ids]
    if all_stats:
        for j, stat in enumerate(("std", "max", "mean")):
            metrics[f"rollout/in_group_{stat}"] = sum(v[j] for v in all_stats) / len(all_stats)
            metrics[f"rollout/chosen_in_group_{stat}"] = sum(v[j] for v in kept_stats) / len(kept_stats)
    metrics["rollout/kept_groups"] = float(len(kept_ids))
    metrics["rollout/kept_episodes"] = float(len(kept))
    return kept, metrics


def _group_stats(scores: list[float]) -> tuple[float, float, float]:
    scores = finite(scores)
    if not scores:
        return 0.0, 0.0, 0.0
    return sample_std(scores), max(scores), sum(scores) / len(scores)
