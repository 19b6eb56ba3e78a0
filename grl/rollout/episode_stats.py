"""The rollout's metrics, from its episodes: per-task means and the env-fault counts."""

from __future__ import annotations

import math
from collections.abc import Iterable

from grl.rollout.types import Episode


def finite(values: Iterable[float]) -> list[float]:
    """The finite values: a NaN or an inf that slipped past the env checks never spoils a
    metric, a normalisation or a standard deviation."""
    return [float(v) for v in values if math.isfinite(v)]


def _mean(values: Iterable[float]) -> float:
    kept = finite(values)
    return sum(kept) / len(kept) if kept else 0.0


def rollout_metrics(episodes: list[Episode], truncated_turns: list[int] | None = None) -> dict[str, float]:
    """Per-task means namespaced by task instance (`<task>/success`, ...),
    plus `<task>/num_turns`, `<task>/response_length` (sampled tokens per
    turn), `<task>/score`, and the counts `<task>/env_errors`,
    `<task>/nonfinite_rewards` and `<task>/env_warnings` (see the module doc)."""
    metrics: dict[str, float] = {}
    by_task: dict[str, list[Episode]] = {}
    for ep in episodes:
        by_task.setdefault(ep.task, []).append(ep)
    for task, eps in by_task.items():
        keys = sorted({k for ep in eps for k in ep.metrics})
        for key in keys:
            metrics[f"{task}/{key}"] = _mean([ep.metrics[key] for ep in eps if key in ep.metrics])
        replies = [len(t.response_ids) for ep in eps for t in ep.turns]
        metrics[f"{task}/num_turns"] = _mean([float(len(ep.turns)) for ep in eps])
        metrics[f"{task}/response_length"] = _mean([float(n) for n in replies])
        metrics[f"{task}/score"] = _mean([ep.score for ep in eps])
        for name, counts in _env_fault_counts(eps).items():
            metrics[f"{task}/{name}"] = counts
    metrics["rollout/num_episodes"] = float(len(episodes))
    metrics.update({f"rollout/{name}": counts for name, counts in _env_fault_counts(episodes).items()})
    if truncated_turns is not None:
        metrics["rollout/truncated_prompts"] = float(sum(truncated_turns))
    return metrics


def _env_fault_counts(episodes: list[Episode]) -> dict[str, float]:
    return {
        "env_errors": float(sum(ep.error is not None for ep in episodes)),
        "nonfinite_rewards": float(sum(ep.error_kind == "nonfinite_reward" for ep in episodes)),
        "env_warnings": float(sum(ep.env_warnings for ep in episodes)),
    }
