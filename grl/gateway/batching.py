"""The engine the programs' calls share: HTTP handlers on many threads queue their calls, and the thread that
owns the engine (the rollout's) answers whatever is waiting in one engine call, as GRL's own agents are
served without a turn barrier."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field, replace

from grl.engines.base import SamplingParams
from grl.gateway.server import BadRequest

GATHER_S = 0.01  # calls that arrive within this many seconds of the first share an engine call


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
