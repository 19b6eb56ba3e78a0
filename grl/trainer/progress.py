"""The console's progress bars (console logger only): one over the whole run, with its ETA and the
numbers worth watching, and one under it over the current step's phases or a validation, which also
shows how many agents of the rollout are still playing.

Lines printed while the bars are up go above them (tqdm's `write`): the console logger's step lines
do so themselves, and grl's warnings do through a handler that stands in for Python's last-resort one
for the length of the run, where the program has configured no logging of its own."""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager

from grl.trainer.report import run_postfix


class _AboveTheBars(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        tqdm.write(self.format(record), file=sys.stderr)


class Progress:
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._run = None  # position 0: the whole run
        self._current = None  # position 1: the current step's phases, or a validation
        self._log_handler: logging.Handler | None = None

    def _bar(self, **kwargs):
        from tqdm import tqdm

        return tqdm(disable=not self.enabled, dynamic_ncols=True, **kwargs)

    def start_run(self, total_steps: int, done: int) -> None:
        self._run = self._bar(total=total_steps, initial=done, desc="run", unit="step", position=0)
        grl_log = logging.getLogger("grl")
        if self.enabled and not grl_log.handlers and not logging.getLogger().handlers:
            self._log_handler = _AboveTheBars(logging.WARNING)
            grl_log.addHandler(self._log_handler)

    def step_done(self, metrics: dict[str, float]) -> None:
        self._run.update(1)
        self._run.set_postfix_str(run_postfix(metrics), refresh=True)

    @contextmanager
    def step(self, step: int, phases: tuple[str, ...]):
        """Yields `phase(name)`, a context for each of the step's `phases` in turn."""
        bar = self._current = self._bar(total=len(phases), desc=f"step {step}", leave=False, position=1)

        @contextmanager
        def phase(name: str):
            bar.set_postfix_str(name, refresh=True)
            yield
            bar.update(1)

        try:
            yield phase
        finally:
            bar.close()

    @contextmanager
    def validation(self, step: int):
        self._current = self._bar(total=None, desc=f"validation (step {step})", position=1, leave=False)
        try:
            yield
        finally:
            self._current.close()

    def show_turn(self, turn: int, playing: int, total: int) -> None:
        """The rollout's `on_turn` callback."""
        self._current.set_postfix_str(
            f"rollout turn {turn + 1}: {playing}/{total} agents playing", refresh=True
        )

    def close(self) -> None:
        if self._run is not None:
            self._run.close()
            self._run = None
        if self._log_handler is not None:
            logging.getLogger("grl").removeHandler(self._log_handler)
            self._log_handler = None
