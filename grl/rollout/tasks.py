"""The tasks of a rollout as the config names them, and the seeds their groups play."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SEED_STRIDE = 100003  # training step s starts its groups at seed + s * SEED_STRIDE


@dataclass(frozen=True)
class TaskSpec:
    name: str  # task instance, e.g. simpleSokobanAgent
    config: Any  # its block of configs/agents.yaml: {agent_type, agent_config, env_config}
    num_groups: int
    group_size: int


def task_specs(cfg, validation: bool = False) -> list[TaskSpec]:
    """The training (or validation) task list of a composed GRL config."""
    r = cfg.rollout
    names = r.validation if validation else r.training
    nums = r.validation_agent_group_num if validation else r.agent_group_num
    sizes = r.validation_agent_group_size if validation else r.agent_group_size
    from omegaconf import OmegaConf

    return [TaskSpec(str(n), OmegaConf.to_container(cfg[n], resolve=True), int(g), int(s)) for n, g, s in zip(names, nums, sizes)]


def is_program_task(task: TaskSpec) -> bool:
    """A task whose episodes an agent program plays through the gateway (`agent_config.program`)."""
    return bool((task.config.get("agent_config") or {}).get("program"))


def decodes_constrained(cfg) -> bool:
    """Whether any training or validation task of a run writes its replies from the env's valid
    actions (`agent_config.action_decoding: constrained`), or is an agent program (which may ask for
    `allowed_replies`): its engine must then take reply grammars."""
    return any(
        (spec.config.get("agent_config") or {}).get("action_decoding") == "constrained" or is_program_task(spec)
        for validation in (False, True)
        for spec in task_specs(cfg, validation)
    )


def training_base_seed(seed: int, step: int) -> int:
    """A fresh, deterministic base seed for training step `step`."""
    return seed + step * SEED_STRIDE
