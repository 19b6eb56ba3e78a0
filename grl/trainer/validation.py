"""One validation: the batched greedy rollout(s), the input-dependence measures and the controls.

`validation_metrics` runs every validation task `runs` times with consecutive seeds and averages
the per-task metrics (`val-env/<task>/<metric>`); RAGEN-2's input-dependence measures
(grl/rollout/diagnostics.py) come from the same episodes. Each control rollout (grl/agents/controls.py,
`trainer.validation_controls`) replays the same games with its own agents and reports only its
success, as `val-env/<task>/success_swapped` for `swap`; a task an agent program plays has no agent to
replace and is left out of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from statistics import fmean

from grl.agents.controls import CONTROL_METRIC
from grl.engines import SamplingParams, sampling_from_config
from grl.rollout import MultiTurnRollout, task_specs
from grl.rollout.diagnostics import input_dependence_metrics
from grl.rollout.tasks import TaskSpec, is_program_task
from grl.schema import RunSections
from grl.trainer.metrics import task_metrics, turn_length_metrics


def _mean_metrics(results) -> dict[str, float]:
    names = {name for r in results for name in r.metrics}
    return {name: fmean([r.metrics[name] for r in results if name in r.metrics]) for name in names}


def validation_metrics(rollout, controls: dict, tasks, first_seed: int, runs: int, sampling, on_turn=None):
    """-> (per-task metrics without prefix, the true pass's episodes). `controls`: name -> rollout."""
    results = [rollout.run(tasks, first_seed + i, sampling, on_turn=on_turn) for i in range(runs)]
    episodes = [ep for r in results for ep in r.episodes]
    metrics = {**_mean_metrics(results), **input_dependence_metrics(episodes)}
    native = [task for task in tasks if not is_program_task(task)]
    for name, control_rollout in controls.items() if native else ():
        mean = _mean_metrics(
            [control_rollout.run(native, first_seed + i, sampling, on_turn=on_turn) for i in range(runs)]
        )
        for task in {t.name for t in native}:
            if f"{task}/success" in mean:
                metrics[f"{task}/{CONTROL_METRIC[name]}"] = mean[f"{task}/success"]
    return metrics, episodes


@dataclass
class BestValidation:
    """The validation after a training step with the highest mean success over the validation tasks, for
    `trainer.export_best`; a tie goes to the later step (more training, the same score). The base model's
    validation (step 0) is not a candidate: the export is always a trained model."""

    step: int = 0
    score: float = float("-inf")

    def offer(self, step: int, metrics: dict[str, float], tasks) -> bool:
        """True when this step's validation is the best so far (and is recorded)."""
        scores = [
            metrics[f"val-env/{task}/success"] for task in tasks if f"val-env/{task}/success" in metrics
        ]
        if step < 1 or not scores or fmean(scores) < self.score:
            return False
        self.step, self.score = step, fmean(scores)
        return True


class Validation:
    """The run's validations over the rollout's engine: each task's success at every validation (the
    finish report's first, best and last) and the best one after a training step (`trainer.export_best`)."""

    def __init__(
        self,
        rollout,
        tasks: list[TaskSpec],
        sampling: SamplingParams,
        *,
        seed: int,
        runs: int,
        controls: list[str],
        control_rollout: Callable[[str], MultiTurnRollout],
        max_response_length: int,
    ):
        """`rollout`: the training rollout, whose engine it shares; `tasks` (rollout.validation) played
        `runs` times (trainer.validation_steps) from `seed` (rollout.validation_seed) under `sampling`;
        `controls`: trainer.validation_controls, each played by `control_rollout(control=name)`, built on
        first use."""
        self.rollout, self.tasks, self.sampling = rollout, tasks, sampling
        self.names = [task.name for task in tasks]
        self.seed, self.runs, self.control_names = seed, runs, controls
        self.control_rollout, self.max_response_length = control_rollout, max_response_length
        self.controls: dict = {}  # validation control -> its MultiTurnRollout (grl/agents/controls.py)
        self.success: dict[str, list[tuple[int, float]]] = {}
        self.best = BestValidation()

    @classmethod
    def of_run(cls, run: RunSections, rollout) -> Validation:
        """The validations a run's sections ask for, over the training rollout's engine."""
        return cls(
            rollout,
            task_specs(run.rollout, run.tasks, validation=True),
            sampling_from_config(
                run.actor_rollout_ref.rollout, validate=True, max_new_tokens=run.data.max_response_length
            ),
            seed=run.rollout.validation_seed,
            runs=run.trainer.validation_steps,
            controls=list(run.trainer.validation_controls),
            control_rollout=lambda control: MultiTurnRollout.from_config(
                run.rollout, run.data, run.tools, rollout.engine, rollout.tokenizer, control=control
            ),
            max_response_length=run.data.max_response_length,
        )

    def run(self, step: int, on_turn=None) -> dict[str, float]:
        """Every validation task in one batched greedy rollout, `trainer.validation_steps` times with
        consecutive seeds -> `val-env/<task>/<metric>`, the mean over the rollouts."""
        mean, episodes = validation_metrics(
            self.rollout,
            self._control_rollouts(),
            self.tasks,
            self.seed,
            self.runs,
            self.sampling,
            on_turn=on_turn,
        )
        metrics = task_metrics(mean, "val-env")
        for task in self.names:
            if f"val-env/{task}/success" in metrics:
                self.success.setdefault(task, []).append((step, metrics[f"val-env/{task}/success"]))
        return {**metrics, **turn_length_metrics(episodes, self.max_response_length, validation=True)}

    def is_best(self, step: int, metrics: dict[str, float]) -> bool:
        """Whether this validation is the best after a training step so far (and is recorded as it)."""
        return self.best.offer(step, metrics, self.names)

    def _control_rollouts(self) -> dict:
        """The rollouts of `trainer.validation_controls`, built on first use over the same engine."""
        for name in self.control_names:
            if name not in self.controls:
                self.controls[name] = self.control_rollout(control=name)
        return self.controls

    def close(self) -> None:
        for rollout in self.controls.values():
            rollout.close()
