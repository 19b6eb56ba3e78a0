"""OpenEnv environments (github.com/meta-pytorch/OpenEnv, PyPI `openenv-core`) behind GRL's env contract.

Played through OpenEnv's own clients (`GenericEnvClient`; `MCPToolClient` for MCP envs), synchronous: one
WebSocket session per
GRL env, which the server backs with its own environment instance. `env_config`:
- `base_url`: a running OpenEnv server (`http://host:port`); or
- `package`: an installed OpenEnv env package, by module (`echo_env`) or distribution (`openenv-echo_env`):
  its manifest's app is started here as `app` is (grl/envs/openenv/packages.py); what the package needs and
  this machine lacks fails when the env is built, in one line; or
- `app`: an OpenEnv app to start here, `package.module:app`, served by uvicorn in a child process on
  127.0.0.1 and a free port (no Docker; grl/envs/openenv/servers.py). The GRL envs of one process that
  start the same app share its server (`share_server`, default true: one process for a rollout's 64
  agents, not 64), each with a session of its own; the server stops when the last of them closes. An
  app that takes few sessions at once (`openenv init`'s template: one) gets a server per that many envs,
  kept in a pool between episodes (grl/envs/openenv/servers.py); `share_server: false`: one per env.
  With `app_kwargs` (a mapping, {} too) `app` names a factory called with them (GRL's own envs:
  `grl.envs.openenv.serve:make_app`, `app_kwargs: {env: tetris, env_config: {...}}`). Without base_url
  or app, that is what is served (`app_kwargs` by default {env: tetris}): the env plays out of the box.
- `interface` ("auto"): `mcp` for OpenEnv's tool-calling envs (grl/envs/openenv/mcp.py: the env's tools are
  offered to the model, a reply's tool call runs in the env, its result is the observation), `action` for
  envs that take a typed action; `auto` reads which from the env's action schema (`GET /schema`).
- `action_field` (null): the action field the reply is sent in; null: the action's only field, read from
  the env's action schema (`message` for GRL's served envs), and an action of several fields is written
  as a JSON object. The reply is converted to the field's type (grl/envs/openenv/actions.py): an integer
  move id is written as its number.
- `text_field` ("text"): the observation field shown to the model; an observation without it (or with
  `text_field: null`) is shown as compact JSON.
- `actions_field` (["valid_actions", "legal_actions"]): observation fields listing the legal actions (the
  first present is used), for `valid_actions()` (constrained decoding), each rendered to text and sent back
  as the value it was (OpenSpiel's integer ids); an observation without such a list leaves actions free.
- `info_field` ("info"): an observation mapping merged into `info` (GRL's served envs put success and
  validity there). Without it: success is a positive reward at the end; an action is valid when the last
  list of legal actions holds it (or when there is none).
- `timeout_s` (30): the limit of each request (connect, reset, step); `start_timeout_s` (60): of a local
start.
Seeds: `reset(seed)` is OpenEnv's `reset(seed=seed)`, which the server hands to its environment's `reset`.
A connection error, a server error, a timeout or a malformed response raises `OpenEnvError`, one line
naming the env and the URL; the rollout ends that episode as an env error.
"""

from __future__ import annotations

import json
import numbers
import urllib.error
import urllib.request
from typing import Any

from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction
from openenv.core.generic_client import GenericEnvClient

from grl.envs.openenv import mcp
from grl.envs.base import Env, step_info
from grl.envs.checks import describe
from grl.envs.openenv.actions import ActionCodec, ActionError, render
from grl.envs.openenv.packages import resolve
from grl.envs.openenv.servers import LocalServer, OpenEnvError, acquire, release
from grl.errors import first_line

SERVE_GRL = "grl.envs.openenv.serve:make_app"  # GRL's own envs as OpenEnv environments
INTERFACES = ("auto", "action", "mcp")
_CONTRACT_KEYS = ("success", "action_is_valid", "action_is_effective")


class _Client(GenericEnvClient):
    def _parse_result(self, payload: Any):
        # OpenEnv's generic client reads a missing observation as {}: a malformed answer would pass as a
        # state.
        if not isinstance(payload, dict) or not isinstance(payload.get("observation"), dict):
            raise ValueError(f"malformed response (no observation object): {describe(payload)}")
        return super()._parse_result(payload)


