"""SQLiteDatabase: read-only queries against an existing SQLite file.

Every call opens a fresh ``mode=ro`` connection on a worker thread and closes it afterwards.
Before any model SQL runs, the connection is locked down with SQLite's own APIs: extension
loading disabled, ``query_only``, no attached databases, a length limit on strings and blobs
(a memory guard), the read-only table-valued functions declared, an authorizer that admits only
reads, and a progress handler that stops the statement at its deadline or when the caller is
canceled (``connection.interrupt()``). A value larger than ``max_result_bytes`` fails when it
would leave SQLite for the result.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_PROGRESS_STEPS = 1000

# The authorizer admits only what a read needs; everything else (writes, schema changes,
# ATTACH/DETACH, PRAGMA, transactions, savepoints, ANALYZE, REINDEX, virtual tables) is denied.
_READ_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_DENIED_FUNCTIONS = {"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"}
_SCHEMA_PRAGMAS = frozenset({"table_xinfo"})
_SCHEMA_TABLES = {"sqlite_master", "sqlite_temp_master", "sqlite_schema", "sqlite_temp_schema"}
# Read-only built-in eponymous virtual tables. On a connection's first use of one, SQLite parses
# its declaration as a CREATE TABLE and asks the authorizer about that parse's UPDATE of
# sqlite_master, which is never run. They are declared before the authorizer is installed, as
# SQLite itself declares those a view uses (with the authorizer off). Others stay rejected.
_TABLE_FUNCTIONS = ("json_each", "json_tree")
_MIN_LENGTH_LIMIT, _MAX_LENGTH_LIMIT = 16 * 2**20, 1_000_000_000  # SQLite's default hard maximum
_ACTION_NAMES = {
    getattr(sqlite3, f"SQLITE_{name}"): name.replace("_", " ")
    for name in (
        "CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE", "CREATE_TEMP_TRIGGER",
        "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "DELETE", "DROP_INDEX", "DROP_TABLE",
        "DROP_TEMP_INDEX", "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER", "DROP_TEMP_VIEW", "DROP_TRIGGER",
        "DROP_VIEW", "INSERT", "PRAGMA", "TRANSACTION", "UPDATE", "ATTACH", "DETACH", "ALTER_TABLE",
        "REINDEX", "ANALYZE", "CREATE_VTABLE", "DROP_VTABLE", "SAVEPOINT",
    )
}

# Primary result codes (https://sqlite.org/rescode.html) that mean the query itself is at fault.
_QUERY_FAULTS = {1, 20, 25}  # SQLITE_ERROR, SQLITE_MISMATCH, SQLITE_RANGE
_SQLITE_READONLY, _SQLITE_INTERRUPT, _SQLITE_TOOBIG, _SQLITE_AUTH = 8, 9, 18, 23
_HEADER = b"SQLite format 3\x00"


class SQLiteDatabase:
    """A DatabaseBackend over an existing SQLite database file, opened read-only per call.

    The file must exist; it is never created, and in-memory databases are unsupported.
    ``timeout_seconds`` is each statement's progress deadline (and the busy timeout);
    ``max_result_bytes`` bounds a result's JSON and every single value transferred, while values
    inside the SQL may be larger (to filter or measure them); ``max_tables`` bounds the schema
    listing. SQLite's length limit, max(16 MiB, 8 x ``max_result_bytes``) up to 1e9 bytes, is
    only a memory guard: it leaves room for hex(), quote() or JSON escaping of any transferable
    value, and beyond it SQLite fails the query (printf() yields NULL). Writes, ATTACH, PRAGMA,
    explicit transactions and extension loading are rejected with ValueError.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        timeout_seconds: float = 5,
        max_result_bytes: int = 1_048_576,
        max_tables: int = 100,
    ) -> None:
        text = os.fspath(path)
        if not isinstance(text, str) or text.strip() in ("", ":memory:") or text.startswith("file:"):
            raise ValueError("SQLiteDatabase needs the path of an existing database file; "
                             "in-memory databases and URIs are unsupported")
        if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, (int, float)) \
                or not 0 < timeout_seconds < math.inf:
            raise ValueError(f"timeout_seconds must be a positive number, not {timeout_seconds!r}")
        for name, value in (("max_result_bytes", max_result_bytes), ("max_tables", max_tables)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        resolved = Path(text).resolve()
        if not resolved.exists():
            raise FileNotFoundError(f"SQLite database {text} does not exist (it is never created)")
        if not resolved.is_file():
            raise ValueError(f"SQLite database {text} is not a regular file")
        with resolved.open("rb") as file:
            header = file.read(len(_HEADER))
        if header and header != _HEADER:
            raise ValueError(f"{text} is not a SQLite database")
        self.path = str(resolved)
        self.timeout_seconds = float(timeout_seconds)
        self.max_result_bytes = max_result_bytes
        self.max_tables = max_tables
        self.length_limit = min(max(_MIN_LENGTH_LIMIT, 8 * max_result_bytes), _MAX_LENGTH_LIMIT)
        self._uri = f"file:{urllib.parse.quote(self.path)}?mode=ro"

    def describe_target(self) -> dict[str, Any]:
        return {"service": "sqlite", "path": self.path}

    async def describe_schema(self) -> dict[str, Any]:
        """``{"tables": [{"name", "type", "columns": [...]}, ...], "truncated"}``, tables and
        views in name order, at most ``max_tables`` and ``max_result_bytes`` of JSON."""
        return await self._run(self._schema, _SCHEMA_PRAGMAS)

    async def query(
        self, *, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None, max_rows: int
    ) -> dict[str, Any]:
        """``{"columns": [...], "rows": [[...], ...], "truncated"}`` for one read-only statement.

        Column names keep duplicates; rows are positional. Blobs become ``{"base64": ...}`` and
        infinite floats ``{"float": "Infinity"}``. Output stops before ``max_rows`` rows or
        ``max_result_bytes`` of JSON would be exceeded (``truncated``).
        """
        bound = () if parameters is None else parameters
        return await self._run(lambda connection: self._rows(connection, sql, bound, max_rows), frozenset())

    async def _run(self, work: Callable[[sqlite3.Connection], T], pragmas: frozenset[str]) -> T:
        guard = _Guard(time.monotonic() + self.timeout_seconds, pragmas)
        worker = asyncio.ensure_future(asyncio.to_thread(self._work, guard, work))
        try:
            return await asyncio.shield(worker)
        except asyncio.CancelledError:
            guard.cancel()
            await asyncio.wait({worker})
            if not worker.cancelled():
                worker.exception()  # retrieved: the caller was canceled, the outcome is moot
            raise

    def _work(self, guard: _Guard, work: Callable[[sqlite3.Connection], T]) -> T:
        try:
            connection = sqlite3.connect(self._uri, uri=True, timeout=self.timeout_seconds,
                                         isolation_level=None, check_same_thread=False)
        except sqlite3.Error as error:
            raise RuntimeError(f"cannot open SQLite database {self.path}: {error}") from None
        try:
            self._lock_down(connection, guard)
            return work(connection)
        except (sqlite3.Error, OverflowError) as error:
            raise guard.translate(error, self) from None
        finally:
            guard.close(connection)

    def _lock_down(self, connection: sqlite3.Connection, guard: _Guard) -> None:
        if hasattr(connection, "enable_load_extension"):  # absent when SQLite was built without it
            connection.enable_load_extension(False)
        connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.length_limit)
        connection.text_factory = self._text
        connection.execute("PRAGMA query_only = ON")
        for name in _TABLE_FUNCTIONS:  # the call syntax cannot reach a table or view of that name
            connection.execute(f"SELECT 1 FROM {name}(NULL) WHERE 0")
        connection.set_authorizer(guard.authorize)
        connection.set_progress_handler(guard.progress, _PROGRESS_STEPS)
        guard.attach(connection)

    def _rows(self, connection: sqlite3.Connection, sql: str, parameters: Any, max_rows: int) -> dict[str, Any]:
        cursor = connection.execute(sql, parameters)
        try:
            columns = [description[0] for description in cursor.description or ()]
            empty = _json_size({"columns": columns, "rows": [], "truncated": False})
            rows, truncated = _within(([self._value(item) for item in row] for row in cursor),
                                      max_items=max_rows, max_bytes=self.max_result_bytes - empty)
        finally:
            cursor.close()
        return {"columns": columns, "rows": rows, "truncated": truncated}

    def _schema(self, connection: sqlite3.Connection) -> dict[str, Any]:
        listed = connection.execute(
            "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view') "
            "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name LIMIT ?",
            (self.max_tables + 1,),
        ).fetchall()
        entries = ({"name": name, "type": kind, **_columns(connection, name)} for name, kind in listed)
        tables, truncated = _within(entries, max_items=self.max_tables,
                                    max_bytes=self.max_result_bytes - _json_size({"tables": [], "truncated": True}))
        return {"tables": tables, "truncated": truncated}

    def _value(self, item: Any) -> Any:
        if isinstance(item, bytes):
            return {"base64": base64.b64encode(self._transferable(item)).decode("ascii")}
        if isinstance(item, float) and not math.isfinite(item):
            return {"float": "Infinity" if item > 0 else "-Infinity"}
        return item

    def _text(self, raw: bytes) -> str:
        return self._transferable(raw).decode("utf-8", "replace")

    def _transferable(self, raw: bytes) -> bytes:
        """A string's or blob's bytes as they leave SQLite, refused over ``max_result_bytes``."""
        if len(raw) > self.max_result_bytes:
            raise ValueError(f"a single value exceeds max_result_bytes ({self.max_result_bytes} bytes); "
                             "select less data")
        return raw


