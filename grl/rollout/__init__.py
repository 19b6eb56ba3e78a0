"""The multi-turn rollout, the Episode -> Batch builder, reward shaping.

Importing this package does not import torch; the batch functions do.
"""

from grl.rollout.batch import (
    build_batch,
    episode_tokens,
    pack_rows,
    packed_attention_mask,
)
from grl.rollout.env_faults import RolloutError
from grl.rollout.multi_turn import MultiTurnRollout, RolloutResult, rollout_metrics
from grl.rollout.shaping import (
    filter_groups,
    normalize,
    normalize_episode_scores,
)
from grl.rollout.tasks import TaskSpec, decodes_constrained, task_specs, training_base_seed
from grl.rollout.types import Batch, Episode, Turn

__all__ = [
    "Batch",
    "Episode",
    "MultiTurnRollout",
    "RolloutError",
    "RolloutResult",
    "TaskSpec",
    "Turn",
    "build_batch",
    "decodes_constrained",
    "episode_tokens",
    "filter_groups",
    "normalize",
    "normalize_episode_scores",
    "pack_rows",
    "packed_attention_mask",
    "rollout_metrics",
    "task_specs",
    "training_base_seed",
]
