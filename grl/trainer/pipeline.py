"""Where a training step's inputs come from, chosen once when the run starts: the step's episodes
(a `RolloutSource`: `SynchronousRollout`, or `RolloutAhead`) and PPO's old log-probs (an
`OldLogProbSource`: `EngineLogProbs`, `ScoredLogProbs`). `AgentTrainer.train_step` calls them the same
way in every mode.

Rollouts that run ahead of the update, at most `rollout.max_staleness` policy versions behind.

Policy version v is the actor after v training steps. With max_staleness k, the episodes of step t
are sampled by version max(first, t - 1 - k), where `first` is the version the run started from:
the update of step t sees episodes at most k versions older than the weights it trains. A thread
of its own generates step after step; before step t it waits until version t - 1 - k has been
published and loads it into the engine if the engine holds another. k = 0 is the synchronous
step (each rollout waits for the previous update). The versions are fixed by the step, not by
timing, so a run is as reproducible as a synchronous one.

The engine serves one user at a time: a rollout, or a validation (`latest_weights`), which waits for
the rollout in flight, loads the latest published version and leaves it; the next rollout loads its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from grl.rollout import Batch
from grl.rollout.clock import gen_times
from grl.run_plan import RunPlan
from grl.trainer.metrics import Timer, old_log_prob_metrics
from grl.trainer.transforms import staleness_metrics

if TYPE_CHECKING:
    from grl.schema import Actor

log = logging.getLogger("grl.trainer")


@dataclass
class Sampled:
    """A step's rollout as the update receives it."""

    result: Any  # the RolloutResult
    version: int  # the policy version that sampled it
    times: dict[str, float]  # timing_s/* of the rollout's phases
    metrics: dict[str, float] = field(default_factory=dict)


class RolloutSource(Protocol):
    """A step's episodes: `take(step)` before its update, `publish(step)` after it (updated or not)."""

    def take(self, step: int) -> Sampled: ...

    def publish(self, step: int) -> None: ...

    def latest_weights(self) -> AbstractContextManager[None]:
        """The engine alone, holding the latest published weights: what a validation plays with."""
        ...

    def close(self) -> None: ...


class OldLogProbSource(Protocol):
    def fill(self, batch: Batch, timer: Timer) -> dict[str, float]:
        """Write `old_log_probs` into the batch (timing a pass of its own under `timer`) -> metrics."""
        ...


class SynchronousRollout:
    """Each step samples with the weights it then trains (version step - 1). An engine that shares the
    device with the update (`free_cache_engine`) sleeps through it, without its weights on the steps
    whose update it gets afterwards (`updates_actor(step)`); `publish` syncs them."""

    def __init__(
        self,
        produce: Callable[[int], Any],
        engine,
        actor,
        free_cache_engine: bool,
        updates_actor: Callable[[int], bool],
    ):
        self._produce, self._engine, self._actor, self._free = produce, engine, actor, free_cache_engine
        self._updates_actor = updates_actor

    def take(self, step: int) -> Sampled:
        start = time.perf_counter()
        result = self._produce(step)
        parts = dict(result.times)
        if self._free:  # the engine's sleep is the engine's time, not the rollout's bookkeeping
            slept = time.perf_counter()
            self._engine.sleep(discard_weights=self._updates_actor(step))
            parts["gen_engine"] = parts.get("gen_engine", 0.0) + time.perf_counter() - slept
        for episode in result.episodes:
            episode.policy_version = step - 1
        return Sampled(result, step - 1, gen_times(time.perf_counter() - start, parts))

    def publish(self, step: int) -> None:
        if self._updates_actor(step):
            self._actor.sync_weights()

    def latest_weights(self) -> AbstractContextManager[None]:
        return nullcontext()  # the engine holds them: `publish` syncs every update

    def close(self) -> None:
        pass


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

    def __init__(
        self,
        produce: Callable[[int], Any],
        load: Callable[[Any, int], None],
        weights: Callable[[], Any],
        *,
        max_staleness: int,
        first_step: int,
        last_step: int,
        version: int,
    ):
        self._produce, self._load, self._current_weights = produce, load, weights
        self.max_staleness = max_staleness
        self._first_version = version
        self._engine_version = version  # the engine starts with the weights the run starts from
        self._latest = version  # the latest published version (a validation's)
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

    def take(self, step: int) -> Sampled:
        """The rollout of `step`, waiting for it if need be. A failure of the rollout thread is raised
        here, in the trainer's thread."""
        start = time.perf_counter()
        with self._changed:
            while step not in self._results and self._error is None:
                self._changed.wait(1.0)
            if step not in self._results:
                raise self._error
            ahead = self._results.pop(step)
        times = {
            "wait_prev_gen": time.perf_counter() - start,
            **gen_times(ahead.rollout_s, ahead.result.times),
            "rollout_wait_weights": ahead.waited_for_weights_s,
            "rollout_load_weights": ahead.load_s,
        }
        for episode in ahead.result.episodes:
            episode.policy_version = ahead.version
        return Sampled(ahead.result, ahead.version, times, staleness_metrics(ahead.result.episodes, step - 1))

    def publish(self, step: int) -> None:
        """The actor's weights after `step` steps, for the rollouts that need them: every step publishes
        its version, updated or not, since a rollout waits for it."""
        self._publish(step, self._current_weights())

    def _publish(self, version: int, handle) -> None:
        with self._changed:
            self._weights[version] = handle
            self._latest = version
            oldest_needed = min(self.version_for(self._next), self._engine_version)
            for old in [v for v in self._weights if v < oldest_needed and v != version]:
                del self._weights[old]
            self._changed.notify_all()

    @contextmanager
    def latest_weights(self) -> Iterator[None]:
        with self._engine:
            self._hold(self._latest)
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
                    while (
                        version not in self._weights and version != self._engine_version and not self._stopped
                    ):
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


class EngineLogProbs:
    """PPO's old log-probs are the engine's, of the tokens it sampled (`recompute_old_log_probs=false`):
    no pass recomputes them, so there is nothing to time."""

    def fill(self, batch: Batch, timer: Timer) -> dict[str, float]:
        batch["old_log_probs"] = batch["rollout_log_probs"].clone()
        return {}


class ScoredLogProbs:
    """PPO's old log-probs scored by the weights about to be trained, in a pass of their own when the
    update needs them beforehand (`RunPlan.old_log_prob_pass`); otherwise the update's first pass gives
    them."""

    def __init__(self, plan: RunPlan, section: Actor, actor):
        self._plan, self._section, self._actor = plan, section, actor

    def fill(self, batch: Batch, timer: Timer) -> dict[str, float]:
        if not self._plan.old_log_prob_pass(len(batch)):
            return {}
        with timer("old_log_prob"):
            batch["old_log_probs"], _ = self._actor.compute_log_probs(batch)
        return old_log_prob_metrics(batch, self._section.tis_imp_ratio_cap)


def old_log_probs_from(plan: RunPlan, section: Actor, actor) -> OldLogProbSource:
    """The source `section` (actor_rollout_ref.actor) names by `recompute_old_log_probs`; `actor`: the
    actor's worker group, which scores them."""
    return ScoredLogProbs(plan, section, actor) if section.recompute_old_log_probs else EngineLogProbs()
