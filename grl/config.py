"""Compose the Hydra config and check it before anything starts.

The schema (grl/schema/) declares every key once: its type, default, allowed values and range.
`load_config` composes the schema's defaults, configs/agents.yaml, a preset and the command-line
overrides, merges the result into the typed schema, checks each value against its declaration and
then the rules that tie keys together. Every mistake becomes one `ConfigError` line that names the
key, so a typo costs seconds, not a Ray start-up. The composition itself (Hydra) is grl/composition.py.
"""

from __future__ import annotations

import copy
import functools
import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from grl.algo.estimators import ESTIMATORS
from grl.composition import CONFIG_DIR, compose, presets
from grl.engines import engine_names
from grl.schema import (
    AgentConfig,
    ConfigError,
    GRLConfig,
    TaskInstance,
    check_values,
    leaves,
    merge_typed,
    teacher_problem,
)
from grl.schema.keys import check_together, did_you_mean, one_line
from grl.schema.workers import micro_within_mini
from grl.sections import RunSections, run_sections, task_instance, typed_section

__all__ = [
    "ALIASES",
    "CONFIG_DIR",
    "NO_EFFECT",
    "ConfigError",
    "RunSections",
    "compose",
    "load_config",
    "presets",
    "run_sections",
    "task_blocks",
    "task_instance",
    "typed_section",
    "validate",
]

# Keys of GRL's and verl's configs that nothing here reads, accepted so that their command lines run:
# key -> (the value GRL behaves as whatever is set, why). Preflight notes a different value.
NO_EFFECT: dict[str, tuple[Any, str]] = {
    leaf.path: (leaf.default, leaf.rule.no_effect) for leaf in leaves(GRLConfig) if leaf.rule.no_effect
}

# Second spellings that GRL's and verl's configs use: alias -> the key that is read. The alias
# defaults to an interpolation of its key; a value set on the alias replaces the key's, and the alias
# then points at the key again, so that the two cannot disagree.
ALIASES = {
    "data.max_prompt_length": "max_prompt_length",
    "actor_rollout_ref.rollout.prompt_length": "max_prompt_length",
    "data.max_response_length": "max_response_length",
    "actor_rollout_ref.rollout.response_length": "max_response_length",
    "data.train_batch_size": "train_batch_size",
    "actor_rollout_ref.rollout.rollout_filter_ratio": "rollout.rollout_filter_ratio",
    "actor_rollout_ref.rollout.rollout_filter_type": "rollout.rollout_filter_type",
}


def _shorthands() -> dict[str, str]:
    """GRL's top-level keys that feed exactly one nested key (`total_training_steps` ->
    `trainer.total_training_steps`) -> that key. The nested key is what is read, so a value set
    there is what the shorthand shows too. (A shorthand feeding several keys, such as
    `micro_batch_size_per_gpu`, is only their common default.)"""
    fed: dict[str, list[str]] = {}
    for leaf in leaves(GRLConfig):
        if isinstance(leaf.default, str) and leaf.default.startswith("${") and "." not in leaf.default:
            fed.setdefault(leaf.default[2:-1], []).append(leaf.path)
    return {short: keys[0] for short, keys in fed.items() if len(keys) == 1 and short not in ALIASES.values()}


SHORTHANDS = _shorthands()


# ---------------------------------------------------------------- checks


def _apply_aliases(cfg: DictConfig) -> None:
    """Copy GRL's and verl's spellings onto the keys that are read (before resolving)."""
    given: dict[str, tuple[str, Any]] = {}
    for alias, key in ALIASES.items():
        parent, _, leaf = alias.rpartition(".")
        node = OmegaConf.select(cfg, parent)._get_node(leaf)
        if node._is_interpolation():
            continue
        value = node._value()
        if key in given and given[key][1] != value:
            raise ConfigError(
                f"{alias}: {value!r} disagrees with {given[key][0]}={given[key][1]!r}; both spell {key}, set "
                "one"
            )
        given[key] = (alias, value)
        OmegaConf.update(cfg, key, value)
        OmegaConf.update(cfg, alias, "${" + key + "}")
    r = cfg.rollout
    for alias in ("num_env_threads", "num_init_threads"):
        if r[alias] is not None:
            r.env_workers = r[alias] or min(32, os.cpu_count() or 1)
    if cfg.trainer.resume_from_path is not None:
        cfg.trainer.resume_mode = cfg.trainer.resume_from_path
    for shorthand, key in SHORTHANDS.items():
        parent, _, leaf = key.rpartition(".")
        if not OmegaConf.select(cfg, parent)._get_node(leaf)._is_interpolation():
            OmegaConf.update(cfg, shorthand, "${" + key + "}")


