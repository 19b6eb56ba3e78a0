"""BIRD text-to-SQL (`bird`): answer a question about a SQLite database with one SQL query.

BIRD (Li et al., 2023, "Can LLM Already Serve as a Database Interface? A BIg Bench for
Large-Scale Database Grounded Text-to-SQLs"); any dataset in its layout works (Spider too).

Data (`env_config`)
    dataset_path    questions: JSON lines (or a JSON array, as BIRD ships `train.json`) with
                    `question`, `SQL` (the gold query), `db_id`, and optional `evidence` and
                    `schema`; or, when no such file exists and the path does not end in .json/.jsonl,
                    a Hugging Face hub dataset loaded with `datasets.load_dataset(dataset_path, split=split)`.
                    Default `data/bird/{split}.jsonl` (`scripts/install_dataset.sh --bird`).
    db_root         databases at `{db_root}/{db_id}/{db_id}.sqlite`. Default `data/bird/{split}_databases`.
    split           replaces `{split}` in both paths (and is the hub split); default `train`.
    A relative path is looked up in the working directory, then in the repository root. A missing
    dataset file or db_root fails the constructor, a missing database fails `reset`, each with a
    one-line error naming the path; nothing waits for files to appear.

Episode
    `reset(seed)` picks question `order[seed % n]`, where `order` is a fixed shuffle of the dataset
    (so seeds 0..n-1 visit every question once) and shows the schema (the record's `schema`, else
    the database's CREATE statements), the question and the evidence. `env.question` is the record.
    Each `step(answer)` is one try: the SQL is the content of the first ```sql fenced block of the
    answer (case-insensitive tag). The episode ends on a match or after `max_tries` tries
    (1: single turn; e.g. 5: the model gets the error or mismatch note and tries again).

Reward
    Execution match: the multiset of result rows of the submitted query equals the gold query's
    (order ignored, duplicates counted). A match on try k earns 0.5 ** (k - 1); a mismatch, an SQL
    error or a timeout earns 0; an answer without a ```sql block earns `no_fence_penalty`
    (default -0.5) and still counts as a try. `success` is a match.
    `action_is_valid`: a fenced query was found; `action_is_effective`: it ran without error.
    Extras in info: `tries`, `timed_out`.

Sandbox (one connection per env, opened read-only)
    URI `mode=ro` and `PRAGMA query_only`; an authorizer that allows only reading (SELECT, reads,
    functions other than load_extension, recursive CTEs) and so denies ATTACH, VACUUM INTO, PRAGMA,
    transactions and every write; extension loading stays off; one statement per query. A progress
    handler stops a query after `step_timeout_seconds` (default 30); at most `max_rows` rows
    (default 100,000) and `max_result_bytes` of text and blobs are fetched, and a single value is
    capped at 10 MB (Python >= 3.11), so no query can hold the host for long or fill its memory.
    The gold query runs in the same sandbox (grl/envs/sql_sandbox.py).
"""

from __future__ import annotations

import json
import random
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from grl.envs.base import Env, resolve_data_path, step_info
from grl.envs.sql_sandbox import QueryResult, SqlSandbox

_FENCE = re.compile(r"```sql\b(.*?)```", re.IGNORECASE | re.DOTALL)


def extract_sql(answer: str) -> str | None:
    """The content of the first ```sql block, stripped; None if there is none (never raises)."""
    match = _FENCE.search(answer) if isinstance(answer, str) else None
    return match.group(1).strip() if match else None


# ---------------------------------------------------------------- dataset


_REQUIRED = ("question", "SQL", "db_id")
_DATASETS: dict[tuple, tuple[list[dict], list[int]]] = {}
_SCHEMAS: dict[str, str] = {}
_CACHE_LOCK = threading.Lock()


def _read_file(path: Path) -> list[Any]:
    with path.open(encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        return json.loads(text)
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"bird: dataset_path {path} line {number} is not JSON: {err}") from None
    return rows


def _read_hub(name: str, split: str) -> list[Any]:
    try:
        import datasets
    except ImportError:
        raise FileNotFoundError(
            f"bird: dataset_path {name!r} is not a file and `datasets` is not installed"
        ) from None
    try:
        return list(datasets.load_dataset(name, split=split))
    except Exception as err:  # noqa: BLE001 - the hub client raises many types; the user needs one line
        raise FileNotFoundError(
            f"bird: dataset_path {name!r} is neither a file nor a loadable hub dataset: {err}"
        ) from None


def load_questions(dataset_path: str, split: str) -> tuple[list[dict], list[int]]:
    """The dataset's records and the fixed question order seeds walk through (cached per process)."""
    path = resolve_data_path(dataset_path)
    is_file_path = path.suffix in (".json", ".jsonl") or path.is_file()
    key = (str(path.resolve()), path.stat().st_mtime_ns if path.is_file() else None, split)
    with _CACHE_LOCK:
        if key in _DATASETS:
            return _DATASETS[key]
        if is_file_path and not path.is_file():
            raise FileNotFoundError(
                f"bird: dataset_path {str(path)!r} not found (run scripts/install_dataset.sh --bird)"
            )
        rows = _read_file(path) if is_file_path else _read_hub(dataset_path, split)
        for i, row in enumerate(rows):
            missing = [k for k in _REQUIRED if not isinstance(row, dict) or not isinstance(row.get(k), str)]
            if missing:
                raise ValueError(f"bird: dataset_path {dataset_path} record {i} lacks {', '.join(missing)}")
        if not rows:
            raise ValueError(f"bird: dataset_path {dataset_path} holds no questions")
        order = list(range(len(rows)))
        random.Random(0).shuffle(order)
        _DATASETS[key] = (rows, order)
        return rows, order


