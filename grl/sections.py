"""A checked config (grl.config.load_config) as the schema's typed sections: what the builders hand the
components instead of the root config, converted once per run (grl.run_plan.build_run)."""

from __future__ import annotations

from typing import Any, get_type_hints

from omegaconf import DictConfig, OmegaConf

from grl.schema import PROGRAM, GRLConfig, RunSections, Task, TaskInstance, merge_typed


def typed_section(cfg: DictConfig, name: str) -> Any:
    """One section of the config as the schema's dataclass instance, its interpolations resolved against
    the whole config: what a component is built from, instead of the whole config."""
    section_class = get_type_hints(GRLConfig)[name]
    return OmegaConf.to_object(
        merge_typed(section_class, OmegaConf.to_container(cfg[name], resolve=True), f"{name}.")
    )


def run_sections(cfg: DictConfig) -> RunSections:
    """The typed sections of a config from `load_config`."""
    names = dict.fromkeys([*cfg.rollout.training, *cfg.rollout.validation])
    return RunSections(
        **{
            name: typed_section(cfg, name)
            for name in (
                "trainer",
                "rollout",
                "algorithm",
                "actor_rollout_ref",
                "critic",
                "teacher",
                "data",
                "tools",
            )
        },
        tasks={name: _task(cfg, name) for name in names},
        record=OmegaConf.to_container(cfg, resolve=True),
    )


def task_instance(cfg: DictConfig, name: str) -> dict[str, Any]:
    """A task instance block as a plain dict (what grl.agents.make_agent takes)."""
    return OmegaConf.to_container(cfg[name], resolve=True)  # type: ignore[return-value]


def _task(cfg: DictConfig, name: str) -> Task:
    """A task instance typed once: its block as the schema's TaskInstance (its agent_config's left-out keys at
    their defaults; `validate` checked the values), with the env its agent type drives."""
    import grl.agents

    instance = OmegaConf.to_object(merge_typed(TaskInstance, task_instance(cfg, name), f"{name}."))
    env_type = None if instance.agent_type == PROGRAM else grl.agents.env_name(instance.agent_type)
    return Task(instance.agent_type, env_type, instance.agent_config, instance.env_config)
