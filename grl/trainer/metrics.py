"""Metrics of one step, computed from plain records: episodes, the batch, timings.

Names follow GRL and verl where they have one (`critic/advantages/mean`,
`response_length/mean`, `timing_s/gen`, `perf/throughput`), so W&B panels line
up; task metrics are `train/<task>/<metric>` in training and
`val-env/<task>/<metric>` in validation. The batch holds one episode per row (packing
happens at the workers' boundary), so lengths and padding are the padded batch's.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from statistics import fmean, pstdev

import torch

from grl.algo.mismatch import KEYS as MISMATCH_KEYS
from grl.algo.mismatch import mismatch_stats
from grl.planner import ModelShape, PlanError, model_shape, peak_flops, train_flops
from grl.machine import cuda_device
from grl.rollout.episode_stats import finite
from grl.rollout.types import Batch, Episode


def task_metrics(rollout_metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """The rollout's per-task metrics (`<task>/<metric>`) under `prefix/`
    (`train` in training, `val-env` in validation); its `rollout/...` and `gateway/...` counters
    keep their names in training and go under `val-rollout/`, `val-gateway/` in validation."""
    out = {}
    for name, value in rollout_metrics.items():
        if name.startswith(("rollout/", "gateway/")):
            name = name if prefix == "train" else "val-" + name
        else:
            name = f"{prefix}/{name}"
        out[name] = value
    return out


def turn_length_metrics(
    episodes: list[Episode], max_response_length: int, validation: bool
) -> dict[str, float]:
    """Over the turns of all tasks: in validation the mean sampled tokens (`val-env/response_length`),
    in training the share cut at `max_response_length` (`response_length/clip_ratio`)."""
    lengths = [len(t.response_ids) for ep in episodes for t in ep.turns]
    if not lengths:
        return {}
    if validation:
        return {"val-env/response_length": fmean(lengths)}
    return {"response_length/clip_ratio": fmean([n >= max_response_length for n in lengths])}


def reward_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Episode rewards as the rollout produced them (before normalisation and filtering); a
    non-finite score (the env checks keep them out) is skipped, never crashes `pstdev`."""
    scores = finite(e.score for e in episodes)
    if not scores:
        return {}
    return {
        "reward/mean": fmean(scores),
        "reward/std": pstdev(scores),
        "reward/max": max(scores),
        "reward/min": min(scores),
    }


