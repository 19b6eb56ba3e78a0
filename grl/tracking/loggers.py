"""Where metrics go: console, a JSONL file, Weights & Biases, TensorBoard.

Every backend takes `log(metrics, step)` and `close()`. Metrics are flat
`name -> float` dicts; names use `/` as the section separator
(`actor/pg_loss`, `train/simpleSokobanAgent/success`, `val-env/<task>/<metric>`).
W&B and TensorBoard are imported only when asked for.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Console columns: (label, metric name, format); a column is shown when its metric was logged.
CONSOLE_COLUMNS = (
    ("reward", "reward/mean", "{:+.3f}"),
    ("resp_len", "response_length/mean", "{:.0f}"),
    ("pg", "actor/pg_loss", "{:+.4f}"),
    ("vf", "critic/vf_loss", "{:.4f}"),
    ("ent", "actor/entropy", "{:.3f}"),
    ("kl", "actor/ppo_kl", "{:+.5f}"),
    ("gnorm", "actor/grad_norm", "{:.3f}"),
    ("tok/s", "perf/tokens_per_s", "{:.0f}"),
    ("step_s", "timing_s/step", "{:.1f}"),
)
# The rollout's time and where it went (grl/rollout/clock.py): "gen_s 11.2 (engine 8.0 env 1.1 other 2.1)".
GEN_SPLIT = tuple((part, f"timing_s/gen_{part}") for part in ("engine", "env", "programs", "other"))


def clean(metrics: Mapping[str, Any]) -> dict[str, float | None]:
    """Numbers only, as plain floats; NaN and infinities become None (strict JSON)."""
    out: dict[str, float | None] = {}
    for name, value in metrics.items():
        if hasattr(value, "item"):  # tensors and numpy scalars
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out[name] = float(value) if math.isfinite(value) else None
    return out


def console_line(metrics: Mapping[str, float | None], step: int, total_steps: int | None = None) -> str:
    """One readable line: the step, the headline metrics, then the success of each task."""
    head = f"step {step}" + (f"/{total_steps}" if total_steps else "")
    parts = [head]
    for label, name, fmt in CONSOLE_COLUMNS:
        value = metrics.get(name)
        if value is not None:
            parts.append(f"{label} {fmt.format(value)}")
    if metrics.get("timing_s/gen") is not None:
        split = [f"{label} {metrics[name]:.1f}" for label, name in GEN_SPLIT if metrics.get(name) is not None]
        parts.append(f"gen_s {metrics['timing_s/gen']:.1f}" + (f" ({' '.join(split)})" if split else ""))
    for name in sorted(metrics):  # success of every task, training then validation
        value = metrics[name]
        if name.startswith(("train/", "val-env/")) and name.endswith("/success") and value is not None:
            parts.append(f"{name.removesuffix('/success')} success {value:.2f}")
    return " | ".join(parts)


class ConsoleLogger:
    def __init__(self, total_steps: int | None = None, stream=None):
        self.total_steps = total_steps
        self.stream = stream or sys.stdout

    def log(self, metrics: Mapping[str, float | None], step: int) -> None:
        from tqdm import tqdm

        # Above the trainer's progress bars, which a plain print would write into.
        tqdm.write(console_line(metrics, step, self.total_steps), file=self.stream)
        self.stream.flush()

    def close(self) -> None:
        pass


class JsonlLogger:
    """One JSON object per line: `{"step": N, "<metric>": value, ...}`.

    A resumed run passes `resume_step`: lines of steps after it (logged by the
    interrupted run after its last checkpoint) are dropped, so the file holds
    one history without repeats.
    """

    def __init__(self, path: str | os.PathLike, resume_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            keep = [line for line in self.path.read_text().splitlines() if _line_step(line) <= resume_step]
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(line + "\n" for line in keep))
            os.replace(tmp, self.path)
        elif resume_step is None and self.path.exists():
            self.path.unlink()  # a fresh run starts a fresh history
        self.file = open(self.path, "a")  # noqa: SIM115 - held open for the whole run

    def log(self, metrics: Mapping[str, float | None], step: int) -> None:
        self.file.write(json.dumps({"step": step, **metrics}, allow_nan=False) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _line_step(line: str) -> float:
    """The step of a JSONL line; unreadable lines sort after every step (dropped on resume)."""
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return math.inf


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics file, skipping lines that are not JSON objects."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


class WandbLogger:
    """Online when WANDB_API_KEY is set (or WANDB_MODE says so), offline otherwise."""

    def __init__(self, project: str, experiment: str, config: dict, run_dir: str | os.PathLike):
        import wandb

        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self.run = wandb.init(
            project=project,
            name=experiment,
            config=config,
            dir=str(run_dir),
            mode=mode,
            resume="allow",
            id=_wandb_id(run_dir),
        )

    def log(self, metrics: Mapping[str, float | None], step: int) -> None:
        self.run.log({k: v for k, v in metrics.items() if v is not None}, step=step)

    def close(self) -> None:
        self.run.finish()


def _wandb_id(run_dir: str | os.PathLike) -> str:
    """A run id kept in the run folder, so a resumed run continues the same W&B run."""
    path = Path(run_dir) / "wandb_id.txt"
    if path.exists():
        return path.read_text().strip()
    import uuid

    run_id = uuid.uuid4().hex[:12]
    path.write_text(run_id + "\n")
    return run_id


class TensorBoardLogger:
    def __init__(self, run_dir: str | os.PathLike):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def log(self, metrics: Mapping[str, float | None], step: int) -> None:
        for name, value in metrics.items():
            if value is not None:
                self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
