"""The engine the programs' calls share: HTTP handlers on many threads queue their calls, and the thread that
owns the engine (the rollout's) answers them, as GRL's own agents are served without a turn barrier.

Batching is continuous at the level of engine calls: each `serve` starts an engine call as soon as the
engine is free, with every call of one kind of sampling queued by then, so a call that arrives while a
generate is in flight is in the very next one, beside the calls of its kind that waited on another kind's
generate. `gather_s` > 0 is the fixed-wave policy the gateway had before (the engine waits that long after a
first call for others to join it), kept as the baseline bench/bench_gateway_batching.py measures against.
The engine's `generate` returns only when its whole batch is done (the hf engine decodes the batch to its
longest reply; GRL's vllm engine wraps `LLM.generate`), so a call never joins a generate already running.

`SerialEngine` (`grl serve`) batches the same way without an owner thread: the caller that finds the engine
free serves the waiting calls, its own among them in turn."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field, replace

from grl.engines.base import SamplingParams
from grl.gateway.requests import BadRequest

ENDED = "the rollout ended before this call was served"


@dataclass
class _Request:
    prompts: list[list[int]]
    sampling: SamplingParams
    constraints: list | None
    done: threading.Event = field(default_factory=threading.Event)
    outputs: list | None = None
    error: str | None = None

    @property
    def kind(self) -> str:
        """Calls of one kind share an engine call: the engine takes one `SamplingParams` per call, and seeds
        for all its requests or for none."""
        return repr((replace(self.sampling, seed=None, request_seeds=None), self.sampling.seed_of(0) is None))


@dataclass
class _Scoring:
    """A `prompt_log_probs` call: the waiting ones share one engine call, as a kind of their own."""

    prompts: list[list[int]]
    done: threading.Event = field(default_factory=threading.Event)
    outputs: list | None = None
    error: str | None = None
    kind = "prompt_log_probs"


def of_one_kind(waiting: list[_Request]) -> tuple[list[_Request], list[_Request]]:
    """(the longest-waiting call and the waiting calls of its kind, the others) of `waiting`, in arrival
    order."""
    kind = waiting[0].kind
    return [r for r in waiting if r.kind == kind], [r for r in waiting if r.kind != kind]


def answer(engine, group: list) -> None:
    """Answer `group` (calls of one kind) in one engine call: each call gets the outputs of its own prompts,
    sampled with its own seeds (or, `_Scoring` calls, their prompts' log-probs)."""
    prompts = [p for r in group for p in r.prompts]
    try:
        if isinstance(group[0], _Scoring):
            outputs = engine.prompt_log_probs(prompts)
        else:
            seeds = [r.sampling.seed_of(i) for r in group for i in range(len(r.prompts))]
            constraints = [c for r in group for c in (r.constraints or [None] * len(r.prompts))]
            sampling = replace(group[0].sampling, seed=None, request_seeds=seeds)
            outputs = engine.generate(
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


class BatchingEngine:
    """`generate` from any thread waits in a queue; `serve` (the engine owner's thread) answers the
    longest-waiting call together with every waiting call of its kind of sampling in one engine call.
    Outside `serving()`, calls are refused. `gather_s`: seconds to wait for more calls after the first of
    an engine call (0: none, continuous batching)."""

    def __init__(self, engine, gather_s: float = 0.0):
        if gather_s < 0:
            raise ValueError(f"gather_s: {gather_s} is negative")
        self.engine, self.gather_s = engine, gather_s
        self._queue: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._waiting: list[_Request] = []  # taken off the queue, in arrival order, not served yet
        self._serving = False

    def context_length(self) -> int | None:
        return self.engine.context_length()

    def generate(self, prompts, sampling, constraints=None):
        if not self._serving:
            raise BadRequest("no rollout is running: the episode this call belongs to is over")
        request = _Request(list(prompts), sampling, constraints)
        self._queue.put(request)
        while not request.done.wait(0.5):
            if not self._serving:  # queued just as the rollout ended: nobody will serve it
                request.error = ENDED
                break
        if request.error is not None:
            raise BadRequest(request.error)
        return request.outputs

    def serving(self, on: bool) -> None:
        self._serving = on
        if not on:  # calls that came too late are answered, not left hanging
            self._take(0.0)
            for request in self._waiting:
                request.error = ENDED
                request.done.set()
            self._waiting = []

    def serve(self, wait: float) -> int:
        """Answer the longest-waiting call and the waiting calls of its kind in one engine call (after
        waiting up to `wait` s for a first); -> how many calls were answered."""
        self._take(wait)
        if not self._waiting:
            return 0
        group, self._waiting = of_one_kind(self._waiting)
        answer(self.engine, group)
        return len(group)

    def _take(self, wait: float) -> None:
        """Move the queued calls to `_waiting`: those queued now, after waiting up to `wait` s for a first
        when
        none waits, and those that come within `gather_s` of the first."""
        try:
            if not self._waiting:
                self._waiting.append(self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait())
                deadline = time.monotonic() + self.gather_s
                while (left := deadline - time.monotonic()) > 0:
                    self._waiting.append(self._queue.get(timeout=left))
            while True:
                self._waiting.append(self._queue.get_nowait())
        except queue.Empty:
            pass


class SerialEngine:
    """An engine that runs one `generate` or `prompt_log_probs` at a time, whichever thread calls: the calls
    that wait meanwhile share the next one (a kind of sampling, or scoring, at a time, the longest-waiting
    first), served by a caller that finds the engine free."""

    def __init__(self, engine):
        self.engine = engine
        self._changed = threading.Condition()  # guards `_waiting` and `_busy`; notified when a call ends
        self._waiting: list[_Request] = []
        self._busy = False

    def context_length(self) -> int | None:
        return self.engine.context_length()

    def generate(self, prompts, sampling, constraints=None):
        return self._served(_Request(list(prompts), sampling, constraints))

    def prompt_log_probs(self, prompts):
        """Prompt log-probs, in turn with the generates (the engine runs one call at a time)."""
        return self._served(_Scoring(list(prompts)))

    def _served(self, request):
        with self._changed:
            self._waiting.append(request)
        while True:
            with self._changed:
                while self._busy and not request.done.is_set():
                    self._changed.wait()
                if request.done.is_set():
                    break
                group, self._waiting = of_one_kind(self._waiting)
                self._busy = True
            try:
                answer(self.engine, group)
            except Exception:
                if request in group:
                    raise
                # another caller's call failed (it is told so); this one is still to be served
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()
        if request.error is not None:
            raise BadRequest(request.error)
        return request.outputs