def _masked_stats(name: str, x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    picked = x[mask > 0]
    if picked.numel() == 0:
        return {}
    return {
        f"{name}/mean": picked.mean().item(),
        f"{name}/max": picked.max().item(),
        f"{name}/min": picked.min().item(),
    }


def _stats(name: str, x: torch.Tensor) -> dict[str, float]:
    return {f"{name}/mean": x.mean().item(), f"{name}/max": x.max().item(), f"{name}/min": x.min().item()}


def episode_token_counts(batch: Batch, key: str) -> torch.Tensor:
    """Per episode (row), the tokens where `batch[key] > 0`."""
    return (batch[key] > 0).sum(-1).float()


LOGGED_TURNS = 16  # a curve per turn up to here; later turns count in critic/advantages/mean only


def turn_advantage_metrics(batch: Batch) -> dict[str, float]:
    """`critic/advantages/turn_<k>`: the mean advantage of the tokens written in turn k (1-based), where
    step-level credit (GiGPO's step groups, GAE over turns) puts it turn by turn; under GRPO every turn of
    an episode carries the episode's advantage."""
    if "advantages" not in batch:
        return {}
    written, turns = batch["loss_mask"] > 0, batch["turn_ids"]
    out = {}
    for k in range(LOGGED_TURNS):
        picked = batch["advantages"][written & (turns == k)]
        if picked.numel():
            out[f"critic/advantages/turn_{k + 1}"] = picked.mean().item()
    return out


def batch_metrics(batch: Batch) -> dict[str, float]:
    """Lengths per episode, padding, episode scores (`critic/score`), and the
    advantage/return/value statistics over the loss mask."""
    mask = batch["loss_mask"]
    lengths = episode_token_counts(batch, "attention_mask")
    responses = episode_token_counts(batch, "loss_mask")
    out = {
        "batch/episodes": float(
            len(batch)
        ),  # one per row: packing happens only between a group and its ranks
        **_stats("response_length", responses),
        **_stats("prompt_length", lengths - responses),  # every token the policy did not write
        "seq_length/mean": lengths.mean().item(),
        "seq_length/max": lengths.max().item(),
        "perf/padding_ratio": 1.0 - lengths.sum().item() / max(batch["attention_mask"].numel(), 1),
    }
    scores = batch.meta.get("raw_score")
    if scores:
        out.update(_stats("critic/score", torch.tensor(scores, dtype=torch.float64)))
    for name, key in (
        ("critic/advantages", "advantages"),
        ("critic/returns", "returns"),
        ("critic/values", "values"),
        ("critic/rewards", "token_rewards"),
    ):
        if key in batch:
            out.update(_masked_stats(name, batch[key], mask))
    out.update(turn_advantage_metrics(batch))
    if "values" in batch and "returns" in batch:
        from grl.algo import masked_var

        residual = masked_var(batch["returns"] - batch["values"], mask)
        out["critic/vf_explained_var"] = (1.0 - residual / (masked_var(batch["returns"], mask) + 1e-5)).item()
    return out


def throughput_metrics(
    batch: Batch,
    timings: dict[str, float],
    n_gpus: int,
    shape: ModelShape | None = None,
    peak_flops: float = 0.0,
    actor_update: dict[str, float] | None = None,
) -> dict[str, float]:
    """As verl: tokens per second per device (`perf/throughput`), step time, and each
    phase's milliseconds per token (generated tokens for `gen`, every token otherwise);
    plus ours: tokens per second of the step, the rollout and the actor update. With the
    policy's `shape`, the device's `peak_flops` and the `actor_update`'s metrics, `perf/mfu/actor`:
    the model FLOPs of the work the update's ranks computed (`perf/actor/computed_*`,
    grl/workers/sharding.py `computed_work`: a shared prompt once, the head on the scored tokens) per
    device, over the update time. verl counts every episode whole, which packing does not compute."""
    tokens = (batch["attention_mask"] > 0).sum().item()
    generated = (batch["loss_mask"] > 0).sum().item()
    out = {"perf/total_tokens": float(tokens), "perf/total_num_tokens": float(tokens)}
    for phase, seconds in timings.items():
        out[f"timing_per_token_ms/{phase}"] = 1000 * seconds / max(generated if phase == "gen" else tokens, 1)
    if timings.get("step"):
        out["perf/time_per_step"] = timings["step"]
        out["perf/throughput"] = tokens / (timings["step"] * max(n_gpus, 1))
        out["perf/tokens_per_s"] = tokens / timings["step"]
    if timings.get("gen"):
        out["perf/rollout_tokens_per_s"] = generated / timings["gen"]
    if timings.get("update_actor"):
        out["perf/update_actor_tokens_per_s"] = tokens / timings["update_actor"]
        computed = actor_update or {}
        if shape is not None and peak_flops > 0 and "perf/actor/computed_tokens" in computed:
            flops = train_flops(
                shape,
                int(computed["perf/actor/computed_tokens"]),
                int(computed["perf/actor/computed_attention_pairs"]),
                int(computed["perf/actor/computed_head_tokens"]),
            )
            out["perf/mfu/actor"] = flops / (timings["update_actor"] * peak_flops * max(n_gpus, 1))
    return out


def mfu_inputs(model_path: str, device: str, actor=None) -> tuple[ModelShape | None, float]:
    """The policy's shape and one rank's matmul peak, for `perf/mfu/actor`. A GPU's is its bf16 datasheet
    peak (the name asked without a CUDA context in the driver, grl/machine.py); a CPU rank measures its own
    (grl/workers/peak.py: `actor`, the policy's worker group, runs it). (None, 0.0) where neither is known:
    an unknown GPU, no GPU seen, or a model whose shape cannot be read; no MFU is reported then."""
    try:
        shape = model_shape(model_path)
    except PlanError:
        return None, 0.0
    if device == "cpu":
        if actor is None:
            return None, 0.0
        from grl.workers.peak import rank_peak

        peaks = actor.execute(rank_peak, shape.hidden, shape.intermediate)
        return shape, sum(peaks) / len(peaks)
    gpu = cuda_device()
    peak = 0.0 if gpu is None else peak_flops(gpu.name)
    return (shape, peak) if peak else (None, 0.0)


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


def on_policy_mismatch(update_metrics: dict[str, float]) -> dict[str, float]:
    """The actor's update metrics, with the engine/trainer mismatch that an on-policy update measured
    (no old log-prob pass) under the names `rollout_mismatch_metrics` gives it."""
    renamed = {f"actor/{key}": f"training/{key}" for key in MISMATCH_KEYS}
    return {renamed.get(k, k): v for k, v in update_metrics.items()}


def rollout_mismatch_metrics(batch) -> dict[str, float]:
    """How far the engine's log-probs of the sampled tokens are from the trainer's (old) log-probs of the
    same tokens, near 0 when the trained policy is the one that sampled: verl's
    `training/rollout_probs_diff_{mean,max,std}` (|delta p|) and
    `training/rollout_logprob_diff_{mean,max,p99}`
    (|delta log p|, nats), grl/algo/mismatch.py."""
    sampled = batch["loss_mask"] > 0
    stats = mismatch_stats(batch["rollout_log_probs"][sampled], batch["old_log_probs"][sampled])
    return {f"training/{k}": v for k, v in stats.items()}


def old_log_prob_metrics(batch, cap: float) -> dict[str, float]:
    """What the old-log-prob pass shows: the engine against the trainer (`rollout_mismatch_metrics`) and,
    with truncated importance sampling (`tis_imp_ratio_cap` C > 0), the weights pi_old / pi_engine of the
    sampled tokens: their mean and largest value before truncation, and the share truncated to C."""
    sampled = batch["loss_mask"] > 0
    if cap <= 0 or not bool(sampled.any()):
        return rollout_mismatch_metrics(batch)
    ratio = (batch["old_log_probs"] - batch["rollout_log_probs"])[sampled].clamp(max=20.0).exp()
    return {
        **rollout_mismatch_metrics(batch),
        "training/is_ratio_mean": ratio.mean().item(),
        "training/is_ratio_max": ratio.max().item(),
        "training/is_ratio_clipped_frac": (ratio > cap).float().mean().item(),
    }
