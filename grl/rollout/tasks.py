"""The tasks of a rollout as the config names them, and the seeds their groups play."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grl.agents.tasks import Task

SEED_STRIDE = 100003  # training step s starts its groups at seed + s * SEED_STRIDE


@dataclass(frozen=True)
class TaskSpec:
    name: str  # task instance, e.g. simpleSokobanAgent
    config: Task  # the task instance, checked (grl.config.RunSections.tasks, grl.agents.task_from_block)
    num_groups: int
    group_size: int


def task_specs(rollout, tasks: Mapping[str, Task], validation: bool = False) -> list[TaskSpec]:
    """The training (or validation) task list: the `rollout` section's names and group counts, each task
    from `tasks` (grl.config.RunSections.tasks)."""
    names = rollout.validation if validation else rollout.training
    nums = rollout.validation_agent_group_num if validation else rollout.agent_group_num
    sizes = rollout.validation_agent_group_size if validation else rollout.agent_group_size
    return [TaskSpec(name, tasks[name], groups, size) for name, groups, size in zip(names, nums, sizes)]


def is_program_task(task: TaskSpec) -> bool:
    """A task whose episodes an agent program plays through the gateway (`agent_config.program`)."""
    return bool(task.config.agent_config.program)


def decodes_constrained(specs: list[TaskSpec]) -> bool:
    """Whether any of a run's training and validation tasks writes its replies from the env's valid
    actions (`agent_config.action_decoding: constrained`), or is an agent program (which may ask for
    `allowed_replies`): its engine must then take reply grammars."""
    return any(
        spec.config.agent_config.action_decoding == "constrained" or is_program_task(spec) for spec in specs
    )


def training_base_seed(seed: int, step: int) -> int:
    """A fresh, deterministic base seed for training step `step`."""
    return seed + step * SEED_STRIDE
