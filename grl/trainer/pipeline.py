"""Rollouts that run ahead of the update, at most `rollout.max_staleness` policy versions behind.

Policy version v is the actor after v training steps. With max_staleness k, the episodes of step t
are sampled by version max(first, t - 1 - k), where `first` is the version the run started from:
the update of step t sees episodes at most k versions older than the weights it trains. A thread
of its own generates step after step; before step t it waits until version t - 1 - k has been
published and loads it into the engine if the engine holds another. k = 0 is the synchronous
step (each rollout waits for the previous update). The versions are fixed by the step, not by
timing, so a run is as reproducible as a synchronous one.

The engine serves one user at a time: a rollout, or a validation (`engine_at`), which waits for
the rollout in flight, loads the version it asks for and leaves it; the next rollout loads its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("grl.trainer")


@dataclass
class AheadResult:
    result: Any  # the RolloutResult of the step
    version: int  # the policy version that sampled it
    waited_for_weights_s: float  # the rollout thread's wait for that version
    load_s: float  # loading it into the engine (0 when the engine held it)
    rollout_s: float  # the rollout itself


class RolloutAhead:
    """`produce(step)` -> the step's RolloutResult, run by a thread of its own; `load(handle,
    version)` puts published weights into the engine."""

    def __init__(self, produce: Callable[[int], Any], load: Callable[[Any, int], None], *, max_staleness: int,
                 first_step: int, last_step: int, version: int):
        self._produce, self._load, self.max_staleness = produce, load, max_staleness
        self._first_version = version
        self._engine_version = version  # the engine starts with the weights the run starts from
        self._weights: dict[int, Any] = {}  # version -> handle, for the versions rollouts may still need
        self._results: dict[int, AheadResult] = {}
        self._next, self._last = first_step, last_step
        self._error: BaseException | None = None
        self._stopped = False
        self._changed = threading.Condition()
        self._engine = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="grl-rollout-ahead", daemon=True)
        self._thread.start()

    def version_for(self, step: int) -> int:
        """The policy version that samples the episodes of training step `step`."""
        return max(self._first_version, step - 1 - self.max_staleness)

    # ------------------------------------------------------------ the trainer's side

    def take(self, step: int) -> tuple[AheadResult, float]:
        """The rollout of `step` (waiting for it if need be) and the seconds waited. A failure of the
        rollout thread is raised here, in the trainer's thread."""
        start = time.perf_counter()
        with self._changed:
            while step not in self._results and self._error is None:
                self._changed.wait(1.0)
            if step not in self._results:
                raise self._error
            ahead = self._results.pop(step)
        return ahead, time.perf_counter() - start

    def publish(self, version: int, handle) -> None:
        """The weights of `version` (after that many steps) for the rollouts that need them."""
        with self._changed:
            self._weights[version] = handle
            oldest_needed = min(self.version_for(self._next), self._engine_version)
            for old in [v for v in self._weights if v < oldest_needed and v != version]:
                del self._weights[old]
            self._changed.notify_all()

    @contextmanager
    def engine_at(self, version: int) -> Iterator[None]:
        """The engine alone, holding `version` (published, or the one it started with), for a validation."""
        with self._engine:
            self._hold(version)
            yield

    def close(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    # ------------------------------------------------------------ the rollout thread

    def _run(self) -> None:
        try:
            while self._next <= self._last:
                step, version = self._next, self.version_for(self._next)
                start = time.perf_counter()
                with self._changed:
                    while version not in self._weights and version != self._engine_version and not self._stopped:
                        self._changed.wait(1.0)
                    if self._stopped:
                        return
                waited = time.perf_counter() - start
                with self._engine:
                    start = time.perf_counter()
                    self._hold(version)
                    loaded = time.perf_counter() - start
                    result = self._produce(step)
                    rolled = time.perf_counter() - start - loaded
                with self._changed:
                    self._results[step] = AheadResult(result, version, waited, loaded, rolled)
                    self._next += 1
                    self._changed.notify_all()
        except BaseException as err:  # noqa: BLE001 - raised again in the trainer's thread by `take`
            with self._changed:
                self._error = err
                self._changed.notify_all()

    def _hold(self, version: int) -> None:
        """Load `version` into the engine unless it holds it (the caller holds the engine)."""
        if version == self._engine_version:
            return
        with self._changed:
            handle = self._weights[version]
        self._load(handle, version)
        self._engine_version = version
