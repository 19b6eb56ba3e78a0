"""AgentTrainer: the one place that knows the whole training step.

`fit()` reads as the step of the design brief: rollout -> batch -> shape ->
score -> advantage -> update -> sync -> report. Every phase is one call into
a lower layer (grl.rollout, grl.algo, grl.workers); this module only wires
them, times them, validates, checkpoints (grl/trainer/resume.py) and reports.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from functools import partial
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from grl.algo import make_kl_controller
from grl.engines import sampling_from_config
from grl.run_plan import Run, RunPlan, build_run
from grl.rollout import Batch, RolloutError, task_specs, training_base_seed
from grl.rollout.dynamic_sampling import with_top_up
from grl.schema import RunSections
from grl.tracking import Tracker, save_run_info
from grl.trainer import RunAborted
from grl.trainer.certificate import STOPS, certified
from grl.trainer.curriculum import Curriculum
from grl.trainer.metrics import (
    Timer,
    batch_metrics,
    mfu_inputs,
    on_policy_mismatch,
    reward_metrics,
    task_metrics,
    throughput_metrics,
    turn_length_metrics,
)
from grl.trainer.pipeline import RolloutAhead, RolloutSource, SynchronousRollout, old_log_probs_from
from grl.trainer.progress import Progress
from grl.trainer.report import abort_message, finish_report, records_dir, start_report
from grl.trainer.transforms import (
    add_advantages,
    drop_nonfinite_rows,
    drop_stale_episodes,
    shape_batch,
)
from grl.trainer.resume import export_hf, nothing_left_line, resume, resume_line, save
from grl.trainer.validation import Validation
from grl.workers import WeightSyncTimeout, WorkerDiedError
from grl.workers.group import TEARDOWN_TIMEOUT_S
from grl.workers.teacher import score_batch, teacher_from

log = logging.getLogger("grl.trainer")

# A hook runs after each step is reported: hook(trainer, step, metrics, batch), where batch is
# what the update trained on (None when the step skipped its update).
StepHook = Callable[["AgentTrainer", int, dict, "Batch | None"], None]


class AgentTrainer:
    def __init__(
        self, run: RunSections, plan: RunPlan, actor, critic, rollout, hooks: list[StepHook] | None = None
    ):
        """`run`: the config's typed sections; `plan`: the run plan the worker groups were built from."""
        self.sections, self.settings = run, run.trainer  # trainer.* are the loop's own keys
        self.actor = actor  # grl.workers.ActorRolloutRefGroup (policy, reference model, rollout engine)
        self.critic = critic  # grl.workers.CriticGroup, or None for critic-free estimators
        self.rollout = rollout  # grl.rollout.MultiTurnRollout over the actor's engine
        self.hooks = list(hooks or [])
        self.plan = plan
        self.algorithm = algo = run.algorithm  # the advantage estimator reads its keys from it
        self.policy = run.actor_rollout_ref  # the model, its update and how the engine samples
        self.sampling = sampling_from_config(
            self.policy.rollout, validate=False, max_new_tokens=run.data.max_response_length
        )
        self.kl_ctrl = make_kl_controller(
            algo.kl_ctrl.type, algo.kl_ctrl.kl_coef, algo.kl_ctrl.target_kl, algo.kl_ctrl.horizon
        )
        self.train_tasks = task_specs(run.rollout, run.tasks)
        self.curriculum = Curriculum.from_config(
            run.rollout.curriculum
        )  # None: the tasks as their blocks set them
        self.global_step = 0
        self.mfu_shape, self.peak_flops = mfu_inputs(self.policy.model.path, self.plan.device, actor)
        self.last_checkpoint: Path | None = None
        self.tracker: Tracker | None = None
        self.progress = Progress(enabled="console" in self.settings.logger)
        self.validation = Validation.of_run(run, rollout)
        # Where each step's episodes and old log-probs come from (grl/trainer/pipeline.py): the step reads
        # the same in every mode. The rollout source starts with the first step, after any resume.
        self._source: RolloutSource | None = None
        self.certificate, self.old_log_probs = certified(
            run, actor, old_log_probs_from(plan, self.policy.actor, actor)
        )
        self.teacher = teacher_from(run.teacher, plan, actor)  # None without on-policy distillation

    @classmethod
    def from_config(cls, cfg: DictConfig, hooks: list[StepHook] | None = None) -> AgentTrainer:
        """`from_run` of a checked config's run on this machine (grl-train builds its run itself)."""
        return cls.from_run(build_run(cfg), hooks)

    @classmethod
    def from_run(cls, built: Run, hooks: list[StepHook] | None = None) -> AgentTrainer:
        """Start Ray, the actor (+ref, +engine) and critic workers, and the rollout of the run grl-train
        built (grl/train.py)."""
        from grl.trainer.start import start_components

        return cls(built.sections, built.plan, *start_components(built), hooks)

    # ------------------------------------------------------------------ loop

    def fit(self) -> None:
        """Validate, then train step by step, validating every `test_freq` and
        checkpointing every `save_freq` steps (and both at the end)."""
        settings = self.settings
        try:
            finished = nothing_left_line(settings)
            if finished:
                print(finished, flush=True)
                return
            resumed = resume(self)
            if resumed:
                print(resume_line(resumed, settings), flush=True)
            records = records_dir(settings)
            self.tracker = Tracker(
                settings.logger,
                records,
                settings.project_name,
                settings.experiment_name,
                config=self.sections.record,
                total_steps=settings.total_training_steps,
                # A val-only run's folder holds its own history, never a continued one.
                resume_step=resumed.step if resumed and not settings.val_only else None,
            )
            save_run_info(records, OmegaConf.to_yaml(self.sections.record))
            print(
                start_report(self.sections, self.plan, start_step=self.global_step),
                flush=True,
            )
            if settings.val_only:
                self.tracker.log(self.validate(), self.global_step)
                return
            self.progress.start_run(settings.total_training_steps, done=self.global_step)
            if settings.val_before_train and self.global_step == 0:
                self.tracker.log(self.validate(), self.global_step)
            while self.global_step < settings.total_training_steps:
                self.global_step += 1
                step, last = self.global_step, self.global_step == settings.total_training_steps
                metrics, batch = self.train_step(step)
                metrics.update(self.certificate.certify(step, metrics, batch, self.actor.weights_check))
                if settings.test_freq > 0 and (step % settings.test_freq == 0 or last):
                    metrics.update(self.validate())
                    if settings.export_hf and settings.export_best and self.validation.is_best(step, metrics):
                        export_hf(self)
                if (settings.save_freq > 0 and step % settings.save_freq == 0) or last:
                    metrics.update(save(self))
                self.tracker.log(metrics, step)
                self.progress.step_done(metrics)
                for hook in self.hooks:
                    hook(self, step, metrics, batch)
            best = self.validation.best.step  # 0: none after a training step, or trainer.export_best off
            export = None if not settings.export_hf else export_hf(self, only_path=best > 0)
            self.progress.close()  # the run bar's last state, then the report below it
            print(finish_report(self.validation.success, self.last_checkpoint, export, best), flush=True)
        except (WorkerDiedError, WeightSyncTimeout, RolloutError, *STOPS) as err:
            message = abort_message(err, self.global_step, self.last_checkpoint)
            log.error(message)
            raise RunAborted(message) from err
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM turned into one by grl.train: stop the workers now
            self.close(teardown_timeout=0)
            raise
        finally:
            self.close()

    def train_step(self, step: int) -> tuple[dict[str, float], Batch | None]:
        """One PPO step: rollout -> batch -> shape -> score -> advantage -> update -> sync.
        Returns the step's metrics and the batch the update trained on (None if it was skipped)."""
        timer = Timer()
        with self.progress.step(step, self.plan.phases) as phase, timer("step"):
            with phase("gen"):
                sampled = self._source_from(step).take(step)
            timer.times.update(sampled.times)
            episodes, metrics = self._received(step, sampled)
            batch = self._batch_of(step, episodes, metrics)
            if batch is None:  # nothing to train on; a rollout ahead still waits for this step's version
                self._source.publish(step)
                return {**metrics, **timer.metrics()}, None
            with phase("old_log_prob"):
                metrics.update(self.old_log_probs.fill(batch, timer))
            if self.plan.use_reference:
                with phase("ref"), timer("ref"):
                    batch["ref_log_probs"] = self.actor.compute_ref_log_probs(batch)
            if self.teacher is not None:
                with phase("teacher"), timer("teacher"):
                    batch, scored = score_batch(
                        self.teacher, batch, self.sections.rollout.max_infra_failed_ratio
                    )
                metrics.update(scored)
            if self.critic is not None:
                with phase("values"), timer("values"):
                    batch["values"] = self.critic.compute_values(batch)

            with phase("adv"), timer("adv"):
                metrics.update(
                    add_advantages(batch, self.algorithm, self.kl_ctrl, self.sections.teacher.advantage_coef)
                )
                batch, dropped = drop_nonfinite_rows(batch)
                metrics["training/dropped_nonfinite_episodes"] = float(dropped)

            if len(batch) > 0 and self.critic is not None:
                with phase("update_critic"), timer("update_critic"):
                    metrics.update(self.critic.update(batch, step))
            actor_update = None
            if len(batch) > 0 and self.updates_actor(step):
                with phase("update_actor"), timer("update_actor"):
                    actor_update = on_policy_mismatch(self.actor.update(batch, step))
                metrics.update(actor_update)
            with phase("sync_weights"), timer("sync_weights"):
                self._source.publish(step)
        if len(batch) > 0:
            metrics.update(batch_metrics(batch))
            metrics.update(
                throughput_metrics(
                    batch,
                    timer.times,
                    self.plan.world_size,
                    self.mfu_shape,
                    self.peak_flops,
                    actor_update,
                )
            )
        metrics.update(timer.metrics())
        return metrics, (batch if len(batch) > 0 else None)

    def _received(self, step: int, sampled) -> tuple[list, dict[str, float]]:
        """The episodes the update may train on (none older than rollout.max_staleness) and the
        rollout's metrics; the curriculum records the step's success."""
        result = sampled.result
        self.certificate.sampled(result.episodes)
        episodes, stale = drop_stale_episodes(result.episodes, step - 1, self.sections.rollout.max_staleness)
        if stale:
            log.error(
                "step %d: %d episodes sampled more than rollout.max_staleness=%d versions ago were dropped",
                step,
                stale,
                self.sections.rollout.max_staleness,
            )
        metrics = {
            **sampled.metrics,
            **task_metrics(result.metrics, "train"),
            **reward_metrics(result.episodes),
            **turn_length_metrics(result.episodes, self.sections.data.max_response_length, validation=False),
            "training/dropped_stale_episodes": float(stale),
        }
        if self.curriculum is not None:  # before this step's weights are published: a rollout ahead reads it
            metrics.update(self.curriculum.metrics(self._stage(step)))
            if self.curriculum.record(step, result.episodes):
                log.info(
                    "step %d: curriculum moves to %s=%r",
                    step,
                    self.curriculum.key,
                    self.curriculum.levels[self.curriculum.stage],
                )
        if self.policy.actor.use_kl_loss:
            metrics["actor/kl_coef"] = self.policy.actor.kl_loss_coef
        return episodes, metrics

    def _batch_of(self, step: int, episodes: list, metrics: dict[str, float]) -> Batch | None:
        """The shaped batch (its metrics added to `metrics`), or None when nothing is left to train on."""
        batch, shape_metrics = shape_batch(
            episodes, self.sections.rollout, self.rollout.tokenizer.pad_token_id
        )
        metrics.update(shape_metrics)
        if len(batch) == 0:
            infra = int(shape_metrics["training/dropped_infra_episodes"])
            log.warning(
                "step %d: no episode left to train on (%d infra failures left out); update skipped",
                step,
                infra,
            )
            return None
        return batch

    def updates_actor(self, step: int) -> bool:
        """Whether `step` updates the actor, and so syncs its weights: every step after the critic's
        warm-up."""
        return step > self.settings.critic_warmup

    def _source_from(self, step: int) -> RolloutSource:
        """The rollout source, started by the first step this trainer runs (after any resume)."""
        if self._source is None:
            self._source = self._rollout_source(first_step=step)
        return self._source

    def _rollout_source(self, first_step: int) -> RolloutSource:
        """Rollouts ahead of the update where the engine has a worker of its own (hybrid_engine=false),
        which grl.config requires of max_staleness > 0; otherwise each step samples, then trains."""
        if self.plan.engine_apart:  # its thread's rollouts move no progress bar
            return RolloutAhead(
                partial(self._rollout, on_turn=None),
                self.actor.engine.load_weights,
                self.actor.weights_handle,
                max_staleness=self.sections.rollout.max_staleness,
                first_step=first_step,
                last_step=self.settings.total_training_steps,
                version=first_step - 1,
            )
        return SynchronousRollout(
            partial(self._rollout, on_turn=self.progress.show_turn),
            self.rollout.engine,
            self.actor,
            self.policy.rollout.free_cache_engine,
            self.updates_actor,
        )

    def _rollout(self, step: int, on_turn: Callable | None):
        """Every training task's episodes of `step`, sampled by the engine's current weights."""
        sampling = replace(self.sampling, seed=training_base_seed(self.settings.seed, step))
        tasks = (
            self.train_tasks
            if self.curriculum is None
            else self.curriculum.tasks(self.train_tasks, self._stage(step))
        )
        r = self.sections.rollout
        play = partial(
            self.rollout.run, tasks, sampling=sampling, turn_barrier=r.turn_barrier, on_turn=on_turn
        )
        return with_top_up(play, training_base_seed(r.seed, step), r.top_up_rounds)

    def _stage(self, step: int) -> int:
        return self.curriculum.stage_for(step, self.sections.rollout.max_staleness)

    def validate(self) -> dict[str, float]:
        """Every validation task in one batched greedy rollout, `trainer.validation_steps`
        times with consecutive seeds -> `val-env/<task>/<metric>`, the mean over the rollouts."""
        timer = Timer()
        with (
            timer("testing"),
            self.progress.validation(self.global_step),
            self._source.latest_weights() if self._source else nullcontext(),
        ):
            metrics = self.validation.run(self.global_step, on_turn=self.progress.show_turn)
        return {**metrics, **timer.metrics()}

    def close(self, teardown_timeout: float = TEARDOWN_TIMEOUT_S) -> None:
        if self._source is not None:
            self._source.close()  # a rollout ahead in flight ends when the engine's worker is shut down below
        self.progress.close()
        self.validation.close()
        if self.teacher is not None:
            self.teacher.close()
        if self.rollout is not None:
            self.rollout.close()
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None
        for group in (self.actor, self.critic):
            if group is not None:
                group.shutdown(teardown_timeout)
