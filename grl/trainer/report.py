"""What a run prints: where it writes and what it trains on, the run bar's numbers, how it ended."""

from __future__ import annotations

import os
from pathlib import Path

from grl.compute import compute_report


VAL_ONLY_FOLDER = "val_only"


def records_dir(trainer) -> Path:
    """Where a run of these trainer settings writes its metrics, curves and config: `trainer.run_dir`, and for
    a val-only run its `val_only` folder, so that validating a trained run's export or checkpoint in that
    run's folder leaves the run's own history and config as they were."""
    return Path(trainer.run_dir) / VAL_ONLY_FOLDER if trainer.val_only else Path(trainer.run_dir)


def validation_runs(trainer, start_step: int) -> bool:
    """Whether a run of these trainer settings, starting after `start_step`, validates at all."""
    return trainer.val_only or trainer.test_freq > 0 or (trainer.val_before_train and start_step == 0)


def start_report(run, plan, start_step: int = 0) -> str:
    """Where this run writes, on what it runs and what it trains and validates on (only what will run);
    `run`: the config's typed sections, `start_step`: the step a resumed run continues after."""
    from grl.tracking import METRICS_FILE

    trainer, rollout, model = run.trainer, run.rollout, run.actor_rollout_ref.model
    run_dir = records_dir(trainer).absolute()
    groups = zip(rollout.training, rollout.agent_group_num, rollout.agent_group_size)
    val_groups = zip(
        rollout.validation, rollout.validation_agent_group_num, rollout.validation_agent_group_size
    )
    training = (
        "none (trainer.val_only)" if trainer.val_only else ", ".join(f"{t} ({n}x{k})" for t, n, k in groups)
    )
    validation = ", ".join(f"{t} ({n}x{k})" for t, n, k in val_groups)
    if not validation_runs(trainer, start_step):
        before = (
            "; a resumed run skips trainer.val_before_train"
            if start_step
            else ", trainer.val_before_train=false"
        )
        validation = f"off (trainer.test_freq={trainer.test_freq}{before})"
    return "\n".join(
        [
            f"grl-train: {trainer.project_name}/{trainer.experiment_name}, "
            f"{trainer.total_training_steps} steps, estimator {run.algorithm.adv_estimator}",
            f"  run folder   {run_dir}",
            f"  metrics      {run_dir / METRICS_FILE}  (grl plot {run_dir})",
            f"  checkpoints  {Path(trainer.default_local_dir).absolute()}",
            f"  device       {plan.device} x {plan.world_size} rank(s), engine "
            f"{plan.engine}{plan.engine_place(run.rollout.max_staleness)}, model {model.path}",
            f"  compute      {compute_report(model.dtype, plan.device)}",
            f"  worker logs  {os.environ.get('RAY_TMPDIR', '/tmp/ray')}/session_latest/logs",
            f"  training     {training}",
            f"  validation   {validation}",
        ]
    )


def run_postfix(metrics: dict[str, float]) -> str:
    """The few numbers worth seeing on the run bar."""
    parts = [f"reward {metrics['reward/mean']:.3f}"] if "reward/mean" in metrics else []
    parts += [
        f"{name.split('/')[1]} val {value:.2f}"
        for name, value in metrics.items()
        if name.startswith("val-env/") and name.endswith("/success")
    ]
    return ", ".join(parts)


def finish_report(
    val_success: dict[str, list[tuple[int, float]]],
    checkpoint: Path | None,
    export: Path | None,
    export_step: int = 0,
) -> str:
    """One "finished" line per validation task (first, best and last success), then where the model is."""
    lines = []
    for task, points in val_success.items():
        (first_step, first), (last_step, last) = points[0], points[-1]
        best_step, best = max(points, key=lambda p: (p[1], -p[0]))
        lines.append(
            f"finished {task}: validation success {first:.3f} at step {first_step}, "
            f"best {best:.3f} at step {best_step}, last {last:.3f} at step {last_step}"
        )
    if not lines:
        lines.append("finished: no validation ran (trainer.test_freq off and trainer.val_before_train=false)")
    lines.append(f"checkpoint   {checkpoint.absolute() if checkpoint else 'none written'}")
    best = f" (the actor of step {export_step}, the best validation; the checkpoint holds the last step's)"
    lines.append(
        f"HF export    {export.absolute() if export else 'off (trainer.export_hf=false)'}"
        f"{best if export and export_step else ''}"
    )
    return "\n".join(lines)


def abort_message(err, step: int, last_checkpoint: Path | None) -> str:
    """One line: what stopped the run (a WorkerDiedError or WeightSyncTimeout), and where a rerun continues
    from."""
    from grl.trainer.checkpoint import step_of
    from grl.workers import WorkerDiedError

    died = isinstance(err, WorkerDiedError)
    what = f"worker {err.worker} died during step {step} ({err})" if died else f"{err} during step {step}"
    if last_checkpoint is None:
        return f"{what}; no checkpoint was written yet, so a rerun starts from step 0"
    return (
        f"{what}; the last complete checkpoint is {last_checkpoint}; rerun with trainer.resume_mode=auto "
        f"to continue from step {step_of(last_checkpoint)}"
    )
