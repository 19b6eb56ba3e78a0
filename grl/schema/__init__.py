"""The config's one schema: every key's type, default, allowed values, range and help, declared once
with `key(...)` in typed dataclasses (as prime-rl does). Hydra composes the schema's defaults first
(registered by `grl.config`); configs/agents.yaml adds the task instances and configs/preset/ the
hardware presets. The checks (`grl.config`), `grl-train --help` and docs/CONFIG.md are read from here.

    python -m grl.schema > docs/CONFIG.md      # regenerate the key table
"""

from grl.schema.keys import ConfigError, Leaf, Rule, check_values, checked, key, leaves, merge_typed, section
from grl.schema.run import (
    Algorithm,
    Data,
    GRLConfig,
    KLControl,
    PythonSandbox,
    System,
    Tools,
    Trainer,
)
from grl.schema.rollout import RewardNormalization, Rollout
from grl.schema.sections import RunSections
from grl.schema.tasks import PROGRAM, AgentConfig, Task, TaskInstance
from grl.schema.teacher import Teacher, teacher_problem
from grl.schema.workers import (
    Actor,
    ActorRolloutRef,
    Critic,
    FSDPConfig,
    Model,
    Optim,
    Ref,
    RolloutEngine,
    SamplingOverrides,
)

__all__ = [
    "PROGRAM",
    "Actor",
    "ActorRolloutRef",
    "AgentConfig",
    "Algorithm",
    "ConfigError",
    "Critic",
    "Data",
    "FSDPConfig",
    "GRLConfig",
    "KLControl",
    "Leaf",
    "Model",
    "Optim",
    "PythonSandbox",
    "Ref",
    "RewardNormalization",
    "Rollout",
    "RolloutEngine",
    "Rule",
    "RunSections",
    "SamplingOverrides",
    "System",
    "Teacher",
    "Task",
    "TaskInstance",
    "Tools",
    "Trainer",
    "check_values",
    "checked",
    "key",
    "leaves",
    "merge_typed",
    "section",
    "teacher_problem",
]
