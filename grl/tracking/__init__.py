"""Experiment tracking: one `Tracker` fans metrics out to the configured backends.

`trainer.logger` lists the backends (console, jsonl, wandb, tensorboard). The
run folder (`trainer.run_dir`) receives `metrics.jsonl`, the resolved
`config.yaml` and `run_info.json` (git SHA, command line, start time).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grl.tracking.loggers import (
    ConsoleLogger,
    JsonlLogger,
    TensorBoardLogger,
    WandbLogger,
    clean,
    console_line,
    read_jsonl,
)

METRICS_FILE = "metrics.jsonl"
log = logging.getLogger("grl.tracking")
# A redraw takes a second or more of the driver's CPU: one after the first logged step (the curves exist
# as soon as there is a point), then one a minute at most, and one at the end.
REPLOT_S = 60.0
REPO_ROOT = Path(__file__).resolve().parents[2]


class Tracker:
    def __init__(
        self,
        loggers: list[str],
        run_dir: str | os.PathLike,
        project: str,
        experiment: str,
        config: dict | None = None,
        total_steps: int | None = None,
        resume_step: int | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Curves a minute into the run, then once a minute, and at close: a run shorter than that (every
        # test's) draws once, and matplotlib's ~2 s a figure is not paid for a one-point curve.
        self._plotted_at = time.monotonic()
        self._unplotted = False  # a step logged since the last drawing
        self.backends = []
        for name in loggers:
            if name == "console":
                self.backends.append(ConsoleLogger(total_steps))
            elif name == "jsonl":
                self.backends.append(JsonlLogger(self.run_dir / METRICS_FILE, resume_step))
            elif name == "wandb":
                self.backends.append(WandbLogger(project, experiment, config or {}, self.run_dir))
            elif name == "tensorboard":
                self.backends.append(TensorBoardLogger(self.run_dir))
            else:
                raise ValueError(
                    f"trainer.logger: unknown logger {name!r}; use console, jsonl, wandb, tensorboard"
                )

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        numbers = clean(metrics)
        for backend in self.backends:
            backend.log(numbers, step)
        self._unplotted = True
        if time.monotonic() - self._plotted_at >= REPLOT_S:
            self.plot()

    def plot(self) -> None:
        """Redraw `curves.png` from the JSONL file; a plotting problem never stops a run."""
        if not any(isinstance(b, JsonlLogger) for b in self.backends):
            return
        from grl.tracking.plot import plot_run

        try:
            plot_run(self.run_dir)
        except Exception as err:  # noqa: BLE001 - the curves are a convenience, the run is not
            log.warning("could not draw %s/curves.png: %s", self.run_dir, err)
        self._plotted_at, self._unplotted = time.monotonic(), False

    def close(self) -> None:
        if self._unplotted:
            self.plot()
        for backend in self.backends:
            backend.close()
        self.backends = []


def git_sha(repo: str | os.PathLike = REPO_ROOT) -> str | None:
    """The commit the code runs from (with `-dirty` if the tree has changes), or None outside git."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=repo, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None
    try:
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        dirty = False
    return sha + ("-dirty" if dirty else "")


def save_run_info(run_dir: str | os.PathLike, config_yaml: str) -> dict:
    """Write the resolved config and `run_info.json` (git SHA, command, host, time) into the run folder."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_yaml)
    info = {
        "git_sha": git_sha(),
        "command": " ".join(sys.argv),
        "host": socket.gethostname(),
        "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
    }
    (run_dir / "run_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


__all__ = ["METRICS_FILE", "Tracker", "clean", "console_line", "git_sha", "read_jsonl", "save_run_info"]
