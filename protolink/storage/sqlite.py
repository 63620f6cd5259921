"""SQLiteStorage: the Storage contract in one SQLite file (WAL, atomic updates)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from protolink.errors import StorageError

from .base import check_namespace, decode, encode

_SCHEMA = """
CREATE TABLE IF NOT EXISTS protolink_values (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID
"""


class SQLiteStorage:
    """A Storage namespace in a SQLite database file, created on first use.

    The database runs in WAL mode; ``update`` is one ``BEGIN IMMEDIATE`` transaction, so a
    read-modify-write is atomic against other connections. A file that is not a SQLite
    database raises :class:`StorageError`.
    """

    def __init__(self, path: str | Path, namespace: str = "default", *, timeout_seconds: float = 5.0) -> None:
        self.path = Path(path)
        self.namespace = check_namespace(namespace)
        self._lock = threading.RLock()
        try:
            self._connection = sqlite3.connect(
                self.path, timeout=timeout_seconds, isolation_level=None, check_same_thread=False
            )
        except sqlite3.DatabaseError as error:
            raise StorageError(f"{self.path} is not a usable SQLite database: {error}") from None
        try:
            self._connection.execute("PRAGMA journal_mode=WAL")
            self._connection.execute("PRAGMA synchronous=FULL")
            self._connection.execute(_SCHEMA)
        except sqlite3.DatabaseError as error:
            self._connection.close()
            raise StorageError(f"{self.path} is not a usable SQLite database: {error}") from None

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    @contextmanager
    def _transaction(self, mode: str = "DEFERRED") -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._connection.execute(f"BEGIN {mode}")
                try:
                    yield self._connection
                except BaseException:
                    self._connection.execute("ROLLBACK")
                    raise
                self._connection.execute("COMMIT")
            except sqlite3.DatabaseError as error:
                raise StorageError(f"storage {self.path} failed: {error}") from None

    def _read(self, connection: sqlite3.Connection, key: str) -> Any | None:
        row = connection.execute(
            "SELECT value FROM protolink_values WHERE namespace = ? AND key = ?", (self.namespace, key)
        ).fetchone()
        return None if row is None else decode(row[0])

    def _write(self, connection: sqlite3.Connection, key: str, value: Any | None) -> None:
        if value is None:
            connection.execute(
                "DELETE FROM protolink_values WHERE namespace = ? AND key = ?", (self.namespace, key)
            )
        else:
            connection.execute(
                "INSERT OR REPLACE INTO protolink_values (namespace, key, value) VALUES (?, ?, ?)",
                (self.namespace, key, encode(value)),
            )

    def get(self, key: str) -> Any | None:
        with self._transaction() as connection:
            return self._read(connection, key)

    def put(self, key: str, value: Any) -> None:
        encode(value)  # reject bad values before opening a write transaction
        with self._transaction("IMMEDIATE") as connection:
            self._write(connection, key, value)

    def delete(self, key: str) -> None:
        with self._transaction("IMMEDIATE") as connection:
            self._write(connection, key, None)

    def keys(self, prefix: str = "") -> list[str]:
        with self._transaction() as connection:
            rows = connection.execute(
                "SELECT key FROM protolink_values WHERE namespace = ? AND substr(key, 1, ?) = ? ORDER BY key",
                (self.namespace, len(prefix), prefix),
            ).fetchall()
        return [row[0] for row in rows]

    def update(self, key: str, fn: Callable[[Any | None], Any | None]) -> Any | None:
        with self._transaction("IMMEDIATE") as connection:
            new = fn(self._read(connection, key))
            self._write(connection, key, new)
            return new
