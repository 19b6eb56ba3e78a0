"""Ray worker groups: FSDP2 actor (+ reference model, + rollout engine) and critic.

The trainer uses only what is exported here; see docs/CONTRACTS.md (Workers).
"""

from grl.workers.group import (
    ActorRolloutRefGroup,
    CriticGroup,
    EngineProxy,
    WorkerDiedError,
    init_ray,
    plan_minibatches,
    resolve_device,
    world_size,
)

__all__ = ["ActorRolloutRefGroup", "CriticGroup", "EngineProxy", "WorkerDiedError", "init_ray",
           "plan_minibatches", "resolve_device", "world_size"]
