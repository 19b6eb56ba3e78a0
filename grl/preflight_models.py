"""Preflight of the models a run loads (grl/preflight.py runs it): the model and its tokenizer, the
context the run asks of them, and an on-policy-distillation teacher's agreement with the student."""

from __future__ import annotations

from typing import TYPE_CHECKING

from omegaconf import DictConfig

from grl.config import ConfigError
from grl.errors import first_line

if TYPE_CHECKING:
    from grl.run_plan import Run


class PreflightError(ConfigError):
    """A config that composes and type-checks but cannot run on this machine."""


def check_model(cfg: DictConfig, environ) -> None:
    """The model resolves, its tokenizer has a chat template, and prompt +
    response fit in its context."""
    from grl.models import config_context

    name = cfg.actor_rollout_ref.model.path
    tokenizer, model_config = _tokenizer_and_config("actor_rollout_ref.model.path", name, environ)
    if not getattr(tokenizer, "chat_template", None):
        raise PreflightError(
            f"actor_rollout_ref.model.path: the tokenizer of {name!r} has no chat template; use an "
            "instruct/chat model"
        )
    context = config_context(model_config)
    wanted = _context_wanted(cfg)
    if context and wanted > context:
        raise PreflightError(
            f"max_prompt_length + max_response_length: {cfg.max_prompt_length} + "
            f"{cfg.max_response_length} = {wanted} tokens exceed the {context}-token context of "
            f"{name!r}; lower max_prompt_length"
        )
    max_model_len = cfg.actor_rollout_ref.rollout.max_model_len
    if max_model_len and max_model_len < cfg.max_prompt_length + cfg.max_response_length:
        raise PreflightError(
            f"actor_rollout_ref.rollout.max_model_len: {max_model_len} is shorter than "
            f"max_prompt_length + max_response_length ({cfg.max_prompt_length + cfg.max_response_length})"
        )


def _context_wanted(cfg: DictConfig) -> int:
    return cfg.actor_rollout_ref.rollout.max_model_len or cfg.max_prompt_length + cfg.max_response_length


def _tokenizer_and_config(key: str, name: str, environ, hint: str = ""):
    from transformers import AutoConfig, AutoTokenizer

    from grl.models import ModelLoadError, check_model_name

    try:
        resolved = check_model_name(name, environ)
        return AutoTokenizer.from_pretrained(resolved), AutoConfig.from_pretrained(resolved)
    except ModelLoadError as err:
        raise PreflightError(f"{key}: {err}{hint}") from None
    except (OSError, ValueError) as err:
        raise PreflightError(f"{key}: cannot load {name!r}: {first_line(err)}") from None


def check_teacher(cfg: DictConfig, environ, run: Run) -> None:
    """A teacher loads or answers, scores with the student's tokenizer, and holds the run's context; a
    served one is asked only for the distribution it returns (the plain softmax at temperature 1)."""
    plan = run.plan
    if plan.teacher is None:
        return
    from grl.models import config_context

    student, _ = _tokenizer_and_config(
        "actor_rollout_ref.model.path", cfg.actor_rollout_ref.model.path, environ
    )
    wanted, teacher = _context_wanted(cfg), cfg.teacher
    if plan.teacher == "served":
        from grl.workers.teacher import TeacherError, check_served

        if plan.score_temperature != 1.0 or plan.reply_grammars:
            raise PreflightError(
                "teacher.url: a served teacher returns log-probs of its plain softmax at temperature 1, but "
                "this run samples at another temperature, with top-p/top-k or under a grammar; use "
                "teacher.model_path (a local teacher scores under the student's own sampling distribution)"
            )
        probe = student.apply_chat_template(
            [{"role": "user", "content": "Tokenize me: 12 + 30 = 42, naïve café"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        try:
            check_served(run.sections.teacher, student, wanted, probe)
        except TeacherError as err:
            raise PreflightError(f"teacher.url: {err}") from None
        return
    tokenizer, model_config = _tokenizer_and_config(
        "teacher.model_path",
        teacher.model_path,
        environ,
        "; a teacher is any model with the student's tokenizer, such as the hf_actor folder a finished run "
        "exports (`grl-train preset=cpu` writes checkpoints/grl/tetris_gap_cpu/hf_actor)",
    )
    if tokenizer.get_vocab() != student.get_vocab() or tokenizer.all_special_ids != student.all_special_ids:
        raise PreflightError(
            f"teacher.model_path: {teacher.model_path!r} has another tokenizer than the student "
            f"{cfg.actor_rollout_ref.model.path!r}; distillation scores the student's own token ids, so the "
            "two must share one (across tokenizers it is not supported)"
        )
    context = config_context(model_config)
    if context and wanted > context:
        raise PreflightError(
            f"teacher.model_path: {teacher.model_path!r} holds {context} tokens, fewer than the run's "
            f"{wanted} (max_prompt_length + max_response_length)"
        )
