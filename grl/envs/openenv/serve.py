"""GRL's envs served as OpenEnv environments (PyPI `openenv-core`), for any OpenEnv client to play.

`make_app(env, env_config)` returns OpenEnv's own FastAPI app (`openenv.core.create_app`) over a GRL env
given by its registry name and env_config. Every WebSocket session of that app gets its own GRL env, built
anew, so sessions share nothing. The action is `GRLAction(message=...)`, the text the model wrote; the
observation (`GRLObservation`) carries the env's text, reward, done, valid actions (None for free text) and
step info, and at reset its legend and action help (the first prompt's lines). `reset(seed=...)` seeds the
GRL env, so an OpenEnv client gets the same episode for the same seed.

Serve one-gap Tetris with uvicorn (the env and its config may also come from the environment):
    GRL_OPENENV_ENV=tetris GRL_OPENENV_CONFIG='{"gap_rows": 1, "max_pieces": 1}' \\
        uvicorn --factory grl.envs.openenv.serve:make_app --port 8000
and play it from GRL with the `openenv` env (grl/envs/openenv/env.py), `base_url: http://127.0.0.1:8000`.
"""

from __future__ import annotations

import functools
import json
import os
import uuid
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field

import grl.envs


class GRLAction(Action):
    message: str = Field(..., description="The action text, as the model wrote it")


class GRLObservation(Observation):
    text: str = Field(default="", description="The GRL env's observation")
    valid_actions: list[str] | None = Field(
        default=None, description="The actions the env accepts now; None: free text"
    )
    info: dict[str, Any] = Field(
        default_factory=dict, description="The step's info: success, action_is_valid, ..."
    )
    legend: str = Field(default="", description="What the symbols mean (set at reset)")
    action_help: str = Field(default="", description="The actions, as a sentence (set at reset)")


class GRLEnvironment(Environment):
    # Each session builds its own GRL env, so OpenEnv may run several sessions in one server.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env: str, env_config: dict[str, Any] | None = None):
        super().__init__()
        self._env = grl.envs.make(env, **(env_config or {}))
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GRLObservation:
        text = self._env.reset(seed)
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return self._observe(
            text, None, False, {}, legend=self._env.legend(), action_help=self._env.action_help()
        )

    def step(self, action: GRLAction, timeout_s: float | None = None, **kwargs: Any) -> GRLObservation:
        text, reward, done, info = self._env.step(action.message)
        self._state.step_count += 1
        return self._observe(text, reward, done, info)

    def _observe(
        self, text: str, reward: Any, done: Any, info: dict[str, Any], **extra: str
    ) -> GRLObservation:
        # An info holding numpy values or objects must still go out as JSON; str() is what a log would show.
        info = json.loads(json.dumps(dict(info), default=str))
        return GRLObservation(
            text=text, reward=reward, done=done, info=info, valid_actions=self._env.valid_actions(), **extra
        )

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self._env.close()


def make_app(
    env: str | None = None, env_config: dict[str, Any] | None = None, max_concurrent_envs: int = 1024
):
    """OpenEnv's FastAPI app serving the GRL env `env` (default: $GRL_OPENENV_ENV) built with `env_config`
    (default: the JSON object in $GRL_OPENENV_CONFIG). `max_concurrent_envs`: WebSocket sessions at once
    (each holds one GRL env; a rollout's agents share one server)."""
    env = env or os.environ.get("GRL_OPENENV_ENV")
    if not env:
        raise ValueError(
            "grl.envs.openenv.serve: name a GRL env (make_app(env=...) or GRL_OPENENV_ENV), e.g. tetris"
        )
    if env_config is None:
        env_config = json.loads(os.environ.get("GRL_OPENENV_CONFIG") or "{}")
    grl.envs.make(
        env, **env_config
    ).close()  # a bad name or config fails at start-up, not in the first session
    factory = functools.partial(GRLEnvironment, env, dict(env_config))
    return create_app(
        factory, GRLAction, GRLObservation, env_name=env, max_concurrent_envs=max_concurrent_envs
    )
