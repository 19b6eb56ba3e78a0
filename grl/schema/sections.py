"""A checked config as the schema's typed sections (grl.sections.run_sections converts one): the type the
components are handed, importable without Hydra."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grl.schema.rollout import Rollout
from grl.schema.run import Algorithm, Data, Tools, Trainer
from grl.schema.tasks import Task
from grl.schema.teacher import Teacher
from grl.schema.workers import ActorRolloutRef, Critic


@dataclass(frozen=True)
class RunSections:
    """A checked config as the schema's typed sections, each converted once: what the builders hand the
    components, each the sections it owns (the root DictConfig stops at the builders)."""

    trainer: Trainer
    rollout: Rollout
    algorithm: Algorithm
    actor_rollout_ref: ActorRolloutRef
    critic: Critic
    teacher: Teacher
    data: Data  # max_prompt_length and max_response_length, resolved
    tools: Tools
    tasks: dict[str, Task]  # the task instances rollout.training and rollout.validation name, typed
    record: dict[str, Any]  # the whole config, resolved, as the run records it (tracker, run_info.yaml)
