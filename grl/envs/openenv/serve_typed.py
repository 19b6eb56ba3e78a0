"""GRL's envs served as the other two kinds of OpenEnv environment: with integer actions, and as MCP tools.

`make_typed_app(env, env_config)`: the action is a move id, `GRLMove(action_id: int)`, and the observation
lists the legal ids (`legal_actions: [0, 1, 2]`), as OpenSpiel's OpenEnv env does; id i is the GRL env's
i-th valid action at reset (its action help says which is which), and an id outside the list is an invalid
move. Only for envs with a fixed list of valid actions.

`make_mcp_app(env, env_config)`: an `MCPEnvironment` (OpenEnv's tool-calling env, over FastMCP) whose tools
are `act(action)`, one step of the GRL env returning its observation text (the step's reward and end are the
observation's), and `legal_actions()`, what the env accepts now (no step, no reward).

Both keep the reset of grl/envs/openenv/serve.py: `reset(seed=...)` seeds the GRL env, and the observation
carries its text, legend and action help.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server import Action, Environment, State, create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from pydantic import Field

import grl.envs
from grl.envs.openenv.serve import GRLObservation


class GRLMove(Action):
    action_id: int = Field(..., description="The id of the move, one of the observation's legal_actions")


class GRLBoard(GRLObservation):
    legal_actions: list[int] = Field(
        default_factory=list, description="The ids of the moves the env accepts now"
    )


def _json_safe(info: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(dict(info), default=str))


class TypedEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each session builds its own GRL env

    def __init__(self, env: str, env_config: dict[str, Any] | None = None):
        super().__init__()
        self._env = grl.envs.make(env, **(env_config or {}))
        self._moves: list[str] = []
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GRLBoard:
        text = self._env.reset(seed)
        self._moves = list(self._env.valid_actions() or [])
        self._state = State(episode_id=episode_id, step_count=0)
        ids = ", ".join(f"{i} = {move}" for i, move in enumerate(self._moves))
        help_text = f"{self._env.action_help()} Moves by id: {ids}.".strip()
        return self._board(text, None, False, {}, legend=self._env.legend(), action_help=help_text)

    def step(self, action: GRLMove, timeout_s: float | None = None, **kwargs: Any) -> GRLBoard:
        self._state.step_count += 1
        if not 0 <= action.action_id < len(self._moves):
            return self._board(
                self._env.render(), 0.0, False, {"action_is_valid": False, "action_is_effective": False}
            )
        text, reward, done, info = self._env.step(self._moves[action.action_id])
        return self._board(text, reward, done, info)

    def _board(self, text: str, reward: Any, done: bool, info: dict[str, Any], **extra: str) -> GRLBoard:
        legal = self._env.valid_actions() or []
        ids = [i for i, move in enumerate(self._moves) if move in legal]
        return GRLBoard(
            text=text, reward=reward, done=done, info=_json_safe(info), legal_actions=ids, **extra
        )

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self._env.close()


class ToolsEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env: str, env_config: dict[str, Any] | None = None):
        tools = FastMCP(f"grl-{env}")
        tools.tool(self.act)
        tools.tool(self.legal_actions)
        super().__init__(tools)
        self._env = grl.envs.make(env, **(env_config or {}))
        self._state = State()
        self._outcome: tuple[float, bool] = (0.0, False)  # the last act's reward and end, for its observation

    def act(self, action: str) -> str:
        """Play one action in the game; returns what the game shows next."""
        text, reward, done, info = self._env.step(action)
        self._outcome = (float(reward), bool(done))
        return text

    def legal_actions(self) -> list[str]:
        """The actions the game accepts now (taking no turn)."""
        return list(self._env.valid_actions() or [])

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GRLObservation:
        text = self._env.reset(seed)
        self._state = State(episode_id=episode_id, step_count=0)
        return GRLObservation(
            text=text, legend=self._env.legend(), action_help=self._env.action_help(), done=False, reward=None
        )

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any):
        return self._scored(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any):
        return self._scored(action, super().step(action, timeout_s=timeout_s, **kwargs))

    def _scored(self, action: Action, observation):
        if (
            isinstance(action, CallToolAction)
            and action.tool_name == "act"
            and isinstance(observation, CallToolObservation)
        ):
            self._state.step_count += 1
            observation.reward, observation.done = self._outcome
            self._outcome = (0.0, False)
        return observation

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any):
        raise ValueError("this env acts through its tools: call act(action)")

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self._env.close()
        super().close()


def make_typed_app(env: str, env_config: dict[str, Any] | None = None, max_concurrent_envs: int = 1024):
    """OpenEnv's app over the GRL env `env` with integer moves (OpenSpiel's shape)."""
    grl.envs.make(env, **(env_config or {})).close()  # a bad name or config fails at start-up
    factory = functools.partial(TypedEnvironment, env, dict(env_config or {}))
    return create_app(factory, GRLMove, GRLBoard, env_name=env, max_concurrent_envs=max_concurrent_envs)


def make_mcp_app(env: str, env_config: dict[str, Any] | None = None, max_concurrent_envs: int = 1024):
    """OpenEnv's app over the GRL env `env` as an MCP environment (tools `act` and `legal_actions`)."""
    grl.envs.make(env, **(env_config or {})).close()
    factory = functools.partial(ToolsEnvironment, env, dict(env_config or {}))
    return create_app(
        factory, CallToolAction, CallToolObservation, env_name=env, max_concurrent_envs=max_concurrent_envs
    )