# ---------------------------------------------------------------- env


class BirdEnv(Env):
    """One text-to-SQL question per episode, answered in one or more tries (see the module docstring)."""

    def __init__(
        self,
        dataset_path: str = "data/bird/{split}.jsonl",
        db_root: str = "data/bird/{split}_databases",
        split: str = "train",
        max_tries: int = 1,
        no_fence_penalty: float = -0.5,
        step_timeout_seconds: float = 30.0,
        max_rows: int = 100_000,
        max_result_bytes: int = 256_000_000,
        feedback_rows: int = 5,
    ):
        if max_tries < 1 or max_rows < 1 or step_timeout_seconds <= 0:
            raise ValueError("bird: max_tries, max_rows and step_timeout_seconds must be positive")
        self.split = split
        self.records, self._order = load_questions(dataset_path.replace("{split}", split), split)
        self.db_root = resolve_data_path(db_root.replace("{split}", split))
        if not self.db_root.is_dir():
            raise FileNotFoundError(
                f"bird: db_root {str(self.db_root)!r} is not a directory (run scripts/install_dataset.sh "
                "--bird)"
            )
        self.max_tries = max_tries
        self.no_fence_penalty = no_fence_penalty
        self.step_timeout_seconds = step_timeout_seconds
        self.max_rows = max_rows
        self.max_result_bytes = max_result_bytes
        self.feedback_rows = feedback_rows
        self.question: dict[str, Any] = {}
        self._sandbox: SqlSandbox | None = None
        self._gold: Counter | None = None
        self._gold_error = ""
        self.tries = 0
        self.done = True

    # ------------------------------------------------------------------ contract

    def reset(self, seed: int) -> str:
        self.question = self.records[self._order[seed % len(self.records)]]
        self._open(self.question["db_id"])
        self._gold, self._gold_error = None, ""
        self.tries, self.done = 0, False
        return self.render()

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self._sandbox is None:
            raise RuntimeError("bird: call reset(seed) before step()")
        if self.done:
            return (
                "The episode is over.",
                0.0,
                True,
                step_info(False, False, False, tries=self.tries, timed_out=False),
            )
        self.tries += 1
        sql = extract_sql(action)
        if sql is None:
            self.done = self.tries >= self.max_tries
            note = "Your answer has no ```sql fenced block, so nothing was run."
            return (
                self._feedback(note),
                self.no_fence_penalty,
                self.done,
                step_info(False, False, False, tries=self.tries, timed_out=False),
            )
        result = self._sandbox.run(sql) if sql else QueryResult(None, "the ```sql block is empty")
        matched = (
            result.rows is not None and self._gold_rows() is not None and Counter(result.rows) == self._gold
        )
        self.done = matched or self.tries >= self.max_tries
        reward = 0.5 ** (self.tries - 1) if matched else 0.0
        if matched:
            note = "Your query's result matches the expected result."
        elif result.rows is None:
            note = f"Your query failed: {result.error.rstrip('.')}."
        else:
            note = (
                "Your query ran but its result does not match the expected result. "
                f"{self._preview(result.rows)}"
            )
        info = step_info(matched, True, result.rows is not None, tries=self.tries, timed_out=result.timed_out)
        if self._gold_error:
            info["gold_error"] = self._gold_error
        return self._feedback(note, matched), reward, self.done, info

    def render(self) -> str:
        q = self.question
        lines = ["Database schema (SQLite):", self._schema(), "", f"Question: {q['question'].strip()}"]
        if str(q.get("evidence") or "").strip():
            lines.append(f"Evidence: {q['evidence'].strip()}")
        return "\n".join(lines)

    def action_help(self) -> str:
        return "Answer with one SQLite query in a fenced block: ```sql\nSELECT ...\n```"

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None

    # ------------------------------------------------------------------ helpers

    def _open(self, db_id: str) -> None:
        path = self.db_root / db_id / f"{db_id}.sqlite"
        if self._sandbox is not None and self._sandbox.path == path:
            return
        if not path.is_file():
            raise FileNotFoundError(
                f"bird: database {str(path)!r} for db_id {db_id!r} not found (db_root={str(self.db_root)!r})"
            )
        self.close()
        self._sandbox = SqlSandbox(path, self.step_timeout_seconds, self.max_rows, self.max_result_bytes)

    def _schema(self) -> str:
        if isinstance(self.question.get("schema"), str) and self.question["schema"].strip():
            return self.question["schema"].strip()
        key = str(self._sandbox.path.resolve())
        with _CACHE_LOCK:
            if key not in _SCHEMAS:
                _SCHEMAS[key] = self._sandbox.schema()
            return _SCHEMAS[key]

    def _gold_rows(self) -> Counter | None:
        """The gold query's result multiset, computed once per episode (None if the gold query fails)."""
        if self._gold is None and not self._gold_error:
            gold = self._sandbox.run(self.question["SQL"])
            if gold.rows is None:
                self._gold_error = gold.error
            else:
                self._gold = Counter(gold.rows)
        return self._gold

    def _preview(self, rows: list[tuple]) -> str:
        shown = ", ".join(repr(r) for r in rows[: self.feedback_rows])
        if not rows:
            return "It returned no rows."
        more = " ..." if len(rows) > self.feedback_rows else ""
        return f"It returned {len(rows)} row{'s' if len(rows) != 1 else ''}: {shown}{more}"

    def _feedback(self, note: str, matched: bool = False) -> str:
        if matched or not self.done:
            left = self.max_tries - self.tries
            return note if matched else f"{note} Try again ({left} {'try' if left == 1 else 'tries'} left)."
        return f"{note} No tries left."