def _close_quietly(client) -> None:
    try:
        client.close()
    except Exception:  # noqa: BLE001, S110 - closing is best effort: the session may be gone already
        pass


def _action_schema(base_url: str, timeout_s: float) -> dict[str, Any] | None:
    """The env's action schema (`GET /schema`); None from a server that publishes none."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # a proxy must not see 127.0.0.1
    try:
        with opener.open(f"{base_url.rstrip('/')}/schema", timeout=timeout_s) as response:
            schema = json.loads(response.read()).get("action")
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise
    return schema if isinstance(schema, dict) else None


def _is_mcp(schema: dict[str, Any] | None) -> bool:
    fields = (schema or {}).get("properties") or {}
    return "tool_name" in fields and "arguments" in fields


class OpenEnvEnv(Env):
    def __init__(
        self,
        base_url: str | None = None,
        app: str | None = None,
        app_kwargs: dict | None = None,
        package: str | None = None,
        interface: str = "auto",
        action_field: str | None = None,
        text_field: str | None = "text",
        actions_field: str | list[str] | None = ("valid_actions", "legal_actions"),
        info_field: str | None = "info",
        timeout_s: float = 30.0,
        start_timeout_s: float = 60.0,
        share_server: bool = True,
    ):
        given = [
            key
            for key, value in (("base_url", base_url), ("app", app), ("package", package))
            if value is not None
        ]
        if len(given) > 1:
            raise ValueError(
                "openenv: give one of base_url (a running server), app or package (one to start), not "
                f"{given}"
            )
        if package is not None:
            if app_kwargs is not None:
                raise ValueError(f"openenv: app_kwargs come with app, not package: {app_kwargs!r}")
            app = resolve(package)
        if base_url is None and app is None:
            app, app_kwargs = SERVE_GRL, {"env": "tetris"} if app_kwargs is None else app_kwargs
        if base_url is not None and (not isinstance(base_url, str) or "://" not in base_url):
            raise ValueError(
                f"openenv: base_url must be a URL such as http://127.0.0.1:8000, got {base_url!r}"
            )
        if app is not None and (not isinstance(app, str) or ":" not in app):
            raise ValueError(f"openenv: app must be a 'package.module:attribute' path, got {app!r}")
        if app_kwargs is not None and (app is None or not isinstance(app_kwargs, dict)):
            raise ValueError(f"openenv: app_kwargs must be a mapping and come with app, got {app_kwargs!r}")
        for key, value in (("timeout_s", timeout_s), ("start_timeout_s", start_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"openenv: {key} must be a number of seconds > 0, got {value!r}")
        if action_field is not None and (not isinstance(action_field, str) or not action_field):
            raise ValueError(
                f"openenv: action_field must name a field of the action (or be null), got {action_field!r}"
            )
        if interface not in INTERFACES:
            raise ValueError(f"openenv: interface must be one of {', '.join(INTERFACES)}, got {interface!r}")
        if isinstance(actions_field, str):
            actions_field = [actions_field]
        if actions_field is not None and not all(isinstance(field, str) and field for field in actions_field):
            raise ValueError(f"openenv: actions_field must name observation fields, got {actions_field!r}")
        self.base_url, self.app, self.app_kwargs, self.interface = base_url, app, app_kwargs, interface
        self.action_field, self.text_field = action_field, text_field
        self.actions_fields, self.info_field = list(actions_field or []), info_field
        self.timeout_s, self.start_timeout_s = float(timeout_s), float(start_timeout_s)
        self._label = package or app or "remote"
        self._client = None
        self._retired: list = []  # clients that failed mid-exchange; closed (never read again) in close()
        self._share_server = share_server
        self._server: LocalServer | None = None  # the local server this env uses
        self._started_url = base_url is None
        self._codec: ActionCodec | None = None
        self._mcp = interface == "mcp"
        self._tools: list[dict[str, Any]] | None = None  # an MCP env's tools, as offered to the model
        self._observation: dict[str, Any] = {}
        self._intro: dict[str, Any] = {}

    # --------------------------------------------------------------- server and session

    @property
    def server_pid(self) -> int | None:
        return None if self._server is None else self._server.pid

    def _session(self):
        if self._client is None:
            if self._started_url and self._server is None:
                self._server = acquire(
                    self.app, self.app_kwargs, shared=self._share_server, start_timeout_s=self.start_timeout_s
                )
                self.base_url = self._server.url
            if self._codec is None:
                schema = _action_schema(self.base_url, self.timeout_s)
                self._mcp = self.interface == "mcp" or (self.interface == "auto" and _is_mcp(schema))
                self._codec = ActionCodec(
                    None if self._mcp else schema, self.action_field, f"openenv ({self._label})"
                )
            client_class = mcp.MCPClient if self._mcp else _Client
            self._client = client_class(
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
                raise ValueError(
                    f"malformed response: observation field {self.text_field!r} is {describe(text)}"
                )
            if self._mcp and isinstance(args[0] if args else None, ListToolsAction):
                self._tools = mcp.read_tools(observation)
                return observation, 0.0, False
        except OpenEnvError:
            raise
        except Exception as err:  # noqa: BLE001 - every failure at the boundary becomes one line naming the server
            if self._client is not None:  # a late answer could be read as the next one's: never use it again
                self._retired.append(self._client)
                self._client = None
            raise OpenEnvError(
                f"openenv ({self._label}): {what} failed at {self.base_url}: "
                f"{first_line(err, with_type=True)}"
            ) from None
        self._observation = observation
        return observation, float(reward or 0.0), done

    def _render(self) -> str:
        text = self._observation.get(self.text_field) if self.text_field else None
        if text is None:
            return json.dumps(self._observation, sort_keys=True, separators=(",", ":"), default=str)
        return text

    def _legal(self) -> dict[str, Any] | None:
        """The legal actions now, as text -> the value the env takes; None: the env lists none."""
        for field in self.actions_fields:
            values = self._observation.get(field)
            if isinstance(values, list):
                return {render(value): value for value in values}
        return None

    # --------------------------------------------------------------- contract

    def reset(self, seed: int) -> str:
        self._exchange("reset", seed=seed)
        self._intro = self._observation
        if self._mcp and self._tools is None:
            self._exchange("step", ListToolsAction())
        return self._render()

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self._mcp:
            return self._call_tool(action)
        legal = self._legal()
        try:
            payload = self._codec.encode(action, legal)
        except ActionError:  # not an action of the env's type: nothing to send
            return self._render(), 0.0, False, step_info(False, False, False)
        observation, reward, done = self._exchange("step", payload)
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

    def _call_tool(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        call = mcp.decode_call(action)
        names = [tool["function"]["name"] for tool in self._tools or []]
        if isinstance(call, tuple) and call[0] not in names:
            call = f"unknown tool {call[0]!r} (tools: {', '.join(names)})"
        if isinstance(call, str):  # no call the env could run: it is not stepped
            return f"[tool call not run: {call}]", 0.0, False, step_info(False, False, False, tool_error=call)
        observation, reward, done = self._exchange(
            "step", CallToolAction(tool_name=call[0], arguments=call[1])
        )
        text, failure = mcp.result_text(observation)
        info = step_info(done and reward > 0, not failure, not failure, tool=call[0])
        if failure:
            info["tool_error"] = failure
        return text, reward, done, info

    def valid_actions(self) -> list[str] | None:
        legal = None if self._mcp else self._legal()
        return None if legal is None else list(legal)

    # An env that says what its symbols and actions are (GRL's served envs do, at reset) feeds the first
    # prompt.
    def legend(self) -> str:
        text = self._intro.get("legend")
        return text if isinstance(text, str) else ""

    def action_help(self) -> str:
        text = self._intro.get("action_help")
        parts = [text if isinstance(text, str) else ""]
        if self._mcp and self._tools:
            parts.append(mcp.tools_prompt(self._tools))
        elif self._codec is not None:
            parts.append(self._codec.describe())
        return "\n".join(part for part in parts if part)

    def close(self) -> None:
        # A healthy session says goodbye while its server is up; failed ones may wait on a hung server, so
        # after it.
        if self._client is not None:
            _close_quietly(self._client)
        if self._server is not None:
            release(self._server)
            self._server = None
        for client in self._retired:
            _close_quietly(client)
        self._client, self._retired = None, []
