"""Run env calls concurrently, each under a time limit, on daemon threads.

A call that overruns its limit is reported as failed and abandoned: its thread
keeps running (Python cannot kill a thread) but a fresh thread takes its
place, so a hung env never starves the calls that follow, and because the
threads are daemons a hung env cannot keep the process from exiting either.
`concurrent.futures.ThreadPoolExecutor` gives neither guarantee.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class CallResult:
    value: Any = None
    error: str | None = None  # traceback text, or why the call was abandoned
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


class CallPool:
    """Calls submitted one at a time, each under the time limit, whose results are collected as they
    finish: what a rollout without a turn barrier needs (an agent moves on when its own call returns)."""

    def __init__(self, workers: int, timeout: float | None, limit_key: str = "env_step_timeout"):
        self.limit = timeout if timeout and timeout > 0 else None
        self._limit_key = limit_key  # the config key an overrun names
        self._workers = max(1, workers)
        self._todo: queue.SimpleQueue = queue.SimpleQueue()
        self._finished: queue.SimpleQueue = queue.SimpleQueue()
        self._started: dict = {}  # key -> start time, for the calls running now
        self._open: set = set()  # keys submitted and not yet collected
        self._lock = threading.Lock()
        self._threads = 0

    def submit(self, key, call: Callable[[], Any]) -> None:
        self._open.add(key)
        self._todo.put((key, call))
        if self._threads < self._workers:
            self._spawn()

    def collect(self, wait: float = 0.1) -> list[tuple[Any, CallResult]]:
        """The calls that finished or overran their limit since the last collect; waits up to `wait`
        seconds (less when a deadline comes first) for the first of them."""
        if self.limit is not None:
            with self._lock:
                running = [t for k, t in self._started.items() if k in self._open]
            if running:
                wait = min(wait, max(0.001, min(running) + self.limit - time.monotonic()))
        done = []
        try:
            done.append(self._finished.get(timeout=wait))
            while True:
                done.append(self._finished.get_nowait())
        except queue.Empty:
            pass
        results = [(key, result) for key, result in done if key in self._open]  # a late answer is ignored
        for key, _ in results:
            self._open.discard(key)
        if self.limit is not None:
            now = time.monotonic()
            with self._lock:
                overdue = [k for k, t in self._started.items() if k in self._open and now - t > self.limit]
            for key in overdue:
                self._open.discard(key)
                results.append(
                    (
                        key,
                        CallResult(
                            error=f"timed out after {self.limit:g} s ({self._limit_key})", timed_out=True
                        ),
                    )
                )
                self._spawn()  # replaces the thread stuck in that call
        return results

    @property
    def pending(self) -> int:
        return len(self._open)

    def close(self) -> None:
        """Idle threads end; a thread stuck in a call ends when (if) the call returns."""
        for _ in range(self._threads):
            self._todo.put(None)
        self._threads = 0

    def _spawn(self) -> None:
        self._threads += 1
        threading.Thread(target=self._work, name="grl-env", daemon=True).start()

    def _work(self) -> None:
        while (item := self._todo.get()) is not None:
            key, call = item
            with self._lock:
                self._started[key] = time.monotonic()
            try:
                result = CallResult(value=call())
            except BaseException:  # noqa: BLE001 - an env may raise anything; the rollout decides what it means
                result = CallResult(error=traceback.format_exc())
            with self._lock:
                self._started.pop(key, None)
            self._finished.put((key, result))


def run_calls(calls: list[Callable[[], Any]], workers: int, timeout: float | None) -> list[CallResult]:
    """Run every call with at most `workers` at a time; results in call order.

    `timeout` (seconds, None or <= 0 for none) counts from when a call starts.
    """
    pool = CallPool(min(workers, len(calls)), timeout)
    for i, call in enumerate(calls):
        pool.submit(i, call)
    results: list[CallResult | None] = [None] * len(calls)
    while pool.pending:
        for i, result in pool.collect():
            results[i] = result
    pool.close()
    return results  # type: ignore[return-value]
