"""The training loop: `run(built)` builds the workers, the rollout and the
tracker from the run grl-train built (grl.run_plan.Run) and runs `AgentTrainer.fit()`.

Importing this package is cheap; torch and Ray are imported by `run`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grl.run_plan import Run


class RunAborted(RuntimeError):
    """The run stopped early (a worker died); the message says where to resume from."""


def run(built: Run) -> None:
    """Train the run grl-train built (grl/train.py): its sections and plan, made once."""
    import ray

    from grl.trainer.agent_trainer import AgentTrainer
    from grl.trainer.resume import nothing_left_line
    from grl.workers.runtime import leave_ray

    finished = nothing_left_line(built.sections.trainer)
    if finished:  # said before any worker or model starts
        print(finished, flush=True)
        return
    started_ray = not ray.is_initialized()
    try:
        trainer = AgentTrainer.from_run(built)
        trainer.fit()
    finally:
        if started_ray:
            # A local runtime's raylet, agents and workers end with the driver; a cluster the run joined
            # ($RAY_ADDRESS) keeps running, without the run's actors and placement groups.
            leave_ray()


__all__ = ["RunAborted", "run"]