class _Guard:
    """One call's deadline, cancellation and authorizer, shared by the worker and the caller."""

    def __init__(self, deadline: float, pragmas: frozenset[str]) -> None:
        self.deadline = deadline
        self.pragmas = pragmas
        self.denied: list[str] = []
        self._canceled = threading.Event()
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None

    def attach(self, connection: sqlite3.Connection) -> None:
        with self._lock:
            self._connection = connection

    def close(self, connection: sqlite3.Connection) -> None:
        with self._lock:
            self._connection = None
            connection.close()

    def cancel(self) -> None:
        """Called from the event loop: stop the worker's statement now."""
        self._canceled.set()
        with self._lock:
            if self._connection is not None:
                self._connection.interrupt()

    def progress(self) -> int:
        return int(self._canceled.is_set() or time.monotonic() > self.deadline)

    def authorize(self, action: int, arg1: str | None, arg2: str | None, database: str | None,
                  trigger: str | None) -> int:
        if action == sqlite3.SQLITE_PRAGMA and arg1 in self.pragmas:
            return sqlite3.SQLITE_OK
        if action in _READ_ACTIONS and not (action == sqlite3.SQLITE_FUNCTION and arg2 in _DENIED_FUNCTIONS):
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_UPDATE and arg1 in _SCHEMA_TABLES:
            # Only the declaration of an eponymous virtual table asks this: SQLite refuses a real
            # UPDATE of the schema itself, and CREATE/DROP/ALTER are denied earlier.
            self.denied.append(f"a table-valued function other than {'/'.join(_TABLE_FUNCTIONS)} "
                               "(pragma_* functions are PRAGMA)")
        elif arg1 in _SCHEMA_TABLES:  # CREATE/DROP are first authorized as writes to the schema
            self.denied.append("schema change")
        else:
            what = "function" if action == sqlite3.SQLITE_FUNCTION else _ACTION_NAMES.get(action, f"action {action}")
            self.denied.append(" ".join(part for part in (what, arg1, arg2) if part))
        return sqlite3.SQLITE_DENY

    def translate(self, error: Exception, database: SQLiteDatabase) -> Exception:
        """The one mapping from SQLite errors to the documented builtins."""
        code = (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF
        if code in (_SQLITE_AUTH, _SQLITE_READONLY) or self.denied:
            denied = ", ".join(dict.fromkeys(self.denied)) or "writing"
            return ValueError(
                f"query rejected: {denied} is not allowed; the database is read-only "
                "(writes, ATTACH, PRAGMA, transactions and extension loading are rejected)"
            )
        if code == _SQLITE_INTERRUPT:
            if self._canceled.is_set():
                return RuntimeError("query canceled")
            return TimeoutError(f"query stopped at its {database.timeout_seconds:g}-second deadline")
        if code == _SQLITE_TOOBIG:
            return ValueError(f"a value inside the query exceeds SQLite's length limit ({database.length_limit} "
                              "bytes); select less data")
        if isinstance(error, (OverflowError, sqlite3.ProgrammingError, sqlite3.InterfaceError)) \
                or code in _QUERY_FAULTS:
            return ValueError(f"query failed: {error}")
        return RuntimeError(f"SQLite database {database.path} failed: {error}")


def _columns(connection: sqlite3.Connection, table: str) -> dict[str, Any]:
    """A table's or view's columns; a view SQLite cannot resolve reports its error instead."""
    try:
        quoted = table.replace('"', '""')
        rows = connection.execute(f'PRAGMA main.table_xinfo("{quoted}")').fetchall()
    except sqlite3.OperationalError as error:
        if (getattr(error, "sqlite_errorcode", 0) or 0) & 0xFF != 1:
            raise
        return {"columns": [], "error": str(error)}
    return {"columns": [
        {"name": name, "type": declared, "not_null": bool(not_null), "default": default,
         "primary_key": primary_key > 0}
        for _, name, declared, not_null, default, primary_key, hidden in rows
        if hidden != 1  # hidden virtual-table columns; generated columns stay
    ]}


def _within(items: Iterator[Any], *, max_items: int, max_bytes: int) -> tuple[list[Any], bool]:
    """Items in order while at most ``max_items`` fit in ``max_bytes`` of JSON; whether more remained."""
    kept: list[Any] = []
    size = 0
    for item in items:
        item_size = _json_size(item) + 1  # and its separator
        if len(kept) == max_items or size + item_size > max_bytes:
            return kept, True
        kept.append(item)
        size += item_size
    return kept, False


def _json_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
