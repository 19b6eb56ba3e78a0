"""Compose the Hydra config and check it before anything starts.

The YAML files in configs/ hold the values; the dataclasses of grl/schema.py hold
only the types. `load_config` composes base.yaml with the command-line overrides,
merges the result into the typed schema and runs the checks a type cannot
express. Every mistake becomes one `ConfigError` line that names the key, so a
typo costs seconds, not a Ray start-up.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Collection
from dataclasses import fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from grl.algo.estimators import ESTIMATORS
from grl.schema import GRLConfig, TaskInstance

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """A configuration mistake, described in one line that names the key."""


# Values a type cannot check: key -> allowed choices.
CHOICES: dict[str, Collection[str]] = {
    "rollout.truncation": ("left", "right", "error"),
    "rollout.rollout_filter_type": ("std", "std_rev"),
    "rollout.reward_normalization.grouping": ("state", "batch", "inductive"),
    "rollout.reward_normalization.method": ("identity", "mean_std", "asym_clip"),
    "actor_rollout_ref.actor.loss_agg_mode": ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"),
    "actor_rollout_ref.actor.kl_loss_type": ("kl", "abs", "mse", "low_var_kl"),
    "actor_rollout_ref.actor.strategy": ("fsdp", "fsdp2"),
    "actor_rollout_ref.rollout.name": ("auto", "hf", "vllm"),
    "actor_rollout_ref.model.dtype": ("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"),
    "critic.model.dtype": ("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"),
    "algorithm.adv_estimator": ESTIMATORS,  # the registry itself, so an estimator registered later is a choice
    "algorithm.kl_penalty": ("kl", "abs", "mse", "low_var_kl"),
    "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    "trainer.device": ("auto", "cuda", "cpu"),
}
LOGGERS = ("console", "jsonl", "wandb", "tensorboard")

# Keys of GRL's and verl's configs that nothing here reads, accepted so that their command lines run:
# key -> (the value GRL behaves as whatever is set, why). Preflight notes a different value.
NO_EFFECT: dict[str, tuple[Any, str]] = {
    "actor_rollout_ref.hybrid_engine": (True, "the rollout engine always lives with the actor's workers"),
    "actor_rollout_ref.actor.strategy": ("fsdp2", "the workers always shard with FSDP2"),
    "rollout.num_prompt_threads": (0, "prompts are rendered in the rollout thread"),
}


# Second spellings that GRL's and verl's configs use: alias -> the key that is read. The alias
# defaults to an interpolation of its key; a value set on the alias replaces the key's.
ALIASES = {
    "data.max_prompt_length": "max_prompt_length",
    "data.max_response_length": "max_response_length",
    "data.train_batch_size": "train_batch_size",
    "actor_rollout_ref.rollout.rollout_filter_ratio": "rollout.rollout_filter_ratio",
    "actor_rollout_ref.rollout.rollout_filter_type": "rollout.rollout_filter_type",
}


# ---------------------------------------------------------------- checks

def _did_you_mean(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _one_line(err: BaseException) -> str:
    """The first informative line of an OmegaConf/Hydra error."""
    cause = err
    while cause.__cause__ is not None and isinstance(cause.__cause__, OmegaConfBaseException):
        cause = cause.__cause__
    text = str(cause).strip().splitlines()
    return text[0] if text else type(cause).__name__


def _typed_merge(schema, cfg: DictConfig, prefix: str) -> DictConfig:
    try:
        return OmegaConf.merge(OmegaConf.structured(schema), cfg)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or ""
        full = f"{prefix}{key}" if key else prefix.rstrip(".") or "config"
        message = _one_line(err)
        if "not in struct" in message:
            known = [f"{prefix}{k}" for k in _all_keys(OmegaConf.structured(schema))]
            raise ConfigError(f"{full}: unknown key{_did_you_mean(full, known)}") from None
        raise ConfigError(f"{full}: {message}") from None


def _all_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    keys = []
    for key in cfg.keys():
        value = cfg._get_node(key)
        full = f"{prefix}{key}"
        keys.append(full)
        if isinstance(value, DictConfig):
            keys += _all_keys(value, f"{full}.")
    return keys


def _apply_aliases(cfg: DictConfig) -> None:
    """Copy GRL's and verl's spellings onto the keys that are read (before resolving)."""
    for alias, key in ALIASES.items():
        parent, _, leaf = alias.rpartition(".")
        node = OmegaConf.select(cfg, parent)._get_node(leaf)
        if not node._is_interpolation():
            OmegaConf.update(cfg, key, node._value())
            OmegaConf.update(cfg, alias, "${" + key + "}")
    r = cfg.rollout
    for alias in ("num_env_threads", "num_init_threads"):
        if r[alias] is not None:
            r.env_workers = r[alias] or min(32, os.cpu_count() or 1)
    if cfg.trainer.resume_from_path is not None:
        cfg.trainer.resume_mode = cfg.trainer.resume_from_path


def _check_choices(cfg: DictConfig) -> None:
    for key, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(allowed)}")
    from grl.agents.controls import VALIDATION_CONTROLS

    for name in cfg.trainer.validation_controls:
        if name not in VALIDATION_CONTROLS:
            raise ConfigError(f"trainer.validation_controls: {name!r} is not one of {', '.join(VALIDATION_CONTROLS)}")
    for name in cfg.trainer.logger:
        if name not in LOGGERS:
            raise ConfigError(f"trainer.logger: {name!r} is not one of {', '.join(LOGGERS)}")
    mode = cfg.trainer.resume_mode
    if mode not in ("auto", "disable") and not Path(mode).is_dir():
        raise ConfigError(f"trainer.resume_mode: {mode!r} is neither auto, disable nor an existing folder")


def _check_lists(cfg: DictConfig) -> None:
    groups = [("rollout.training", "rollout.agent_group_num", "rollout.agent_group_size"),
              ("rollout.validation", "rollout.validation_agent_group_num", "rollout.validation_agent_group_size")]
    for names_key, num_key, size_key in groups:
        names = OmegaConf.select(cfg, names_key)
        for key in (num_key, size_key):
            values = OmegaConf.select(cfg, key)
            if len(values) != len(names):
                raise ConfigError(f"{key}: has {len(values)} entries but {names_key} has {len(names)}")
            if any(v < 1 for v in values):
                raise ConfigError(f"{key}: every entry must be at least 1, got {list(values)}")
    if not cfg.rollout.training:
        raise ConfigError("rollout.training: name at least one task instance")
    if not 0.0 < cfg.rollout.rollout_filter_ratio <= 1.0:
        raise ConfigError(f"rollout.rollout_filter_ratio: {cfg.rollout.rollout_filter_ratio} is not in (0, 1]")
    if not 0.0 <= cfg.rollout.max_failed_agent_ratio <= 1.0:
        raise ConfigError(f"rollout.max_failed_agent_ratio: {cfg.rollout.max_failed_agent_ratio} is not in [0, 1]")
    # the keys the workers read, not the shorthands they default to, so that a value set on either is checked
    for key in ("max_prompt_length", "max_response_length", "actor_rollout_ref.actor.ppo_mini_batch_size",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "critic.ppo_mini_batch_size",
                "critic.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                "n_gpus_per_node", "nnodes", "rollout.env_workers", "rollout.max_episode_length",
                "actor_rollout_ref.actor.ppo_epochs", "actor_rollout_ref.actor.logits_chunk_size",
                "actor_rollout_ref.nccl_timeout", "critic.nccl_timeout"):
        if OmegaConf.select(cfg, key) < 1:
            raise ConfigError(f"{key}: must be at least 1, got {OmegaConf.select(cfg, key)}")
    for list_key in ("rollout.training", "rollout.validation"):
        names = list(OmegaConf.select(cfg, list_key))
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"{list_key}: {', '.join(twice)} named twice; raise its agent_group_num instead")
    episodes = sum(n * s for n, s in zip(cfg.rollout.agent_group_num, cfg.rollout.agent_group_size))
    if cfg.train_batch_size is not None and cfg.train_batch_size != episodes:
        raise ConfigError(f"train_batch_size: {cfg.train_batch_size} episodes per step, but rollout.agent_group_num x "
                          f"agent_group_size gives {episodes}; set it to {episodes} or null")
    if cfg.trainer.validation_steps < 1:
        raise ConfigError(f"trainer.validation_steps: must be at least 1, got {cfg.trainer.validation_steps}")
    if uses_critic(cfg) and not cfg.critic.enable:
        raise ConfigError(f"critic.enable: estimator {cfg.algorithm.adv_estimator} needs the critic")


def _check_tasks(cfg: DictConfig, tasks: dict[str, DictConfig]) -> dict[str, DictConfig]:
    """Type-check every task instance; check env keys of the ones in use."""
    import grl.agents
    import grl.envs

    typed: dict[str, DictConfig] = {}
    for name, block in tasks.items():
        typed[name] = _typed_merge(TaskInstance, block, f"{name}.")
        try:
            grl.agents.env_name(typed[name].agent_type)
        except KeyError as err:
            raise ConfigError(f"{name}.agent_type: {err.args[0]}") from None
    for list_key in ("rollout.training", "rollout.validation"):
        for name in OmegaConf.select(cfg, list_key):
            if name not in typed:
                known = sorted(typed)
                hint = _did_you_mean(name, known) or f" (known: {', '.join(known)})"
                raise ConfigError(f"{list_key}: no task instance named {name!r}{hint}")
            env_type = grl.agents.env_name(typed[name].agent_type)
            try:
                accepted = grl.envs.config_keys(env_type)
            except grl.envs.EnvUnavailable as err:
                raise ConfigError(f"{name}.agent_type: {err}") from None
            for key in typed[name].env_config:
                if accepted is not None and key not in accepted:
                    raise ConfigError(f"{name}.env_config.{key}: unknown key for env {env_type}"
                                      f"{_did_you_mean(key, sorted(accepted))}")
    return typed


# ---------------------------------------------------------------- entry

def compose(overrides: list[str] | tuple[str, ...] = (), config_name: str = "base",
            config_dir: str | Path | None = None) -> DictConfig:
    """Hydra composition only (no checks)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    config_dir = Path(config_dir or CONFIG_DIR).resolve()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            return hydra_compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        message = _one_line(err)
        key = getattr(err.__cause__, "full_key", None) or getattr(err, "full_key", None)
        if key and "not in struct" in message:
            raise ConfigError(f"{key}: unknown key{_did_you_mean(key, _known_keys(config_dir, config_name))}") from None
        raise ConfigError(f"{key + ': ' if key else ''}{message}") from None


