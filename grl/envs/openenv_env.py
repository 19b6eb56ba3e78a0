"""OpenEnv environments (github.com/meta-pytorch/OpenEnv, PyPI `openenv-core`) behind GRL's env contract.

Played through OpenEnv's own client (`GenericEnvClient`, synchronous wrapper): one WebSocket session per
GRL env, which the server backs with its own environment instance. `env_config`:
- `base_url`: a running OpenEnv server (`http://host:port`); or
- `app`: an OpenEnv app to start here, `package.module:app`, served by uvicorn in a child process on
  127.0.0.1 and a free port (no Docker; grl/envs/openenv_servers.py). The GRL envs of one process that
  start the same app share its server (`share_server`, default true: one process for a rollout's 64
  agents, not 64), each with a session of its own; the server stops when the last of them closes. An
  app whose environment takes one session at a time needs `share_server: false` (a server per GRL env).
  With `app_kwargs` (a mapping, {} too) `app` names a factory called with them (GRL's own envs:
  `grl.envs.openenv_serve:make_app`, `app_kwargs: {env: tetris, env_config: {...}}`). Without base_url
  or app, that is what is served (`app_kwargs` by default {env: tetris}): the env plays out of the box.
- `action_field` ("message", as in OpenEnv's echo env): the action field the reply text is sent in.
- `text_field` ("text"): the observation field shown to the model; an observation without it (or with
  `text_field: null`) is shown as compact JSON.
- `actions_field` ("valid_actions"): an observation field listing the legal actions, for `valid_actions()`
  (constrained decoding); an observation without such a list leaves actions free text.
- `info_field` ("info"): an observation mapping merged into `info` (GRL's served envs put success and
  validity there). Without it: success is a positive reward at the end; an action is valid when the last
  list of legal actions holds it (or when there is none).
- `timeout_s` (30): the limit of each request (connect, reset, step); `start_timeout_s` (60): of a local start.
Seeds: `reset(seed)` is OpenEnv's `reset(seed=seed)`, which the server hands to its environment's `reset`.
A connection error, a server error, a timeout or a malformed response raises `OpenEnvError`, one line
naming the env and the URL; the rollout ends that episode as an env error.
"""

from __future__ import annotations

import json
import numbers
from typing import Any

from openenv.core.generic_client import GenericEnvClient

from grl.envs.base import Env, step_info
from grl.envs.checks import describe
from grl.envs.openenv_servers import LocalServer, OpenEnvError, acquire, release
from grl.errors import first_line

SERVE_GRL = "grl.envs.openenv_serve:make_app"  # GRL's own envs as OpenEnv environments
_CONTRACT_KEYS = ("success", "action_is_valid", "action_is_effective")


class _Client(GenericEnvClient):
    def _parse_result(self, payload: Any):
        # OpenEnv's generic client reads a missing observation as {}: a malformed answer would pass as a state.
        if not isinstance(payload, dict) or not isinstance(payload.get("observation"), dict):
            raise ValueError(f"malformed response (no observation object): {describe(payload)}")
        return super()._parse_result(payload)


def _close_quietly(client) -> None:
    try:
        client.close()
    except Exception:  # noqa: BLE001, S110 - closing is best effort: the session may be gone already
        pass