def _check_rules(cfg: DictConfig) -> None:
    """The rules that read a registry users add to (the advantage estimators, the engines) or the disk;
    the schema's own rules over several keys sit beside their keys (`together`, grl/schema)."""
    if cfg.algorithm.adv_estimator not in ESTIMATORS:
        raise ConfigError(
            f"algorithm.adv_estimator: {cfg.algorithm.adv_estimator!r} is not one of {', '.join(ESTIMATORS)}"
        )
    estimator = ESTIMATORS[cfg.algorithm.adv_estimator]
    for key in estimator.hyperparameters:
        if key not in cfg.algorithm:
            raise ConfigError(
                f"algorithm.{key}: {estimator.name} reads it, but the schema declares no such key"
            )
    if cfg.actor_rollout_ref.rollout.name not in engine_names():
        raise ConfigError(
            f"actor_rollout_ref.rollout.name: {cfg.actor_rollout_ref.rollout.name!r} is not one of "
            f"{', '.join(engine_names())}"
        )
    check_together(GRLConfig, cfg)
    if estimator.needs_critic and not cfg.critic.enable:
        raise ConfigError(f"critic.enable: estimator {estimator.name} needs the critic")
    if estimator.needs_critic:
        micro_within_mini(cfg.critic, "critic.")
    if estimator.group_based and min(cfg.rollout.agent_group_size) < 2:
        raise ConfigError(
            f"rollout.agent_group_size: {list(cfg.rollout.agent_group_size)!r} has a group of 1 agent, which "
            f"{estimator.name} (it compares the agents of a group) has nothing to compare with; use groups "
            "of 2 or more"
        )
    problem = teacher_problem(cfg.teacher, estimator.needs_teacher)
    if problem:
        raise ConfigError(problem)
    mode = cfg.trainer.resume_mode
    if mode not in ("auto", "disable") and not Path(mode).is_dir():
        raise ConfigError(f"trainer.resume_mode: {mode!r} is neither auto, disable nor an existing folder")


def notes(cfg: DictConfig) -> list[str]:
    """What a checked config sets to no effect: GRL's compatibility keys, a critic no estimator reads."""
    found = [
        f"{key}: {OmegaConf.select(cfg, key)!r} has no effect (GRL compatibility): {why}"
        for key, (behaves_as, why) in NO_EFFECT.items()
        if OmegaConf.select(cfg, key) != behaves_as
    ]
    estimator = ESTIMATORS[cfg.algorithm.adv_estimator]
    if not estimator.needs_critic and cfg.critic.enable:
        found.append(
            f"critic.enable: {estimator.name} uses no critic, so none is built (set critic.enable=false to "
            "silence this)"
        )
    return found


@functools.lru_cache(
    maxsize=512
)  # every load reads the same ~50 blocks of configs/agents.yaml: type each once
def _typed_task_block(name: str, block_json: str) -> DictConfig:
    """One task instance block (as JSON) typed and range-checked; read-only, since it is shared."""
    import grl.agents

    typed = merge_typed(TaskInstance, json.loads(block_json), f"{name}.")
    check_values(AgentConfig, typed.agent_config, f"{name}.agent_config.")
    try:
        grl.agents.check_task(name, typed.agent_type, typed.agent_config.program, None)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    OmegaConf.set_readonly(typed, True)
    return typed


def _check_tasks(cfg: DictConfig, tasks: dict[str, DictConfig]) -> dict[str, DictConfig]:
    """Type- and range-check every task instance; check env keys of the ones in use."""
    import grl.agents
    import grl.envs

    typed = {
        name: _typed_task_block(name, json.dumps(OmegaConf.to_container(block), sort_keys=True))
        for name, block in tasks.items()
    }
    for list_key in ("rollout.training", "rollout.validation"):
        for name in OmegaConf.select(cfg, list_key):
            if name not in typed:
                known = sorted(typed)
                hint = did_you_mean(name, known) or f" (known: {', '.join(known)})"
                raise ConfigError(f"{list_key}: no task instance named {name!r}{hint}")
            block = typed[name]
            try:
                env_type = grl.agents.check_task(
                    name, block.agent_type, block.agent_config.program, block.env_config
                )
            except ValueError as err:
                raise ConfigError(str(err)) from None
            if env_type is None:
                continue
            accepted = grl.envs.config_keys(env_type)
            stepped = cfg.rollout.curriculum.env_key
            if (
                list_key == "rollout.training"
                and stepped is not None
                and accepted is not None
                and stepped not in accepted
            ):
                raise ConfigError(
                    f"rollout.curriculum.env_key: env {env_type} of {name} has no key {stepped!r}"
                    f"{did_you_mean(stepped, sorted(accepted))}"
                )
    return typed


# ---------------------------------------------------------------- entry


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
            raise ConfigError(f"{key}: unknown key{did_you_mean(str(key), sorted(known))}")
        tasks[str(key)] = block
    typed = merge_typed(GRLConfig, core)
    _apply_aliases(typed)
    try:
        OmegaConf.resolve(typed)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{getattr(err, 'full_key', 'config')}: {one_line(err)}") from None
    missing = OmegaConf.missing_keys(typed)
    if missing:
        raise ConfigError(f"{sorted(missing)[0]}: no value given")
    check_values(GRLConfig, typed)
    _check_rules(typed)
    typed_tasks = _check_tasks(typed, tasks)
    for name, block in typed_tasks.items():
        OmegaConf.set_struct(typed, False)
        typed[name] = copy.deepcopy(
            block
        )  # the checked block is shared between loads: this config's own copy
        OmegaConf.set_readonly(typed[name], None)
    OmegaConf.set_struct(typed, True)
    return typed


def load_config(
    overrides: list[str] | tuple[str, ...] = (),
    config_name: str = "base",
    config_dir: str | Path | None = None,
) -> DictConfig:
    """Compose `configs/<config_name>.yaml` with overrides and validate it."""
    return validate(compose(overrides, config_name, config_dir))


def task_blocks(cfg: DictConfig) -> dict[str, DictConfig]:
    """Every task instance block of a checked config (configs/agents.yaml's and what a preset or the command
    line adds), by name."""
    known = {f.name for f in fields(GRLConfig)}
    return {str(key): cfg[key] for key in cfg.keys() if key not in known}
