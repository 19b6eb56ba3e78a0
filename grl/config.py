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
    PROGRAM,
    AgentConfig,
    ConfigError,
    GRLConfig,
    TaskInstance,
    check_values,
    leaves,
    merge_typed,
    teacher_problem,
)
from grl.schema.keys import did_you_mean, one_line
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


def _check_one_entry_each(cfg: DictConfig, key: str, along: str) -> None:
    """`key` is a list with one entry for each entry of the list `along`."""
    values, names = OmegaConf.select(cfg, key), OmegaConf.select(cfg, along)
    if len(values) != len(names):
        raise ConfigError(f"{key}: has {len(values)} entries but {along} has {len(names)}")


def _check_rules(cfg: DictConfig) -> None:
    """What no single key's declaration can say: keys that must agree with each other, and names that
    live in a registry users add to (the advantage estimators)."""
    if cfg.algorithm.adv_estimator not in ESTIMATORS:
        raise ConfigError(
            f"algorithm.adv_estimator: {cfg.algorithm.adv_estimator!r} is not one of {', '.join(ESTIMATORS)}"
        )
    for key in ESTIMATORS[cfg.algorithm.adv_estimator].hyperparameters:
        if key not in cfg.algorithm:
            raise ConfigError(
                f"algorithm.{key}: {cfg.algorithm.adv_estimator} reads it, but the schema declares no such "
                "key"
            )
    if cfg.actor_rollout_ref.rollout.name not in engine_names():
        raise ConfigError(
            f"actor_rollout_ref.rollout.name: {cfg.actor_rollout_ref.rollout.name!r} is not one of "
            f"{', '.join(engine_names())}"
        )
    _check_one_entry_each(cfg, "rollout.agent_group_num", "rollout.training")
    _check_one_entry_each(cfg, "rollout.agent_group_size", "rollout.training")
    _check_one_entry_each(cfg, "rollout.validation_agent_group_num", "rollout.validation")
    _check_one_entry_each(cfg, "rollout.validation_agent_group_size", "rollout.validation")
    if not cfg.rollout.training:
        raise ConfigError("rollout.training: name at least one task instance")
    for list_key in ("rollout.training", "rollout.validation"):
        names = list(OmegaConf.select(cfg, list_key))
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(
                f"{list_key}: {', '.join(twice)} named twice; raise its agent_group_num instead"
            )
    episodes = sum(n * s for n, s in zip(cfg.rollout.agent_group_num, cfg.rollout.agent_group_size))
    if cfg.train_batch_size is not None and cfg.train_batch_size != episodes:
        raise ConfigError(
            f"train_batch_size: {cfg.train_batch_size} episodes per step, but rollout.agent_group_num x "
            f"agent_group_size gives {episodes}; set it to {episodes} or null"
        )
    if ESTIMATORS[cfg.algorithm.adv_estimator].needs_critic and not cfg.critic.enable:
        raise ConfigError(f"critic.enable: estimator {cfg.algorithm.adv_estimator} needs the critic")
    problem = teacher_problem(cfg.teacher, ESTIMATORS[cfg.algorithm.adv_estimator].needs_teacher)
    if problem:
        raise ConfigError(problem)
    if cfg.rollout.max_staleness > 0 and cfg.actor_rollout_ref.hybrid_engine:
        raise ConfigError(
            f"rollout.max_staleness={cfg.rollout.max_staleness}: rollout then runs beside the update, "
            "so the engine needs a worker of its own; add actor_rollout_ref.hybrid_engine=false"
        )
    actor = cfg.actor_rollout_ref.actor
    if cfg.rollout.max_staleness > 0 and actor.recompute_old_log_probs and actor.tis_imp_ratio_cap <= 0:
        raise ConfigError(
            f"rollout.max_staleness={cfg.rollout.max_staleness}: episodes come from older weights than "
            "the update's, which the loss corrects for with truncated importance weights; set "
            "actor_rollout_ref.actor.tis_imp_ratio_cap (e.g. 2.0), or clip around the sampling policy "
            "with actor_rollout_ref.actor.recompute_old_log_probs=false"
        )
    if not actor.recompute_old_log_probs and actor.tis_imp_ratio_cap > 0:
        raise ConfigError(
            "actor_rollout_ref.actor.tis_imp_ratio_cap: its weight pi_old / pi_engine is 1 when the "
            "engine's log-probs are the old ones (recompute_old_log_probs=false); set it to -1"
        )
    curriculum = cfg.rollout.curriculum
    if curriculum.env_key is not None and not curriculum.levels:
        raise ConfigError(
            f"rollout.curriculum.levels: name the values of {curriculum.env_key}, easiest first"
        )
    if curriculum.max_turns:
        _check_one_entry_each(cfg, "rollout.curriculum.max_turns", "rollout.curriculum.levels")
    mode = cfg.trainer.resume_mode
    if mode not in ("auto", "disable") and not Path(mode).is_dir():
        raise ConfigError(f"trainer.resume_mode: {mode!r} is neither auto, disable nor an existing folder")


@functools.lru_cache(
    maxsize=512
)  # every load reads the same ~50 blocks of configs/agents.yaml: type each once
def _typed_task_block(name: str, block_json: str) -> DictConfig:
    """One task instance block (as JSON) typed and range-checked; read-only, since it is shared."""
    import grl.agents

    typed = merge_typed(TaskInstance, json.loads(block_json), f"{name}.")
    check_values(AgentConfig, typed.agent_config, f"{name}.agent_config.")
    if (typed.agent_type == PROGRAM) != bool(typed.agent_config.program):
        raise ConfigError(
            f"{name}: a task played by an agent program has agent_type: {PROGRAM} and "
            "agent_config.program: 'package.module:function'; the one needs the other"
        )
    if typed.agent_type != PROGRAM:
        try:
            grl.agents.env_name(typed.agent_type)
        except KeyError as err:
            raise ConfigError(f"{name}.agent_type: {err.args[0]}") from None
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
            if typed[name].agent_type == PROGRAM:
                continue
            env_type = grl.agents.env_name(typed[name].agent_type)
            try:
                accepted = grl.envs.config_keys(env_type)
            except grl.envs.EnvUnavailable as err:
                raise ConfigError(f"{name}.agent_type: {err}") from None
            for key in typed[name].env_config:
                if accepted is not None and key not in accepted:
                    raise ConfigError(
                        f"{name}.env_config.{key}: unknown key for env "
                        f"{env_type}{did_you_mean(key, sorted(accepted))}"
                    )
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