def _known_keys(config_dir: Path, config_name: str) -> list[str]:
    try:
        return _all_keys(compose((), config_name, config_dir))
    except ConfigError:
        return []


def validate(cfg: DictConfig) -> DictConfig:
    """Check a composed config; returns it typed, with task blocks kept."""
    known = {f.name for f in fields(GRLConfig)}
    core = OmegaConf.create({k: cfg._get_node(k) for k in cfg.keys() if k in known})
    tasks = {}
    for key in cfg.keys():
        if key in known:
            continue
        block = cfg._get_node(key)
        if not isinstance(block, DictConfig) or "agent_type" not in block:
            raise ConfigError(f"{key}: unknown key{_did_you_mean(str(key), sorted(known))}")
        tasks[str(key)] = block
    typed = _typed_merge(GRLConfig, core, "")
    _apply_aliases(typed)
    try:
        OmegaConf.resolve(typed)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{getattr(err, 'full_key', 'config')}: {_one_line(err)}") from None
    missing = OmegaConf.missing_keys(typed)
    if missing:
        raise ConfigError(f"{sorted(missing)[0]}: no value given")
    _check_choices(typed)
    _check_lists(typed)
    typed_tasks = _check_tasks(typed, tasks)
    for name, block in typed_tasks.items():
        OmegaConf.set_struct(typed, False)
        typed[name] = block
    OmegaConf.set_struct(typed, True)
    return typed


def load_config(overrides: list[str] | tuple[str, ...] = (), config_name: str = "base",
                config_dir: str | Path | None = None) -> DictConfig:
    """Compose `configs/<config_name>.yaml` with overrides and validate it."""
    return validate(compose(overrides, config_name, config_dir))


def task_instance(cfg: DictConfig, name: str) -> dict[str, Any]:
    """A task instance block as a plain dict (what grl.agents.make_agent takes)."""
    return OmegaConf.to_container(cfg[name], resolve=True)  # type: ignore[return-value]


def uses_critic(cfg: DictConfig) -> bool:
    """The estimator reads values, so a critic is built and trained."""
    return ESTIMATORS[cfg.algorithm.adv_estimator].needs_critic


def uses_reference(cfg: DictConfig) -> bool:
    """Reference log-probs are needed: a KL loss or a KL penalty in the reward."""
    return bool(cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward)
