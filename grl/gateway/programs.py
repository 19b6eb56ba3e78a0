"""Agent programs as tasks: `agent_config.program: "module:function"`, trained through the gateway.

Each episode of a program task calls `function(client, task)` once, in a worker process of the task's pool
(grl/gateway/program_pool.py): `client` is an `openai.OpenAI` whose base URL names the episode
(`http://127.0.0.1:<port>/episodes/<id>/v1`), or an `openai.AsyncOpenAI` when `function` is an `async def`
(run with asyncio), `task` a `ProgramTask` (its seed, group and attempt, the task's `env_config`). The
program talks to the model through `client` as it would to any OpenAI endpoint and returns the episode's
reward: a number, a mapping with `reward` and other numbers (the episode's metrics, e.g. `success`), or a
function that takes the final messages (the last call's, then the reply) and returns one of those (called in
the worker, which is sent the messages).

At most `agent_config.program_workers` programs run at once, each under `agent_config.program_timeout`
seconds and `agent_config.program_max_rss_mb` of memory; an episode has at most `agent_config.max_turns`
calls of at most `agent_config.max_tokens` reply tokens. A program that raises, overruns its time or returns
anything else, or whose process crashes, outgrows its memory or leaves a process running, ends its episode
with the penalty an env failure gets and is left out of training, as the infrastructure's doing (but for
a PolicyFault the program raised, and a `reply_timeout` (its calls waited for the model for at least half of
its time, to its end), which keep the format penalty and are trained on:
grl/gateway/program_pool.py, grl/rollout/blame.py), is counted (`gateway/program_errors`,
`gateway/program_timeouts`,
`gateway/bad_rewards`, `gateway/program_crashes`, `gateway/program_memory_kills`,
`gateway/program_leftover_processes`) and the rollout goes on; calls past the budget, or of an episode that
ended, are refused with HTTP 400 (`gateway/refused_calls`). The pools' workers outlive a rollout (a warm
worker adds a few milliseconds to an episode, a cold one the time `import openai` takes: docs/PERFORMANCE.md)
and end with `close`.

The calls of all running programs reach one engine: handlers queue them (`BatchingEngine.generate`),
and the rollout's thread, which owns the engine, serves whatever is waiting in one engine call
(`BatchingEngine.serve`), as GRL's own agents are served without a turn barrier. Every call samples
with the rollout's temperature and top-p, whatever the request says, because the update scores the
tokens under the distribution they were drawn from. The episode's tokens are the engine's own
(grl/gateway/episodes.py); an edited history is a prefix break (`gateway/prefix_breaks`).

The pieces, one concern each: the program's contract (`ProgramTask`, `load_program`, `reward_of`:
grl/gateway/contract.py), the shared engine (`BatchingEngine`: batching.py), the HTTP server on a thread
(`LocalServer`: serving.py), the worker processes (`ProgramPool`: program_pool.py), the episodes and counts
a rollout returns (`EpisodeRecorder`: recording.py); this module's `ProgramRunner` plays a rollout's program
tasks with them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import replace

from grl.engines.base import SamplingParams
from grl.gateway.batching import BatchingEngine
from grl.gateway.contract import MODEL_NAME, ProgramTask, final_messages
from grl.gateway.episodes import EpisodeLog
from grl.gateway.program_pool import ProgramPool, fault_metrics, timeout_blamed
from grl.gateway.program_worker import ProgramCall
from grl.gateway.recording import EpisodeRecorder, ProgramEpisode, gateway_metrics
from grl.gateway.app import build_app
from grl.gateway.server import Gateway
from grl.gateway.serving import LocalServer
from grl.rollout.env_faults import check_failure_ratio
from grl.rollout.tasks import TaskSpec, is_program_task
from grl.rollout.types import Episode

# A program's client outwaits its clock (program_timeout): a call still queued when the clock runs out
# ends the episode as the program's timeout, not as an error the program raised.
CLIENT_GRACE_S = 30.0


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
        truncation: str = "left",
    ):
        self.engine = BatchingEngine(engine)
        self.gateway = Gateway(
            self.engine,
            tokenizer,
            MODEL_NAME,
            max_tokens=max_response_length,
            context=context,
            open_episodes=False,
            truncation=truncation,
        )
        self.max_response_length = max_response_length
        self.max_failed_agent_ratio = max_failed_agent_ratio
        self._server: LocalServer | None = None
        self._pools: dict[
            tuple, ProgramPool
        ] = {}  # by task and its limits: kept from one rollout to the next
        self.recorder = EpisodeRecorder(env_error_penalty)

    @classmethod
    def from_config(cls, rollout, data, engine, tokenizer) -> ProgramRunner:
        """From the typed `rollout` and `data` (the lengths) sections (grl.config.RunSections)."""
        return cls(
            engine,
            tokenizer,
            context=data.max_prompt_length + data.max_response_length,
            max_response_length=data.max_response_length,
            env_error_penalty=rollout.env_error_penalty,
            max_failed_agent_ratio=rollout.max_failed_agent_ratio,
            # a call cut on the right would lose its newest message, the one the reply answers: programs'
            # calls
            # are cut on the left unless the run refuses long prompts
            truncation="error" if rollout.truncation == "error" else "left",
        )

    @property
    def url(self) -> str:
        if self._server is None:
            self._server = LocalServer(build_app(self.gateway))
        return self._server.url

    def worker_pids(self) -> list[int]:
        """The worker processes its programs run in now (each leads its own process group)."""
        return [pid for pool in self._pools.values() for pid in pool.pids()]

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
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
        url, outcome = self.url, {}
        pools = {
            id(pool): pool for pool in (self._pool_of(r.spec.name, r.settings) for r in running)
        }.values()
        self.engine.serving(True)
        try:
            for key, r in enumerate(running):
                timeout = r.settings.program_timeout + CLIENT_GRACE_S
                call = ProgramCall(r.settings.program, f"{url}/episodes/{r.name}/v1", r.task, timeout)
                self._pool_of(r.spec.name, r.settings).submit(key, call, lambda r=r: final_messages(r.log))
            shown = 0.0
            while any(pool.pending for pool in pools):
                self.engine.serve(wait=0.05)
                for pool in pools:
                    for (
                        key,
                        ended,
                    ) in pool.collect():  # blamed now, by how long its calls waited for the model
                        log, now = running[key].log, time.monotonic()
                        outcome[key] = timeout_blamed(
                            ended, log.busy_s(now), log.idle_s(now), running[key].settings.program_timeout
                        )
                if on_turn is not None and time.monotonic() - shown > 1.0:
                    shown = time.monotonic()
                    on_turn(max(len(r.log.calls) for r in running), len(running) - len(outcome), len(running))
        finally:
            self.engine.serving(False)
            for pool in pools:
                pool.abandon()
            for r in running:
                self.gateway.close_episode(r.name)
        episodes = [self.recorder.episode(r, outcome[key]) for key, r in enumerate(running)]
        check_failure_ratio(
            [(e.task, e.seed, e.error) for e in episodes if e.error is not None],
            len(episodes),
            self.max_failed_agent_ratio,
            "programs",
        )
        return episodes, {
            **gateway_metrics(running, episodes),
            **fault_metrics([e.error_kind for e in episodes]),
        }

    def start_workers(self, tasks: list[TaskSpec]) -> None:
        """Starts the worker processes the program tasks among `tasks` will play on (without waiting for
        them), so that the first rollout does not wait for them to start."""
        for spec in filter(is_program_task, tasks):
            self._pool_of(spec.name, spec.config.agent_config).start(spec.num_groups * spec.group_size)

    def _pool_of(self, task: str, s) -> ProgramPool:
        limits = (task, s.program_workers, s.program_timeout, s.program_max_rss_mb)
        if limits not in self._pools:
            self._pools[limits] = ProgramPool(
                s.program_workers, s.program_timeout, s.program_max_rss_mb, s.program
            )
        return self._pools[limits]

    def _open(self, tasks, base_seed, first_group, sampling) -> list[ProgramEpisode]:
        running, group = [], first_group
        for spec in tasks:
            settings = spec.config.agent_config
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
                    task = ProgramTask(
                        spec.name, base_seed + group, group, attempt, dict(spec.config.env_config)
                    )
                    running.append(ProgramEpisode(name, spec, settings, task, episode_log))
                group += 1
        return running
