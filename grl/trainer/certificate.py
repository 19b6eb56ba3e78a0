"""A certificate per training step: one console line and `certificate/*` metrics saying that the step
trained on what was sampled, each figure with a limit past which the run stops with one line.

- weights: every engine holds the weights the trainer sent (a digest of each tensor on both sides,
  grl/engines/weights.py, checked at each sync where it happens; a mismatch is always fatal);
- log-prob gap: mean and max |engine - trainer| log-prob of the sampled tokens, from the old-log-prob
  pass or the on-policy update where one scores them, else from a random share of the step's episodes
  that the actor scores for it (`trainer.certificate.logprob_check_fraction`);
- prefix breaks: prompts that do not continue their episode's tokens (the gateway's, left-truncated
  and windowed prompts);
- staleness: policy versions between the weights that sampled each trained episode and those trained;
- infrastructure: the share of sampled episodes the infrastructure ended (`rollout/infra_failed_episodes`;
  its limit is the rollout's own, `rollout.max_infra_failed_ratio`, which stops the run before the update);
- trained tokens: loss-mask tokens of the trained batch as a share of the tokens the engine sampled.
"""

from __future__ import annotations

import math

import torch

from grl.algo.mismatch import mismatch_stats
from grl.engines.weights import WeightsMismatch
from grl.rollout import Batch
from grl.trainer.metrics import Timer

PREFIX = "certificate/"
INFRA_FAILED = "rollout/infra_failed_episodes"
GAP_SOURCES = (
    "training/rollout_logprob_diff_mean",
    "training/rollout_logprob_diff_max",
)  # a pass or the update


class CertificateBroken(RuntimeError):
    """A step's certificate is past one of its limits."""


STOPS = (WeightsMismatch, CertificateBroken)  # what ends a run with the certificate's one line


class CheckedLogProbs:
    """PPO's old log-probs from `inner` (grl/trainer/pipeline.py); where they are the engine's own and
    the engine samples the weights about to be trained (no rollout ahead), also the engine/trainer gap
    on a random share of the episodes, scored by the actor for it."""

    def __init__(self, inner, actor, fraction: float, engine_log_probs: bool, seed: int):
        self.inner, self.actor, self.fraction = inner, actor, fraction
        self.measures = engine_log_probs and fraction > 0
        self.rng = torch.Generator().manual_seed(seed)

    def fill(self, batch: Batch, timer: Timer) -> dict[str, float]:
        metrics = self.inner.fill(batch, timer)
        if not self.measures or len(batch) == 0:
            return metrics
        rows = torch.randperm(len(batch), generator=self.rng)[: max(1, round(self.fraction * len(batch)))]
        keep = torch.zeros(len(batch), dtype=torch.bool)
        keep[rows] = True
        checked = batch.select(keep)
        with timer("certificate_log_probs"):
            trainer, _ = self.actor.compute_log_probs(checked)
        sampled = checked["loss_mask"] > 0
        gap = mismatch_stats(checked["rollout_log_probs"][sampled], trainer[sampled])
        if not gap:
            return metrics
        return {
            **metrics,
            PREFIX + "logprob_gap_mean": gap["rollout_logprob_diff_mean"],
            PREFIX + "logprob_gap_max": gap["rollout_logprob_diff_max"],
            PREFIX + "logprob_gap_tokens": float(sampled.sum()),
        }


