"""Checkpoint folders: atomic writes, the `latest` marker, resume lookup, pruning.

Layout under `trainer.default_local_dir`:

    global_step_N/          actor/, critic/ (written by the workers), trainer_state.json
    latest                  one line naming the newest complete folder, e.g. `global_step_N`

A checkpoint is written into a hidden temporary folder and renamed into place
only when every part is on disk; `latest` is replaced atomically after the
rename. A crash at any moment leaves either the old or the new checkpoint,
never a half-written one that a resume would pick.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

LATEST = "latest"
STATE_FILE = "trainer_state.json"
PARTS = ("actor", "critic")  # the worker groups' folders
HF_EXPORT = "hf_actor"  # the actor as a Hugging Face folder, beside the step folders
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def step_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def step_of(path: str | os.PathLike) -> int | None:
    match = _STEP_DIR.match(Path(path).name)
    return int(match.group(1)) if match else None


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def replace_dir(tmp: Path, final: Path) -> None:
    """Put the finished folder `tmp` at `final`. An existing `final` is moved aside
    first and deleted last, so a crash leaves the old or the new folder there."""
    if final.exists():
        old = final.with_name(f".old_{final.name}_{os.getpid()}")
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)


def write_folder(target: Path, write: Callable[[str], None]) -> Path:
    """`write(path)` fills a folder beside `target`, which then replaces `target` (`replace_dir`)."""
    tmp = target.with_name(f".tmp_{target.name}_{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    write(str(tmp))
    replace_dir(tmp, target)
    return target


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The folder the `latest` marker names, if it is a complete checkpoint."""
    marker = Path(root) / LATEST
    try:
        name = marker.read_text().strip()
    except OSError:
        return None
    path = Path(root) / name
    return path if step_of(path) is not None and (path / STATE_FILE).is_file() else None


def resume_path(mode: str, root: str | os.PathLike) -> Path | None:
    """What to resume from: `disable` -> None, `auto` -> the latest checkpoint
    under root (None if there is none), anything else -> that folder. A checkpoint
    of the old full-state format raises one line before any worker reads it."""
    if mode == "disable":
        return None
    path = latest_checkpoint(root) if mode == "auto" else Path(mode)
    if path is None:
        return None
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"trainer.resume_mode: {mode!r} is not a checkpoint folder (no {STATE_FILE})")
    from grl.workers.sharded import refuse_old_format

    for part in PARTS:
        refuse_old_format(path / part)
    return path


def write_checkpoint(
    root: str | os.PathLike,
    step: int,
    write_parts: Callable[[Path], None],
    state: dict[str, Any],
    max_to_keep: int | None = None,
) -> Path:
    """Write `global_step_<step>` atomically and point `latest` at it.

    `write_parts(tmp_dir)` writes the model parts (the workers save actor/ and
    critic/ there); `state` is the trainer's own state (JSON). Older
    checkpoints beyond `max_to_keep` are deleted afterwards.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = root / f".tmp_{final.name}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write_parts(tmp)
    _atomic_write_text(tmp / STATE_FILE, json.dumps(state))
    replace_dir(tmp, final)
    _atomic_write_text(root / LATEST, final.name + "\n")
    prune(root, max_to_keep)
    return final


def prune(root: str | os.PathLike, max_to_keep: int | None) -> list[Path]:
    """Delete the oldest complete checkpoints beyond `max_to_keep` (never the
    latest one) and leftovers of interrupted writes. Returns what was deleted."""
    root = Path(root)
    removed = [p for p in root.iterdir() if p.name.startswith((".tmp_global_step_", ".old_global_step_"))]
    if max_to_keep is not None and max_to_keep > 0:
        latest = latest_checkpoint(root)
        steps = sorted((p for p in root.iterdir() if step_of(p) is not None and p.is_dir()), key=step_of)
        extra = len(steps) - max_to_keep
        removed += [p for p in steps[: max(extra, 0)] if p != latest]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def read_state(path: str | os.PathLike) -> dict[str, Any]:
    return json.loads((Path(path) / STATE_FILE).read_text())