class OpenEnvEnv(Env):
    def __init__(
        self,
        base_url: str | None = None,
        app: str | None = None,
        app_kwargs: dict | None = None,
        action_field: str = "message",
        text_field: str | None = "text",
        actions_field: str | None = "valid_actions",
        info_field: str | None = "info",
        timeout_s: float = 30.0,
        start_timeout_s: float = 60.0,
        share_server: bool = True,
    ):
        if base_url is not None and app is not None:
            raise ValueError(f"openenv: give base_url (a running server) or app (one to start), not both: {base_url!r}, {app!r}")
        if base_url is None and app is None:
            app, app_kwargs = SERVE_GRL, {"env": "tetris"} if app_kwargs is None else app_kwargs
        if base_url is not None and (not isinstance(base_url, str) or "://" not in base_url):
            raise ValueError(f"openenv: base_url must be a URL such as http://127.0.0.1:8000, got {base_url!r}")
        if app is not None and (not isinstance(app, str) or ":" not in app):
            raise ValueError(f"openenv: app must be a 'package.module:attribute' path, got {app!r}")
        if app_kwargs is not None and (app is None or not isinstance(app_kwargs, dict)):
            raise ValueError(f"openenv: app_kwargs must be a mapping and come with app, got {app_kwargs!r}")
        for key, value in (("timeout_s", timeout_s), ("start_timeout_s", start_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"openenv: {key} must be a number of seconds > 0, got {value!r}")
        if not isinstance(action_field, str) or not action_field:
            raise ValueError(f"openenv: action_field must name a field of the action, got {action_field!r}")
        self.base_url, self.app, self.app_kwargs = base_url, app, app_kwargs
        self.action_field, self.text_field = action_field, text_field
        self.actions_field, self.info_field = actions_field, info_field
        self.timeout_s, self.start_timeout_s = float(timeout_s), float(start_timeout_s)
        self._label = app or "remote"
        self._client = None
        self._retired: list = []  # clients that failed mid-exchange; closed (never read again) in close()
        self._share_server = share_server
        self._server: LocalServer | None = None  # the local server this env uses
        self._started_url = base_url is None
        self._observation: dict[str, Any] = {}
        self._intro: dict[str, Any] = {}

    # --------------------------------------------------------------- server and session

    @property
    def server_pid(self) -> int | None:
        return None if self._server is None else self._server.pid

    def _session(self):
        if self._client is None:
            if self._started_url and self._server is None:
                self._server = acquire(self.app, self.app_kwargs, shared=self._share_server, start_timeout_s=self.start_timeout_s)
                self.base_url = self._server.url
            self._client = _Client(
                base_url=self.base_url, connect_timeout_s=self.timeout_s, message_timeout_s=self.timeout_s
            ).sync()
        return self._client

    def _exchange(self, what: str, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], float, bool]:
        try:
            client = self._session()
            result = getattr(client, what)(*args, **kwargs)
            observation, reward, done = result.observation, result.reward, result.done
            if reward is not None and (isinstance(reward, bool) or not isinstance(reward, numbers.Real)):
                raise ValueError(f"malformed response: reward {describe(reward)}")
            if not isinstance(done, bool):
                raise ValueError(f"malformed response: done {describe(done)}")
            text = observation.get(self.text_field) if self.text_field else None
            if text is not None and not isinstance(text, str):
                raise ValueError(f"malformed response: observation field {self.text_field!r} is {describe(text)}")
        except OpenEnvError:
            raise
        except Exception as err:  # noqa: BLE001 - every failure at the boundary becomes one line naming the server
            if self._client is not None:  # a late answer could be read as the next one's: never use it again
                self._retired.append(self._client)
                self._client = None
            raise OpenEnvError(
                f"openenv ({self._label}): {what} failed at {self.base_url}: {first_line(err, with_type=True)}"
            ) from None
        self._observation = observation
        return observation, float(reward or 0.0), done

    def _render(self) -> str:
        text = self._observation.get(self.text_field) if self.text_field else None
        if text is None:
            return json.dumps(self._observation, sort_keys=True, separators=(",", ":"), default=str)
        return text

    # --------------------------------------------------------------- contract

    def reset(self, seed: int) -> str:
        self._exchange("reset", seed=seed)
        self._intro = self._observation
        return self._render()

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        legal = self.valid_actions()
        observation, reward, done = self._exchange("step", {self.action_field: action})
        served = observation.get(self.info_field) if self.info_field else None
        if isinstance(served, dict):
            extra = {key: value for key, value in served.items() if key not in _CONTRACT_KEYS}
            info = step_info(
                served.get("success", False),
                served.get("action_is_valid", True),
                served.get("action_is_effective", True),
                **extra,
            )
        else:
            valid = legal is None or action in legal
            info = step_info(done and reward > 0, valid, valid)
        return self._render(), reward, done, info

    def valid_actions(self) -> list[str] | None:
        actions = self._observation.get(self.actions_field) if self.actions_field else None
        return list(actions) if isinstance(actions, list) else None

    # An env that says what its symbols and actions are (GRL's served envs do, at reset) feeds the first prompt.
    def legend(self) -> str:
        text = self._intro.get("legend")
        return text if isinstance(text, str) else ""

    def action_help(self) -> str:
        text = self._intro.get("action_help")
        return text if isinstance(text, str) else ""

    def close(self) -> None:
        # A healthy session says goodbye while its server is up; failed ones may wait on a hung server, so after it.
        if self._client is not None:
            _close_quietly(self._client)
        if self._server is not None:
            release(self._server)
            self._server = None
        for client in self._retired:
            _close_quietly(client)
        self._client, self._retired = None, []
