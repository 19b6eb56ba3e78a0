"""`trainer.certificate`: the limits of the per-step certificate (grl/trainer/certificate.py), each a
value past which the run stops with one line. The engine holding other weights than the trainer's is
always fatal and has no key; the staleness limit is rollout.max_staleness."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from grl.schema.keys import key


@dataclass
class Certificate:
    max_logprob_gap: float = key(
        1.0,
        "largest mean |engine - trainer| log-prob (nats) of the sampled tokens checked each step; in fp32 "
        "it is float noise (~1e-6), in bf16 ~1e-2; past it the trainer scores another distribution than "
        "the engine sampled (a top-p/top-k filter, a stale or broken sync)",
        gt=0,
    )
    logprob_check_fraction: float = key(
        0.05,
        "where no old-log-prob pass runs (actor.recompute_old_log_probs=false), the share of a step's "
        "episodes (at least one) the actor scores to measure that gap; 0: not measured there",
        ge=0,
        le=1,
    )
    max_prefix_breaks_per_episode: Optional[float] = key(
        None,
        "largest mean number of prefix breaks per sampled episode (a prompt that does not continue the "
        "episode's tokens: a gateway call whose history was edited, a left-truncated or windowed prompt); "
        "null: no limit",
        ge=0,
    )
    min_trained_token_share: float = key(
        0.0,
        "smallest share of the sampled tokens the update trains on (loss-mask tokens of the trained "
        "batch over the tokens the engine sampled); below it the run trains on almost nothing it sampled "
        "(zeroed loss masks, every group filtered); 0: no limit",
        ge=0,
        le=1,
    )
