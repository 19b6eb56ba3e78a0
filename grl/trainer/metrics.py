"""Metrics of one step, computed from plain records: episodes, the batch, timings.

Names follow verl where verl has one (`critic/advantages/mean`,
`response_length/mean`, `timing_s/<phase>`); task metrics are
`env/<task>/<metric>` in training and `val-env/<task>/<metric>` in validation.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from statistics import fmean, pstdev

import torch

from grl.rollout.types import Batch, Episode


def task_metrics(rollout_metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """The rollout's per-task metrics (`<task>/<metric>`) under `prefix/`
    (`env` in training, `val-env` in validation); its `rollout/...` counters
    keep their names in training and go under `val-rollout/` in validation."""
    out = {}
    for name, value in rollout_metrics.items():
        if name.startswith("rollout/"):
            name = name if prefix == "env" else "val-" + name
        else:
            name = f"{prefix}/{name}"
        out[name] = value
    return out


def reward_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Episode rewards as the rollout produced them (before normalisation and filtering)."""
    scores = [e.score for e in episodes]
    if not scores:
        return {}
    return {"reward/mean": fmean(scores), "reward/std": pstdev(scores),
            "reward/max": max(scores), "reward/min": min(scores)}


def _masked_stats(name: str, x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    picked = x[mask > 0]
    if picked.numel() == 0:
        return {}
    return {f"{name}/mean": picked.mean().item(), f"{name}/max": picked.max().item(),
            f"{name}/min": picked.min().item()}


def batch_metrics(batch: Batch) -> dict[str, float]:
    """Lengths, padding, and the advantage/return/value statistics over the loss mask."""
    mask = batch["loss_mask"]
    lengths = batch["attention_mask"].sum(-1).float()
    responses = mask.sum(-1).float()
    out = {
        "batch/rows": float(len(batch)),
        "response_length/mean": responses.mean().item(),
        "response_length/max": responses.max().item(),
        "response_length/min": responses.min().item(),
        "seq_length/mean": lengths.mean().item(),
        "seq_length/max": lengths.max().item(),
        "perf/padding_ratio": 1.0 - lengths.sum().item() / max(batch["attention_mask"].numel(), 1),
    }
    for name, key in (("critic/advantages", "advantages"), ("critic/returns", "returns"),
                      ("critic/values", "values"), ("critic/rewards", "token_rewards")):
        if key in batch:
            out.update(_masked_stats(name, batch[key], mask))
    return out


def throughput_metrics(batch: Batch, timings: dict[str, float]) -> dict[str, float]:
    """Tokens per second of the whole step, of the rollout (generated tokens)
    and of the actor update (every attended token)."""
    tokens = batch["attention_mask"].sum().item()
    generated = batch["loss_mask"].sum().item()
    out = {"perf/total_tokens": float(tokens)}
    if timings.get("step"):
        out["perf/tokens_per_s"] = tokens / timings["step"]
    if timings.get("rollout"):
        out["perf/rollout_tokens_per_s"] = generated / timings["rollout"]
    if timings.get("update_actor"):
        out["perf/update_actor_tokens_per_s"] = tokens / timings["update_actor"]
    return out


class Timer:
    """Wall time per phase: `with timer("rollout"): ...` then `timer.times`."""

    def __init__(self):
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times[phase] = self.times.get(phase, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{phase}": seconds for phase, seconds in self.times.items()}


def rollout_mismatch_metrics(batch) -> dict[str, float]:
    """verl's `training/rollout_probs_diff_*`: how far the engine's log-probs of the sampled tokens
    are from the trainer's (old) log-probs of the same tokens; near 0 when the trained policy is the
    one that sampled."""
    sampled = batch["loss_mask"] > 0
    if not bool(sampled.any()):
        return {}
    diff = (batch["rollout_log_probs"] - batch["old_log_probs"]).abs()[sampled]
    return {"training/rollout_probs_diff_mean": diff.mean().item(), "training/rollout_probs_diff_max": diff.max().item()}
