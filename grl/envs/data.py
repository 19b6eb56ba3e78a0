"""Question-answer datasets: local JSON lines, or the Hugging Face hub only when named.

`data_path` is
  - a JSONL file (one JSON object a line), `{split}` in it replaced by `split`;
  - a folder holding `<split>.jsonl`;
  - `hf:<dataset id>`: read with `datasets.load_dataset(id, hub_config, split=split)`; nothing else
    touches the hub.
A relative path is looked up in the working directory, then in the repository root (where
scripts/install_dataset.sh writes data/). A missing file fails at once with one line naming the path and
the install command. Records are cached per source and split for the life of the process, so a thousand
agents share one copy.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from grl.envs import EnvUnavailable
from grl.envs.base import resolve_data_path

HUB_PREFIX = "hf:"
T = TypeVar("T")

_CACHE: dict[tuple, list[Any]] = {}
_LOCK = threading.Lock()


def _read_jsonl(env: str, path: Path) -> list[tuple[dict, str]]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{env}: {path}:{number}: not JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{env}: {path}:{number}: not a JSON object")
            rows.append((row, f"{path}:{number}"))
    return rows


def _read_hub(env: str, hub_id: str, config: str | None, split: str) -> list[tuple[dict, str]]:
    where = f"hub dataset {hub_id!r} (config {config!r}, split {split!r})"
    try:
        import datasets
    except ImportError:
        raise EnvUnavailable(f"{env}: reading the {where} needs the `datasets` package") from None
    try:
        rows = datasets.load_dataset(hub_id, config, split=split)
    except Exception as err:  # the hub, the network and the cache fail in many ways; the user needs one line
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise EnvUnavailable(
            f"{env}: cannot load the {where} ({reason}); install the data locally "
            f"with scripts/install_dataset.sh and point data_path at it"
        ) from None
    return [(dict(row), f"{hub_id} row {i}") for i, row in enumerate(rows)]


def question_text(row: dict) -> str | None:
    """The question of a dataset row: `problem` (GRL's layout) or `question` (GSM8K's, AMC's, Minerva's)."""
    text = row.get("problem", row.get("question"))
    return text.strip() if isinstance(text, str) and text.strip() else None


def load_records(
    env: str,
    data_path: str,
    split: str,
    hub_config: str | None,
    install: str,
    record: Callable[[dict, str], T],
) -> list[T]:
    """The records of a dataset, each row converted by `record(row, where)`; cached."""
    if not isinstance(data_path, str) or not data_path:
        raise ValueError(f"{env}: data_path must be a file path or hf:<dataset id>, got {data_path!r}")
    if data_path.startswith(HUB_PREFIX):
        hub_id = data_path[len(HUB_PREFIX) :]
        key: tuple = ("hub", hub_id, hub_config, split, record)
        read = lambda: _read_hub(env, hub_id, hub_config, split)  # noqa: E731
    else:
        path = resolve_data_path(data_path.replace("{split}", split))
        if path.is_dir():
            path = path / f"{split}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(
                f"{env}: data file {path} not found (env_config.data_path={data_path!r}); "
                f"install it with `{install}`, or read a hub dataset with data_path=hf:<id>"
            )
        key = ("file", str(path.resolve()), path.stat().st_mtime_ns, record)
        read = lambda: _read_jsonl(env, path)  # noqa: E731
    with _LOCK:
        if key not in _CACHE:
            records = [record(row, where) for row, where in read()]
            if not records:
                raise ValueError(f"{env}: data_path {data_path!r} (split {split!r}) holds no records")
            _CACHE[key] = records
        return _CACHE[key]
