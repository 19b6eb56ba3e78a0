"""A read-only SQLite sandbox for model-written queries: one connection, opened read-only, whose
authorizer allows only reading, and whose queries stop at a time limit and at a row and size cap.
grl/envs/bird.py runs its answers and gold queries in it (its module docstring lists the rules)."""

from __future__ import annotations

import sqlite3
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PROGRESS_OPCODES = 1000  # the deadline is checked every this many SQLite VM instructions
_MAX_VALUE_BYTES = 10_000_000

# Authorizer action codes a read-only query needs; everything else is denied.
_ALLOWED_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}
_DENIED_FUNCTIONS = {"load_extension"}


@dataclass(frozen=True)
class QueryResult:
    rows: list[tuple] | None  # None when the query did not complete
    error: str = ""
    timed_out: bool = False


def _authorize(action: int, arg1: Any, arg2: Any, db_name: Any, trigger: Any) -> int:
    if action not in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


class SqlSandbox:
    """A read-only SQLite connection that runs one query at a time under time, row and size limits."""

    def __init__(self, path: Path, timeout_s: float, max_rows: int, max_result_bytes: int):
        self.path = path
        self.timeout_s = timeout_s
        self.max_rows = max_rows
        self.max_result_bytes = max_result_bytes
        uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
        # isolation_level=None: Python never opens a transaction on its own
        self._conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA query_only = ON")
        # text that is not valid UTF-8 would otherwise fail the whole query, gold queries included
        self._conn.text_factory = lambda raw: raw.decode("utf-8", "replace")
        if hasattr(self._conn, "setlimit"):  # Python >= 3.11
            self._conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
            self._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)
        self._conn.set_authorizer(_authorize)
        self._conn.set_progress_handler(self._past_deadline, _PROGRESS_OPCODES)
        self._deadline = float("inf")
        self._lock = threading.Lock()

    def _past_deadline(self) -> int:
        return int(time.monotonic() > self._deadline)  # non-zero aborts the statement

    def run(self, sql: str) -> QueryResult:
        with self._lock:
            self._deadline = time.monotonic() + self.timeout_s
            try:
                return self._fetch(sql)
            except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError, MemoryError) as err:
                if time.monotonic() > self._deadline:
                    return QueryResult(
                        None, f"stopped after the time limit of {self.timeout_s:g} s", timed_out=True
                    )
                return QueryResult(None, f"{type(err).__name__}: {err}")
            finally:
                self._deadline = float("inf")

    def _fetch(self, sql: str) -> QueryResult:
        cursor = self._conn.execute(sql)
        rows, size = [], 0
        try:
            while batch := cursor.fetchmany(1000):
                for row in batch:
                    size += 16 * len(row) + sum(len(v) for v in row if isinstance(v, (str, bytes)))
                rows.extend(batch)
                if len(rows) > self.max_rows:
                    return QueryResult(None, f"the result has more than {self.max_rows} rows")
                if size > self.max_result_bytes:
                    return QueryResult(None, f"the result is larger than {self.max_result_bytes} bytes")
        finally:
            cursor.close()
        return QueryResult(rows)

    def schema(self) -> str:
        """The database's CREATE TABLE statements."""
        result = self.run(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL AND name NOT LIKE "
            "'sqlite_%' ORDER BY rowid"
        )
        if result.rows is None:
            raise RuntimeError(f"bird: cannot read the schema of {self.path}: {result.error}")
        return "\n\n".join(sql.strip() + ";" for (sql,) in result.rows)

    def close(self) -> None:
        self._conn.close()
