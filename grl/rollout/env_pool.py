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


def run_calls(calls: list[Callable[[], Any]], workers: int, timeout: float | None) -> list[CallResult]:
    """Run every call with at most `workers` at a time; results in call order.

    `timeout` (seconds, None or <= 0 for none) counts from when a call starts.
    """
    n = len(calls)
    if n == 0:
        return []
    limit = timeout if timeout and timeout > 0 else None
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for i in range(n):
        todo.put(i)
    finished: queue.SimpleQueue = queue.SimpleQueue()
    started: dict[int, float] = {}
    lock = threading.Lock()

    def work() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            with lock:
                started[i] = time.monotonic()
            try:
                result = CallResult(value=calls[i]())
            except BaseException:  # noqa: BLE001 - an env may raise anything; the rollout decides what it means
                result = CallResult(error=traceback.format_exc())
            finished.put((i, result))

    def spawn() -> None:
        threading.Thread(target=work, name="grl-env", daemon=True).start()

    for _ in range(min(max(1, workers), n)):
        spawn()
    results: list[CallResult | None] = [None] * n
    remaining = n
    while remaining:
        wait = 0.1
        if limit is not None:
            with lock:
                running = [t for i, t in started.items() if results[i] is None]
            if running:  # wake up at the first deadline
                wait = min(wait, max(0.001, min(running) + limit - time.monotonic()))
        try:
            i, result = finished.get(timeout=wait)
            if results[i] is None:  # a late answer from an abandoned call is ignored
                results[i] = result
                remaining -= 1
        except queue.Empty:
            pass
        if limit is None:
            continue
        now = time.monotonic()
        with lock:
            overdue = [i for i, t in started.items() if results[i] is None and now - t > limit]
        for i in overdue:
            results[i] = CallResult(error=f"timed out after {limit:g} s (env_step_timeout)", timed_out=True)
            remaining -= 1
            spawn()  # replaces the thread stuck in call i
    return results  # type: ignore[return-value]
