"""Agent programs in processes of their own: a pool of workers (grl/gateway/program_worker.py) that plays
one episode per worker at a time, so that a program that calls `os._exit`, segfaults, outgrows its memory,
hangs or leaves a process behind ends only its episode and its worker, never the trainer.

A pool starts one template process (`python -m`, started by fork+exec: safe beside the trainer's threads, and
it imports neither the trainer's main module nor torch) that imports `openai` and the pool's program once;
each worker is forked from it (milliseconds, where a fresh interpreter would pay a second or more of imports
for each) into a session of its own, connected to the pool by a socket pair. The pool starts workers as
episodes wait for them, up to its size, and keeps them for the episodes and rollouts that follow; a worker
whose program failed in a way that may have left it broken is killed with its whole process group and every
process below it, and the next episode gets a fresh fork. A template that dies, or does not finish its
imports within START_GRACE_S, is replaced by one that leaves the program for each worker to import, so that
a program whose import crashes or hangs fails its episodes as it would in a fresh interpreter.
`collect()` never blocks: the rollout's thread calls it between engine calls.

The kinds of failure (`ProgramOutcome.kind`): exception, timeout (past `program_timeout`), crash (the
worker ended: `os._exit`, a signal), memory (the worker and its processes held more than
`program_max_rss_mb` while the program ran or when it returned; a forked worker's resident memory counts the
pages it still shares with its template, as psutil's RSS does), leftover_process (a process the program
started still ran when it returned); an exception's kind is the blame it carries (`policy` for a
PolicyFault, an InfraFault's own kind: grl/envs/base.py). Each is the infrastructure's doing
(grl/rollout/blame.py) but a PolicyFault and a `reply_timeout`: a timeout of an episode whose calls waited
for the model's answers for at least half of `program_timeout`, the last of them in flight or answered
within its last tenth (`timeout_blamed`; the gateway times the calls, grl/gateway/episodes.py), so that the
model's replies (their length, their number) kept the program busy to the end. A program that ran out of
time in its own code (a hang, slow work of its own) has the infrastructure's `timeout`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grl.gateway.program_processes import TemplateProcess, WorkerProcess
from grl.gateway.program_worker import ProgramCall, rss_bytes

# A worker counts its program's time from when it says it started; one that never says so (stuck in its
# own imports) is given this much longer before its episode times out, and a template that imports the
# program this long for its own.
START_GRACE_S = 60.0
MEMORY_CHECK_S = 0.25  # how often the memory of running programs is read (~80 us a worker)
FAULT_COUNTS = {
    "crash": "program_crashes",
    "memory": "program_memory_kills",
    "leftover_process": "program_leftover_processes",
}


@dataclass
class ProgramOutcome:
    """How a program's episode ended: `value` is (reward, metrics) or the ProgramValueError of a returned
    value that is no reward; `error` says what went wrong otherwise, `kind` its kind."""

    value: Any = None
    error: str | None = None
    kind: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def timed_out(self) -> bool:
        return self.kind == "timeout"


def fault_metrics(kinds: list[str | None]) -> dict[str, float]:
    """`gateway/program_crashes` etc.: the failures only a process can have, counted over a rollout."""
    return {f"gateway/{name}": float(sum(k == kind for k in kinds)) for kind, name in FAULT_COUNTS.items()}


def timeout_blamed(
    outcome: ProgramOutcome, busy_s: float, idle_s: float | None, timeout: float
) -> ProgramOutcome:
    """The outcome, a `timeout` made a `reply_timeout` (the policy's) when the model's replies kept the
    program
    busy to the end: its calls waited for their answers for `busy_s` of at least half of its `timeout`, and
    its last call was in flight or answered at most a tenth of the `timeout` before (`idle_s`, None: no
    call)."""
    if outcome.kind == "timeout" and busy_s >= timeout / 2 and idle_s is not None and idle_s <= timeout / 10:
        said = f"{outcome.error}; {busy_s:.1f} s of it waiting for the model's replies"
        return ProgramOutcome(outcome.value, said, "reply_timeout")
    return outcome


class ProgramPool:
    """`submit(key, call, messages)` an episode, `collect()` -> [(key, ProgramOutcome)] of those that ended;
    `messages()` gives a program's final messages when it returned a function of them. `program` is the
    "module:function" its template imports; without it, the first call's."""

    def __init__(
        self, size: int, timeout: float, max_rss_mb: float | None = None, program: str | None = None
    ):
        self.size = max(1, size)
        self.timeout = timeout
        self.max_rss = None if max_rss_mb is None else max_rss_mb * 2**20
        self.program = program
        self._waiting: deque = deque()  # (key, call, messages) not yet sent to a worker
        self._workers: list[WorkerProcess] = []
        self._template: TemplateProcess | None = None
        self._preload = True  # False once a template failed to import the program: workers import it then
        self._to_start = 0  # workers asked for by `start` that wait for the template
        self._memory_checked = 0.0

    def submit(self, key, call: ProgramCall, messages: Callable[[], list[dict]]) -> None:
        self.program = self.program or call.program
        self._waiting.append((key, call, messages))
        self._dispatch()

    @property
    def pending(self) -> int:
        return len(self._waiting) + sum(w.key is not None for w in self._workers)

    def pids(self) -> list[int]:
        """The workers' process ids (they lead their process groups), once those `start` asked for run."""
        self._start_asked(wait=True)
        return [w.pid for w in self._workers]

    def start(self, workers: int) -> None:
        """Starts workers, up to `workers` and the pool's size, without waiting for them."""
        self._to_start = max(self._to_start, min(workers, self.size) - len(self._workers))
        self._start_asked()

    def collect(self) -> list[tuple[Any, ProgramOutcome]]:
        self._start_asked()
        done = []
        check_memory = self.max_rss is not None and time.monotonic() - self._memory_checked > MEMORY_CHECK_S
        if check_memory:
            self._memory_checked = time.monotonic()
        for worker in list(self._workers):
            ended = self._check(worker, check_memory)
            if ended is not None:
                done.append(ended)
        self._dispatch()
        return done

    def abandon(self) -> None:
        """Drops the episodes not ended yet, killing the workers that play them (the rollout stopped)."""
        self._waiting.clear()
        for worker in [w for w in self._workers if w.key is not None]:
            self._retire(worker)

    def close(self) -> None:
        self._waiting.clear()
        for worker in list(self._workers):
            self._retire(worker)
        if self._template is not None:
            self._template.close()
            self._template = None

    # ------------------------------------------------------------ workers

    def _ready_template(self, wait: bool = False) -> TemplateProcess | None:
        """The template to fork from (started now if there is none), None while it imports."""
        template = self._template
        if template is not None:
            template.read()
            # Only the program's import can hang: a template without it imports `openai` alone and is waited
            # for however loaded the machine is (giving up on it would only start the same imports again).
            if not template.alive or (
                not template.ready
                and template.imports_program
                and time.monotonic() - template.launched > START_GRACE_S
            ):
                # It ended, or its imports hang; one that never got ready leaves the program to each worker.
                self._preload = self._preload and template.ready
                if not template.ready:
                    template.process.kill()
                    template.close()
                template = None
        if template is None:
            template = self._template = TemplateProcess(self.program if self._preload else None)
        if wait:
            template.wait_ready(START_GRACE_S)
        return template if template.ready else None

    def _fork(self, wait: bool = False) -> WorkerProcess | None:
        template = self._ready_template(wait)
        worker = None if template is None else template.fork()
        if worker is not None:
            self._workers.append(worker)
        return worker

    def _start_asked(self, wait: bool = False) -> None:
        while self._to_start > 0 and len(self._workers) < self.size and self._fork(wait) is not None:
            self._to_start -= 1

    def _dispatch(self) -> None:
        idle = [w for w in self._workers if w.key is None]
        while self._waiting:
            if not idle:
                if len(self._workers) >= self.size or (worker := self._fork()) is None:
                    return
                idle.append(worker)
            worker = idle.pop()
            key, call, messages = self._waiting.popleft()
            try:
                worker.conn.send(call)
            except OSError:  # it ended while idle (a thread its last program left behind, say)
                self._waiting.appendleft((key, call, messages))
                self._retire(worker)
                continue
            worker.key, worker.messages, worker.sent, worker.started = key, messages, time.monotonic(), 0.0

    def _retire(self, worker: WorkerProcess) -> None:
        worker.kill()
        self._workers.remove(worker)

    def _end(
        self, worker: WorkerProcess, outcome: ProgramOutcome, retire: bool
    ) -> tuple[Any, ProgramOutcome]:
        key = worker.key
        worker.key = worker.messages = None
        if retire:
            self._retire(worker)
        return key, outcome

    def _check(self, worker: WorkerProcess, check_memory: bool) -> tuple[Any, ProgramOutcome] | None:
        try:
            while worker.conn.poll(0):
                message = worker.conn.recv()
                if message[0] == "started":
                    worker.started = time.monotonic()
                elif message[0] == "messages":
                    worker.conn.send(worker.messages())
                elif message[0] == "bad_program":
                    raise ValueError(message[1])
                else:
                    return self._answer(worker, *message[1:])
        except (EOFError, OSError):
            pass  # the worker ended; its exit status says how
        worker.template.read()
        if (ended := worker.template.ended(worker.pid)) is not None:
            if worker.key is None:
                self._retire(worker)
                return None
            said = f"the program's process ended ({ended})"
            return self._end(worker, ProgramOutcome(error=said, kind="crash"), True)
        if worker.key is None:
            return None
        clock = worker.started or worker.sent + START_GRACE_S
        if time.monotonic() - clock > self.timeout:
            said = f"timed out after {self.timeout:g} s (program_timeout)"
            return self._end(worker, ProgramOutcome(error=said, kind="timeout"), True)
        if check_memory and (rss := rss_bytes(worker.tree())) > self.max_rss:
            return self._end(worker, self._over_memory(rss), True)
        return None

    def _answer(
        self, worker: WorkerProcess, value, error, rss: int, leftovers: list[int], kind: str = "exception"
    ) -> tuple[Any, ProgramOutcome]:
        if leftovers:
            said = (
                f"the program left {len(leftovers)} process(es) running (pids "
                f"{', '.join(map(str, leftovers[:8]))})"
            )
            return self._end(worker, ProgramOutcome(error=said, kind="leftover_process"), True)
        if self.max_rss is not None and rss > self.max_rss:
            return self._end(worker, self._over_memory(rss), True)
        if error is not None:
            return self._end(worker, ProgramOutcome(error=error, kind=kind or "exception"), False)
        return self._end(worker, ProgramOutcome(value=value), False)

    def _over_memory(self, rss: int) -> ProgramOutcome:
        said = (
            f"the program's processes held {rss / 2**20:.0f} MiB, more than program_max_rss_mb "
            f"{self.max_rss / 2**20:g}"
        )
        return ProgramOutcome(error=said, kind="memory")
