"""What a trainer runs on, started from the run grl-train built (grl.run_plan.Run): Ray, the actor (+ref,
+engine) and critic worker groups, the agent programs' workers and the rollout."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from grl.rollout import MultiTurnRollout, task_specs
from grl.rollout.tasks import is_program_task
from grl.run_plan import Run


def start_components(built: Run) -> tuple:
    """-> (actor group, critic group or None, rollout); a group that started is shut down when a later
    part fails."""
    from grl.models import load_tokenizer
    from grl.workers import init_ray, start_groups

    # Worker output (Ray, vLLM, transformers on every rank) stays in Ray's session logs, off the console;
    # errors still reach the driver as exceptions.
    run, plan = built.sections, built.plan
    init_ray(run.trainer.ray_address, log_to_driver=False)
    with ThreadPoolExecutor(1) as driver:
        tokenizer = driver.submit(load_tokenizer, run.actor_rollout_ref.model.path)  # while the ranks start
        actor, critic = start_groups(run, plan)
    try:
        programs = None
        program_tasks = [
            task
            for validation in (False, True)
            for task in task_specs(run.rollout, run.tasks, validation)
            if is_program_task(task)
        ]
        if program_tasks:
            from grl.gateway.programs import ProgramRunner

            programs = ProgramRunner.from_config(run.rollout, run.data, actor.engine, tokenizer.result())
            programs.start_workers(program_tasks)  # their processes start while the first rollout is prepared
        rollout = MultiTurnRollout.from_config(
            run.rollout, run.data, run.tools, actor.engine, tokenizer.result(), programs=programs
        )
    except BaseException:
        for group in (actor, critic):
            if group is not None:
                group.shutdown()
        raise
    return actor, critic, rollout
