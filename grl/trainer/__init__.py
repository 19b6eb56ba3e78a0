"""The training loop: `run(cfg)` builds the workers, the rollout and the
tracker from a validated config and runs `AgentTrainer.fit()`.

Importing this package is cheap; torch and Ray are imported by `run`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from grl.run_plan import RunPlan


class RunAborted(RuntimeError):
    """The run stopped early (a worker died); the message says where to resume from."""


def run(cfg: DictConfig, plan: RunPlan | None = None) -> None:
    """Train with a config from `grl.config.load_config` and the builder's run plan (grl/train.py)."""
    import ray

    from grl.config import run_sections
    from grl.trainer.agent_trainer import AgentTrainer
    from grl.trainer.resume import nothing_left_line
    from grl.workers.runtime import leave_ray

    finished = nothing_left_line(run_sections(cfg).trainer)
    if finished:  # said before any worker or model starts
        print(finished, flush=True)
        return
    started_ray = not ray.is_initialized()
    try:
        trainer = AgentTrainer.from_config(cfg, plan=plan)
        trainer.fit()
    finally:
        if started_ray:
            # A local runtime's raylet, agents and workers end with the driver; a cluster the run joined
            # ($RAY_ADDRESS) keeps running, without the run's actors and placement groups.
            leave_ray()


__all__ = ["RunAborted", "run"]
