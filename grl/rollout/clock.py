"""Where a rollout's wall time goes (SkyRL's trajectory_time_{llm,env,other}, verifiers' model/harness).

`timing_s/gen` is one number; a user whose env is slow (a search, an SQL database, a program) needs to see
that it is the env and not the model. The rollout adds up the wall time it spends waiting on each part:
- `gen_engine`: the engine's generate calls (prefill and decode, and the transfer to an engine process), and
  its sleep after the rollout where it frees the device (`free_cache_engine`, counted by the trainer);
- `gen_env`: the env calls it waits on (resets, steps with their tools, closes); without the turn barrier
  the time it waits for an env step to come back while no engine call runs;
- `gen_programs`: the agent programs' episodes (their model calls included: the gateway serves them);
- `gen_other`: the rest (tokenising, grammars, bookkeeping): `gen` minus the three, set by `gen_times`.
With several tasks, `gen_env/<task>` is each task's env calls' own seconds, summed over the calls that ran
side by side, so they can add up to more than `gen_env`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

PARTS = ("gen_engine", "gen_env", "gen_programs")


class RolloutClock:
    def __init__(self) -> None:
        self.waited = dict.fromkeys(PARTS, 0.0)
        self.env_by_task: dict[str, float] = {}
        self._lock = threading.Lock()

    @contextmanager
    def waiting(self, part: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.waited[part] += time.perf_counter() - start

    def env_call(self, task: str, call: Callable[[], Any]) -> Callable[[], Any]:
        """`call`, timed as one of `task`'s env calls (it runs on a pool thread)."""

        def timed():
            start = time.perf_counter()
            try:
                return call()
            finally:
                with self._lock:
                    self.env_by_task[task] = self.env_by_task.get(task, 0.0) + time.perf_counter() - start

        return timed

    def times(self) -> dict[str, float]:
        out = {
            part: seconds for part, seconds in self.waited.items() if part != "gen_programs" or seconds > 0
        }
        if len(self.env_by_task) > 1:
            out.update({f"gen_env/{task}": seconds for task, seconds in sorted(self.env_by_task.items())})
        return out


def add_times(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {key: a.get(key, 0.0) + b.get(key, 0.0) for key in {**a, **b}}


def gen_times(gen_s: float, parts: dict[str, float]) -> dict[str, float]:
    """`timing_s/*` of a rollout that took `gen_s`: its parts and `gen_other`, what is left of `gen_s`."""
    other = gen_s - sum(parts.get(part, 0.0) for part in PARTS)
    return {"gen": gen_s, **parts, "gen_other": max(0.0, other)}
