"""Agents: prompting, reply parsing and action budgets over the envs.

`make_agent(task_name, task)` builds the generic Agent for a task instance
of configs/agents.yaml (`{agent_type, agent_config, env_config}`), a `Task`
checked once. Agent types are registered in grl/agents/tasks.py with the env
they drive.
"""

from __future__ import annotations

from typing import Any, Mapping

import grl.envs
import grl.tools
from grl.agents.base import Agent, AgentSettings, settings_from_mapping
from grl.agents.turns import AgentStep
from grl.agents.openenv_tools import ToolCallHooks
from grl.agents.parse import ParsedReply, ToolCall, parse_reply, parse_tool_calls, split_actions
from grl.agents.tasks import AGENT_TYPES, AgentType, Task, TaskHooks
from grl.schema import PROGRAM
from grl.schema.keys import did_you_mean
from grl.tools import SandboxLimits


def agent_types() -> list[str]:
    return sorted(AGENT_TYPES)


def _agent_type(agent_type: str) -> AgentType:
    """A registered agent type, or the generic agent over an env given by its
    registered name or "package.module:EnvClass" path (so a new env needs no
    registration: one file plus one YAML block)."""
    if agent_type in AGENT_TYPES:
        return AGENT_TYPES[agent_type]
    if isinstance(agent_type, str) and (agent_type in grl.envs.names() or ":" in agent_type):
        return AgentType(agent_type, TaskHooks())
    raise KeyError(
        f"unknown agent_type {agent_type!r}; registered: {', '.join(agent_types())}, an env name or a "
        "module:EnvClass path"
    )


def env_name(agent_type: str) -> str:
    """The grl.envs name (or module:Class path) an agent type drives."""
    return _agent_type(agent_type).env


def register(agent_type: str, env: str, hooks: TaskHooks | None = None) -> None:
    """Add an agent type (a new env, or new hooks for an existing one)."""
    AGENT_TYPES[agent_type] = AgentType(env, hooks or TaskHooks())


register("openenvToolsAgent", "openenv", ToolCallHooks())  # OpenEnv's MCP envs, played by tool calls


def _plain(value: Any) -> Any:
    """OmegaConf containers to plain dicts/lists, without importing omegaconf here."""
    if hasattr(value, "_metadata") and hasattr(value, "_get_node"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return value


def check_task(task_name: str, agent_type: Any, program: Any, env_keys) -> str | None:
    """The one check of a task instance's shape, for every way a task comes in (a run's config, a block
    given by hand): an agent program goes with `agent_type: program`, any other agent type is registered
    (or names an env), and each env_config key is one its env takes (`env_keys` None: not looked at, so
    that no env module is imported). Returns the env's name (None for a program); raises ValueError naming
    the key."""
    if (agent_type == PROGRAM) != bool(program):
        raise ValueError(
            f"{task_name}: a task played by an agent program has agent_type: {PROGRAM} and "
            "agent_config.program: 'package.module:function'; the one needs the other"
        )
    if agent_type == PROGRAM:
        return None
    try:
        env_type = _agent_type(agent_type).env
    except KeyError as err:
        raise ValueError(f"{task_name}.agent_type: {err.args[0]}") from None
    if env_keys is None:
        return env_type
    try:
        accepted = grl.envs.config_keys(env_type)
    except grl.envs.EnvUnavailable as err:
        raise ValueError(f"{task_name}.agent_type: {err}") from None
    for key in env_keys:
        if accepted is not None and key not in accepted:
            raise ValueError(
                f"{task_name}.env_config.{key}: unknown key for env "
                f"{env_type}{did_you_mean(key, sorted(accepted))}"
            )
    return env_type


def task_from_block(task_name: str, block: Mapping[str, Any]) -> Task:
    """A task instance block given by hand (`{agent_type, agent_config, env_config}`, as configs/agents.yaml
    writes it) checked into a Task; a run's tasks come checked from grl.config instead."""
    block = _plain(block)
    if not isinstance(block, Mapping):
        raise ValueError(f"{task_name}: a task instance must be a mapping, got {type(block).__name__}")
    for key in block:
        if key not in ("agent_type", "agent_config", "env_config"):
            raise ValueError(f"{task_name}.{key}: unknown key (known: agent_type, agent_config, env_config)")
    agent_config = block.get("agent_config")
    if not isinstance(agent_config, Mapping):
        raise ValueError(f"{task_name}.agent_config: missing or not a mapping")
    env_config = block.get("env_config") or {}
    if not isinstance(env_config, Mapping):
        raise ValueError(f"{task_name}.env_config: must be a mapping")
    settings = settings_from_mapping(agent_config, f"{task_name}.agent_config")
    agent_type = block.get("agent_type")
    env_type = check_task(task_name, agent_type, settings.program, env_config)
    return Task(agent_type, env_type, settings, dict(env_config))


def make_agent(task_name: str, task: Task | Mapping[str, Any], sandbox: SandboxLimits | None = None) -> Agent:
    """The Agent of one task instance (a Task, or a block that `task_from_block` checks first); its env is
    built here and owned by it. `sandbox`: the limits of its tool calls (the `tools.python` keys), for tasks
    with `agent_config.tools`."""
    if not isinstance(task, Task):
        task = task_from_block(task_name, task)
    hooks = _agent_type(task.agent_type).hooks
    settings = task.agent_config
    limits = sandbox or SandboxLimits()
    if settings.tools:
        grl.tools.check_isolation(limits)  # refuse to start where the walls cannot be built
    tools = {name: grl.tools.make_tool(name, limits) for name in settings.tools}
    env = grl.envs.make(task.env_type, **task.env_config)
    return Agent(task_name, settings, env, hooks, tools)


__all__ = [
    "Agent",
    "AgentSettings",
    "AgentStep",
    "AgentType",
    "ParsedReply",
    "Task",
    "TaskHooks",
    "ToolCall",
    "agent_types",
    "env_name",
    "make_agent",
    "parse_reply",
    "parse_tool_calls",
    "register",
    "split_actions",
    "task_from_block",
]
