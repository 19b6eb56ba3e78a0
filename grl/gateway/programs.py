"""Agent programs as tasks: `agent_config.program: "module:function"`, trained through the gateway.

Each episode of a program task calls `function(client, task)` once, on a thread of its own: `client` is
an `openai.OpenAI` whose base URL names the episode (`http://127.0.0.1:<port>/episodes/<id>/v1`), `task`
a `ProgramTask` (its seed, group and attempt, the task's `env_config`). The program talks to the model
through `client` as it would to any OpenAI endpoint and returns the episode's reward: a number, a mapping
with `reward` and other numbers (the episode's metrics, e.g. `success`), or a function that takes the
final messages (the last call's, then the reply) and returns one of those.

At most `agent_config.program_workers` programs run at once, each under `agent_config.program_timeout`
seconds; an episode has at most `agent_config.max_turns` calls of at most `agent_config.max_tokens`
reply tokens. A program that raises, overruns its time or returns anything else ends its episode with
the penalty an env failure gets, is counted (`gateway/program_errors`, `gateway/program_timeouts`,
`gateway/bad_rewards`) and the rollout goes on; calls past the budget, or of an episode that ended, are
refused with HTTP 400 (`gateway/refused_calls`).

The calls of all running programs reach one engine: handlers queue them (`BatchingEngine.generate`),
and the rollout's thread, which owns the engine, serves whatever is waiting in one engine call
(`BatchingEngine.serve`), as GRL's own agents are served without a turn barrier. Every call samples
with the rollout's temperature and top-p, whatever the request says, because the update scores the
tokens under the distribution they were drawn from. The episode's tokens are the engine's own
(grl/gateway/episodes.py); an edited history is a prefix break (`gateway/prefix_breaks`).
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import queue
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from grl.agents.base import settings_from_mapping
from grl.engines.base import SamplingParams
from grl.gateway.episodes import EpisodeLog
from grl.gateway.server import BadRequest, Gateway, build_app
from grl.rollout.env_pool import CallPool
from grl.rollout.env_faults import check_failure_ratio
from grl.rollout.tasks import TaskSpec
from grl.rollout.types import Episode

log = logging.getLogger("grl.gateway")
MODEL_NAME = "grl-policy"
GATHER_S = 0.01  # calls that arrive within this many seconds of the first share an engine call
# A program's client outwaits its clock (program_timeout): a call still queued when the clock runs out
# ends the episode as the program's timeout, not as an error the program raised.
CLIENT_GRACE_S = 30.0


@dataclass(frozen=True)
class ProgramTask:
    """What a program is told about its episode."""

    task: str  # the task instance's name
    seed: int  # the episode's seed: the attempts of a group share it
    group: int
    attempt: int  # position within the group
    config: dict  # the task's env_config
    model: str = MODEL_NAME  # what to pass as `model` (the gateway serves one)


def load_program(path: str) -> Callable:
    """The callable named by "package.module:function"; ValueError with one line otherwise."""
    module_name, _, name = str(path).partition(":")
    if not module_name or not name:
        raise ValueError(f"program {path!r}: expected 'package.module:function'")
    if os.getcwd() not in sys.path:  # a program of the user's own, next to where they run (as uvicorn does)
        sys.path.append(os.getcwd())
    try:
        target = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any import failure is the config's to report
        raise ValueError(f"program {path!r}: cannot import {module_name}: {type(err).__name__}: {err}") from None
    for part in name.split("."):
        target = getattr(target, part, None)
    if not callable(target):
        raise ValueError(f"program {path!r}: {module_name} has no callable {name}")
    return target


def _final_messages(episode: EpisodeLog) -> list[dict]:
    last = episode.calls[-1] if episode.calls else None
    return [*last.messages, last.returned] if last else []


class ProgramValueError(ValueError):
    """A program returned something that is not a reward."""


def reward_of(result: Any) -> tuple[float, dict[str, float]]:
    """(reward, metrics) of what a program returned: a finite number, or a mapping with `reward` (a finite
    number) and metrics (finite numbers or bools, e.g. `success: True`)."""

    def number(value, what: str, flag_ok: bool = False) -> float:
        if (isinstance(value, bool) and not flag_ok) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ProgramValueError(f"{what} must be a finite number, got {type(value).__name__} {str(value)[:80]!r}")
        return float(value)

    if isinstance(result, Mapping):
        if "reward" not in result:
            raise ProgramValueError(f"a returned mapping needs 'reward'; it has {sorted(map(str, result))[:8]}")
        return number(result["reward"], "reward"), {str(k): number(v, str(k), True) for k, v in result.items() if k != "reward"}
    return number(result, "the returned reward"), {}


@dataclass
class _Request:
    prompts: list[list[int]]
    sampling: SamplingParams
    constraints: list | None
    done: threading.Event = field(default_factory=threading.Event)
    outputs: list | None = None
    error: str | None = None


class BatchingEngine:
    """`generate` from any thread waits in a queue; `serve` (the engine owner's thread) answers every
    waiting call in one engine call per kind of sampling. Outside `serving()`, calls are refused."""

    def __init__(self, engine):
        self.engine = engine
        self._queue: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._serving = False

    def generate(self, prompts, sampling, constraints=None):
        if not self._serving:
            raise BadRequest("no rollout is running: the episode this call belongs to is over")
        request = _Request(list(prompts), sampling, constraints)
        self._queue.put(request)
        while not request.done.wait(0.5):
            if not self._serving:  # queued just as the rollout ended: nobody will serve it
                request.error = "the rollout ended before this call was served"
                break
        if request.error is not None:
            raise BadRequest(request.error)
        return request.outputs

    def serving(self, on: bool) -> None:
        self._serving = on
        if not on:  # calls that came too late are answered, not left hanging
            for request in self._drain(0.0):
                request.error = "the rollout ended before this call was served"
                request.done.set()

    def serve(self, wait: float) -> int:
        """Answer the calls waiting now (after waiting up to `wait` s for a first); -> how many."""
        requests = self._drain(wait)
        groups: dict[str, list[_Request]] = {}
        for request in requests:
            key = repr(replace(request.sampling, seed=None, request_seeds=None))
            groups.setdefault(key, []).append(request)
        for group in groups.values():
            prompts = [p for r in group for p in r.prompts]
            seeds = [r.sampling.seed_of(i) for r in group for i in range(len(r.prompts))]
            constraints = [c for r in group for c in (r.constraints or [None] * len(r.prompts))]
            sampling = replace(group[0].sampling, seed=None, request_seeds=seeds)
            try:
                outputs = self.engine.generate(
                    prompts, sampling, constraints if any(c is not None for c in constraints) else None
                )
            except BaseException:
                for request in group:
                    request.error = "the engine failed on this call"
                    request.done.set()
                raise
            at = 0
            for request in group:
                request.outputs, at = outputs[at : at + len(request.prompts)], at + len(request.prompts)
                request.done.set()
        return len(requests)

    def _drain(self, wait: float) -> list[_Request]:
        taken = []
        try:
            taken.append(self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait())
            deadline = time.monotonic() + GATHER_S
            while (left := deadline - time.monotonic()) > 0:
                taken.append(self._queue.get(timeout=left))
        except queue.Empty:
            pass
        return taken


class LocalServer:
    """An ASGI app served by uvicorn on a thread of this process, on 127.0.0.1 and a free port."""

    def __init__(self, app, host: str = "127.0.0.1"):
        import uvicorn

        self._socket = socket.socket()
        self._socket.bind((host, 0))
        self.url = f"http://{host}:{self._socket.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="grl-gateway", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the gateway's HTTP server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()


@dataclass
class _Running:
    name: str
    spec: TaskSpec
    settings: Any  # the task's agent_config (grl.schema.AgentConfig)
    task: ProgramTask
    log: EpisodeLog


class ProgramRunner:
    """Plays program tasks for the rollout: `run(tasks, base_seed, first_group, sampling)` -> (episodes,
    metrics). Built by the trainer over its engine; its HTTP server lives until `close`."""

    def __init__(
        self,
        engine,
        tokenizer,
        *,
        context: int,
        max_response_length: int,
        env_error_penalty: float | None = None,
        max_failed_agent_ratio: float = 0.5,
    ):
        self.engine = BatchingEngine(engine)
        self.gateway = Gateway(
            self.engine, tokenizer, MODEL_NAME, max_tokens=max_response_length, context=context, open_episodes=False
        )
        self.max_response_length = max_response_length
        self.env_error_penalty = env_error_penalty
        self.max_failed_agent_ratio = max_failed_agent_ratio
        self._server: LocalServer | None = None
        self._logged: set[tuple[str, str]] = set()

    @classmethod
    def from_config(cls, cfg, engine, tokenizer) -> ProgramRunner:
        r = cfg.rollout
        return cls(
            engine,
            tokenizer,
            context=cfg.max_prompt_length + cfg.max_response_length,
            max_response_length=cfg.max_response_length,
            env_error_penalty=r.env_error_penalty,
            max_failed_agent_ratio=r.max_failed_agent_ratio,
        )

    @property
    def url(self) -> str:
        if self._server is None:
            self._server = LocalServer(build_app(self.gateway))
        return self._server.url

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def run(
        self,
        tasks: list[TaskSpec],
        base_seed: int,
        first_group: int,
        sampling: SamplingParams,
        on_turn: Callable[[int, int, int], None] | None = None,
    ) -> tuple[list[Episode], dict[str, float]]:
        running = self._open(tasks, base_seed, first_group, sampling)
        url, pools, outcome = self.url, {}, {}
        self.engine.serving(True)
        try:
            for key, r in enumerate(running):
                program = load_program(r.settings.program)
                if r.spec.name not in pools:
                    pools[r.spec.name] = CallPool(r.settings.program_workers, r.settings.program_timeout, "program_timeout")
                pools[r.spec.name].submit(key, lambda r=r, program=program: self._play(program, f"{url}/episodes/{r.name}/v1", r))
            shown = 0.0
            while any(pool.pending for pool in pools.values()):
                self.engine.serve(wait=0.05)
                for pool in pools.values():
                    outcome.update(pool.collect(wait=0.0))
                if on_turn is not None and time.monotonic() - shown > 1.0:
                    shown = time.monotonic()
                    on_turn(max(len(r.log.calls) for r in running), len(running) - len(outcome), len(running))
        finally:
            self.engine.serving(False)
            for pool in pools.values():
                pool.close()
            for r in running:
                self.gateway.close_episode(r.name)
        episodes = [self._episode(r, outcome[key]) for key, r in enumerate(running)]
        check_failure_ratio(
            [(e.task, e.seed, e.error) for e in episodes if e.error is not None],
            len(episodes),
            self.max_failed_agent_ratio,
            "programs",
        )
        return episodes, self._metrics(running, episodes)

    def _open(self, tasks, base_seed, first_group, sampling) -> list[_Running]:
        running, group = [], first_group
        for spec in tasks:
            settings = settings_from_mapping(spec.config.get("agent_config") or {}, f"{spec.name}.agent_config")
            limit = min(self.max_response_length, settings.max_tokens)
            for _ in range(spec.num_groups):
                for attempt in range(spec.group_size):
                    name = uuid.uuid4().hex
                    index = len(running)
                    episode_log = EpisodeLog(
                        sampling=replace(sampling, max_new_tokens=limit, seed=None, request_seeds=None),
                        seed=None if sampling.seed is None else sampling.seed + 1009 * index,
                        max_calls=settings.max_turns,
                    )
                    self.gateway.open_episode(name, episode_log)
                    task = ProgramTask(spec.name, base_seed + group, group, attempt, dict(spec.config.get("env_config") or {}))
                    running.append(_Running(name, spec, settings, task, episode_log))
                group += 1
        return running

    @staticmethod
    def _play(program: Callable, base_url: str, r: _Running):
        import openai

        timeout = r.settings.program_timeout + CLIENT_GRACE_S
        with openai.OpenAI(base_url=base_url, api_key="grl", max_retries=0, timeout=timeout) as client:
            result = program(client, r.task)
            if callable(result):
                result = result(_final_messages(r.log))
        try:
            return reward_of(result)
        except ProgramValueError as err:  # returned, not raised, so that its kind survives the pool
            return err

    def _episode(self, r: _Running, outcome) -> Episode:
        turns = r.log.turns()
        error = kind = None
        reward, metrics = 0.0, {}
        if not outcome.ok:
            error, kind = outcome.error, "timeout" if outcome.timed_out else "exception"
        elif isinstance(outcome.value, ProgramValueError):
            error, kind = f"bad reward: {outcome.value}", "bad_reward"
        else:
            reward, metrics = outcome.value
        if error is not None:
            penalty = self.env_error_penalty if self.env_error_penalty is not None else r.settings.format_penalty
            reward = penalty
            if (r.spec.name, kind) not in self._logged:
                self._logged.add((r.spec.name, kind))
                log.error(
                    "program of task %s failed (%s, seed %d, group %d, attempt %d); episode ended with reward "
                    "%g; further ones of this task and kind are only counted:\n%s",
                    r.spec.name,
                    kind,
                    r.task.seed,
                    r.task.group,
                    r.task.attempt,
                    penalty,
                    error.strip(),
                )
        if turns:
            turns[-1].reward = reward
        return Episode(
            task=r.spec.name,
            group_id=r.task.group,
            seed=r.task.seed,
            turns=turns,
            score=reward if turns else 0.0,
            metrics=metrics,
            error=error,
            error_kind=kind,
            member=r.task.attempt,
            messages=_final_messages(r.log),
        )

    @staticmethod
    def _metrics(running: list[_Running], episodes: list[Episode]) -> dict[str, float]:
        counts = {
            "calls": sum(len(r.log.calls) for r in running),
            "prefix_breaks": sum(r.log.prefix_breaks for r in running),
            "refused_calls": sum(r.log.refused for r in running),
            "program_errors": sum(e.error_kind == "exception" for e in episodes),
            "program_timeouts": sum(e.error_kind == "timeout" for e in episodes),
            "bad_rewards": sum(e.error_kind == "bad_reward" for e in episodes),
            "episodes_without_calls": sum(not e.turns for e in episodes),
        }
        return {f"gateway/{name}": float(value) for name, value in counts.items()}
