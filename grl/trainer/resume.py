"""What a checkpoint holds of a run and how a run continues from one: the trainer's save, resume and
Hugging Face export (the folders themselves are grl/trainer/checkpoint.py's), and the one line a run
prints when it resumes, or when its checkpoint leaves nothing to train."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from grl.rng import rng_state, set_rng_state
from grl.trainer import checkpoint as ckpt
from grl.trainer.metrics import Timer
from grl.trainer.validation import BestValidation

if TYPE_CHECKING:
    from grl.trainer.agent_trainer import AgentTrainer


@dataclass(frozen=True)
class ResumePoint:
    path: Path  # the global_step_N folder
    state: dict  # its trainer_state.json

    @property
    def step(self) -> int:
        """The steps the checkpoint has trained."""
        return self.state["global_step"]


def resume_point(settings) -> ResumePoint | None:
    """The checkpoint `trainer.resume_mode` points at (`settings`: the trainer section), from its state
    file alone: no worker is needed to know where a run would continue."""
    path = ckpt.resume_path(settings.resume_mode, settings.default_local_dir)
    return None if path is None else ResumePoint(path, ckpt.read_state(path))


def nothing_left_line(settings) -> str | None:
    """The line a run whose checkpoint has trained every step prints before it exits 0; None when there
    is something to do (no checkpoint, steps left, or trainer.val_only)."""
    point = resume_point(settings)
    total = settings.total_training_steps
    if point is None or settings.val_only or point.step < total:
        return None
    return (
        f"grl-train: nothing left to train: {point.path.absolute()} is step {point.step} of "
        f"trainer.total_training_steps={total}; raise trainer.total_training_steps to train on, "
        "or set trainer.resume_mode=disable (or another trainer.default_local_dir) to start over"
    )


def resume_line(point: ResumePoint, settings) -> str:
    """The line a resumed run starts with: which checkpoint, which step, what is left."""
    head = f"grl-train: resumed from {point.path.absolute()} (step {point.step})"
    if settings.val_only:
        return f"{head}; trainer.val_only: validating once, training nothing"
    return (
        f"{head}: {settings.total_training_steps - point.step} of {settings.total_training_steps} steps left"
    )


def save(trainer: AgentTrainer) -> dict[str, float]:
    """Write the trainer's checkpoint of its current step; returns the time it took as a metric."""
    timer, settings = Timer(), trainer.settings

    def write_parts(tmp: Path) -> None:
        trainer.actor.save_checkpoint(str(tmp / "actor"))
        if trainer.critic is not None:
            trainer.critic.save_checkpoint(str(tmp / "critic"))

    curriculum = trainer.curriculum
    state = {
        "global_step": trainer.global_step,
        "kl_coef": trainer.kl_ctrl.value,
        "rng": rng_state(),
        "best_validation": [trainer.validation.best.step, trainer.validation.best.score],
        **({"curriculum": curriculum.state()} if curriculum is not None else {}),
    }
    with timer("save_checkpoint"):
        trainer.last_checkpoint = ckpt.write_checkpoint(
            settings.default_local_dir, trainer.global_step, write_parts, state, settings.max_ckpt_to_keep
        )
    return timer.metrics()


def export_hf(trainer: AgentTrainer, only_path: bool = False) -> Path:
    """The actor as a Hugging Face folder (`<default_local_dir>/hf_actor`) that transformers and vLLM
    load; `only_path`: where trainer.export_best wrote it at the best validation."""
    target = Path(trainer.settings.default_local_dir) / ckpt.HF_EXPORT
    return target if only_path else ckpt.write_folder(target, trainer.actor.export_hf)


def resume(trainer: AgentTrainer) -> ResumePoint | None:
    """Load the checkpoint `trainer.resume_mode` points at into the workers and the trainer; the point
    it resumed from, or None."""
    point = resume_point(trainer.settings)
    if point is None:
        return None
    state = point.state
    trainer.actor.load_checkpoint(str(point.path / "actor"))
    if trainer.critic is not None:
        trainer.critic.load_checkpoint(str(point.path / "critic"))
    trainer.actor.sync_weights()  # the engine must sample from the resumed weights
    trainer.kl_ctrl.value = state["kl_coef"]
    trainer.validation.best = BestValidation(*state.get("best_validation", (0, float("-inf"))))
    set_rng_state(state["rng"])
    if trainer.curriculum is not None and "curriculum" in state:
        trainer.curriculum.load_state(state["curriculum"])
    trainer.global_step = state["global_step"]
    trainer.last_checkpoint = point.path
    return point