class StepCertificate:
    """`sampled(episodes)` after each rollout, `certify(step, metrics, batch, weights)` after each step."""

    def __init__(self, section, max_staleness: int):
        """`section`: trainer.certificate; `max_staleness`: rollout.max_staleness, the staleness limit."""
        self.section, self.max_staleness = section, max_staleness
        self._versions: dict[str, int] = {}  # uid -> policy version of the step's sampled episodes
        self._episodes = self._tokens = self._breaks = 0

    def sampled(self, episodes: list) -> None:
        """The episodes the step's rollout sampled (before any is dropped)."""
        self._versions = {ep.uid: ep.policy_version for ep in episodes}
        self._episodes = len(episodes)
        self._tokens = sum(len(turn.response_ids) for ep in episodes for turn in ep.turns)
        self._breaks = sum(turn.new_context for ep in episodes for turn in ep.turns[1:])

    def certify(self, step: int, metrics: dict[str, float], batch: Batch | None, weights) -> dict[str, float]:
        """The step's `certificate/*` metrics (`weights`: the last sync's SyncCheck, or None before the
        first); prints the certificate line, and raises CertificateBroken past a limit."""
        values = self.measure(step, metrics, batch, weights)
        print(certificate_line(step, values), flush=True)
        broken = self.broken(values)
        if broken:
            raise CertificateBroken(f"the step's certificate is broken: {broken}")
        return values

    def measure(self, step: int, metrics: dict[str, float], batch: Batch | None, weights) -> dict[str, float]:
        gap = {
            PREFIX + "logprob_gap_mean": metrics.get(
                GAP_SOURCES[0], metrics.get(PREFIX + "logprob_gap_mean", math.nan)
            ),
            PREFIX + "logprob_gap_max": metrics.get(
                GAP_SOURCES[1], metrics.get(PREFIX + "logprob_gap_max", math.nan)
            ),
        }
        trained_version = step - 1
        lags = [
            trained_version - self._versions.get(uid, trained_version)
            for uid in (batch.meta["uid"] if batch else [])
        ]
        trained_tokens = 0.0 if batch is None else float(batch["loss_mask"].sum())
        breaks = (
            self._breaks
            + metrics.get("gateway/prefix_breaks", 0.0)
            + metrics.get("rollout/truncated_prompts", 0.0)
        )
        episodes = max(self._episodes, 1)
        return {
            PREFIX + "weights_tensors_checked": float(weights.tensors) if weights is not None else 0.0,
            **gap,
            PREFIX + "prefix_breaks": float(breaks),
            PREFIX + "staleness_max": float(max(lags, default=0)),
            PREFIX + "staleness_mean": sum(lags) / len(lags) if lags else 0.0,
            PREFIX + "infra_failed_fraction": metrics.get(INFRA_FAILED, 0.0) / episodes,
            PREFIX + "trained_token_share": trained_tokens / self._tokens if self._tokens else 0.0,
            PREFIX + "prefix_breaks_per_episode": breaks / episodes,
        }

    def broken(self, values: dict[str, float]) -> str | None:
        """The first limit `values` are past, as a phrase naming the figure, its value and its key."""
        c, v = self.section, {k.removeprefix(PREFIX): x for k, x in values.items()}
        key = "trainer.certificate."
        breaks_limit = c.max_prefix_breaks_per_episode
        limits = [
            (
                v["logprob_gap_mean"] > c.max_logprob_gap,
                f"the engine/trainer log-prob gap is {v['logprob_gap_mean']:.3g} nats, over "
                f"{key}max_logprob_gap={c.max_logprob_gap:g}",
            ),
            (
                v["staleness_max"] > self.max_staleness,
                f"an episode {v['staleness_max']:g} policy versions old was trained on, over "
                f"rollout.max_staleness={self.max_staleness}",
            ),
            (
                breaks_limit is not None and v["prefix_breaks_per_episode"] > breaks_limit,
                f"{v['prefix_breaks_per_episode']:.3g} prefix breaks per episode, over "
                f"{key}max_prefix_breaks_per_episode={breaks_limit}",
            ),
            (
                v["trained_token_share"] < c.min_trained_token_share,
                f"the update trained on {v['trained_token_share']:.3g} of the sampled tokens, under "
                f"{key}min_trained_token_share={c.min_trained_token_share:g}",
            ),
        ]
        return next((why for past, why in limits if past), None)


def certificate_line(step: int, values: dict[str, float]) -> str:
    v = {k.removeprefix(PREFIX): x for k, x in values.items()}
    weights = (
        f"{v['weights_tensors_checked']:g} tensors equal"
        if v["weights_tensors_checked"]
        else "not synced yet"
    )
    gap = (
        "not measured"
        if math.isnan(v["logprob_gap_mean"])
        else f"mean {v['logprob_gap_mean']:.2g} max {v['logprob_gap_max']:.2g}"
    )
    return (
        f"certificate step {step}: weights {weights} | log-prob gap {gap} | prefix breaks "
        f"{v['prefix_breaks']:g} | "
        f"staleness max {v['staleness_max']:g} mean {v['staleness_mean']:.2f} | infra failed "
        f"{v['infra_failed_fraction']:.2f} | "
        f"trained tokens {v['trained_token_share']:.2f} of sampled"
    )


def certified(run, actor, old_log_probs) -> tuple[StepCertificate, CheckedLogProbs]:
    """The run's certificate, and its old-log-prob source (`old_log_probs`, grl/trainer/pipeline.py) that
    also measures the gap where PPO's old log-probs are the engine's and the engine samples the weights
    about to be trained (with a rollout ahead the gap would measure staleness too)."""
    section = run.trainer.certificate
    staleness = run.rollout.max_staleness
    engine_log_probs = not run.actor_rollout_ref.actor.recompute_old_log_probs and staleness == 0
    checked = CheckedLogProbs(
        old_log_probs, actor, section.logprob_check_fraction, engine_log_probs, run.trainer.seed
    )
    return StepCertificate(section, staleness), checked
