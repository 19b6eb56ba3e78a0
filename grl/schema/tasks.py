"""A task instance: a named block of configs/agents.yaml (`agent_type`, `agent_config`, `env_config`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Optional

from omegaconf import MISSING

from grl.schema.keys import key, section


PROGRAM = "program"  # the agent_type of a task an agent program plays (agent_config.program)
TOOL_NAMES = ("python",)  # grl.tools.TOOLS (tests/test_schema.py holds them equal)


@dataclass
class AgentConfig:
    """`agent_config` of a task instance. A key left out takes GRL's default (its
    grl/agents/base_agent.py), so GRL's task blocks load unchanged."""

    system_prompt: str = key("You are a helpful AI assistant.", "the system message")
    prompt: str = key(
        "Please respond appropriately.",
        "the task text of the first user message; the agent adds "
        "the env's symbol legend and actions, the reply format and the state",
    )
    enable_think: bool = key(
        True, "true: a reply is <think>...</think><answer>...</answer>; false: <answer>...</answer>"
    )
    max_tokens: int = key(100, "response tokens per turn", ge=1)
    max_turns: int = key(1, "replies per episode", ge=1)
    max_actions_per_turn: int = key(1, "actions taken from one reply (extra ones are dropped)", ge=1)
    max_actions_all_turns: int = key(1, "actions per episode; the episode ends when they are spent", ge=1)
    format_penalty: float = key(
        -0.1, "added to a turn's reward when the reply has no parseable answer or an invalid action"
    )
    action_separator: Optional[str] = key(
        "||", "splits an answer into actions; null: the whole answer is one action"
    )
    action_decoding: str = key(
        "free",
        "constrained: the model may only write one of the env's valid actions per "
        "reply (<answer>action</answer>, after free <think> text when enable_think; one action "
        "a turn, as later ones would act on states not reached yet), under a token grammar "
        "(grl/engines/constraint.py); envs without a list (GSM8K, BIRD) decode freely",
        choices=("free", "constrained"),
    )
    tools: list[str] = key(
        [], "tools the model may call inside an episode (grl/tools), e.g. [python]", choices=TOOL_NAMES
    )
    max_tool_calls_per_turn: int = key(1, "tool calls run from one reply", ge=1)
    max_tool_calls: int = key(4, "tool calls per episode", ge=1)
    max_tool_output_chars: int = key(2000, "longer tool output is cut, and the message says so", ge=1)
    # With a window every turn is prompted afresh (the instructions, the kept turns, the current
    # state), so a turn costs the same at turn 10 as at turn 1 (RAGEN's max_context_window).
    max_context_window: int = key(
        -1, "past turns the prompt shows before the current state; -1: the whole episode", ge=-1
    )
    program: Optional[str] = key(
        None,
        "'package.module:function': an agent program plays the task through an "
        "OpenAI-compatible client (agent_type: program; grl/gateway/programs.py); "
        "max_turns caps its calls, max_tokens each reply",
    )
    program_timeout: float = key(300.0, "seconds an agent program may take for one episode", gt=0)
    program_workers: int = key(64, "agent programs running at once", ge=1)
    program_max_rss_mb: float = key(
        8192.0,
        "MiB of resident memory an agent program's worker process and the processes it starts may hold; "
        "past it the episode ends and the worker is replaced (a worker alone holds ~60)",
        ge=128,
    )
    brief_turns: bool = key(
        False,
        "a later turn's message leaves out a zero reward and the per-answer action cap "
        "when it is one (the reply format already asks for one action): fewer tokens a turn",
    )


@dataclass
class TaskInstance:
    agent_type: str = MISSING  # checked against the registry of grl/agents/tasks.py
    agent_config: AgentConfig = section(AgentConfig)
    env_config: dict[str, Any] = field(
        default_factory=dict
    )  # checked against the env constructor's signature


@dataclass(frozen=True)
class Task:
    """A task instance of configs/agents.yaml, checked once (by grl.config for a run's tasks, by
    grl.agents.task_from_block for a block given by hand): what the rollout, the gateway, the planner and
    make_agent read, without checking or defaulting it again."""

    agent_type: str
    env_type: (
        str | None
    )  # the grl.envs name (or module:Class path) its agent drives; None for an agent program
    agent_config: AgentConfig  # every key set, the left-out ones to their defaults
    env_config: Mapping[
        str, Any
    ]  # the env constructor's keyword arguments (an agent program's `task.config`)
