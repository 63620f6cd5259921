"""The Storage contract, for InMemoryStorage and SQLiteStorage alike, plus SQLite's durability."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest

from protolink.errors import StorageError
from protolink.storage import InMemoryStorage, SQLiteStorage, Storage


@pytest.fixture(params=["memory", "sqlite"])
def storage(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "memory":
        yield InMemoryStorage("contract")
    else:
        store = SQLiteStorage(tmp_path / "contract.db", namespace="contract")
        yield store
        store.close()


def test_both_implement_the_protocol(storage):
    assert isinstance(storage, Storage)
    assert storage.namespace == "contract"


def test_missing_keys_read_as_none(storage):
    assert storage.get("absent") is None


@pytest.mark.parametrize("value", [0, -1.5, "text", True, [1, [2]], {"a": {"b": None}}, "é\u2028"])
def test_json_values_round_trip(storage, value):
    storage.put("k", value)
    assert storage.get("k") == value


def test_reads_are_detached_copies(storage):
    storage.put("doc", {"items": [1]})
    storage.get("doc")["items"].append(2)
    assert storage.get("doc") == {"items": [1]}


def test_writes_are_detached_from_the_caller(storage):
    value = {"items": [1]}
    storage.put("doc", value)
    value["items"].append(2)
    assert storage.get("doc") == {"items": [1]}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), {"x": float("-inf")}, {1, 2}, b"bytes", object()])
def test_non_json_and_non_finite_values_are_rejected(storage, value):
    storage.put("k", "before")
    with pytest.raises(ValueError):
        storage.put("k", value)
    assert storage.get("k") == "before"


def test_keys_are_sorted_and_filtered_by_a_literal_prefix(storage):
    for key in ["b", "a:2", "a:1", "a%", "a_", "ab"]:
        storage.put(key, key)
    assert storage.keys() == ["a%", "a:1", "a:2", "a_", "ab", "b"]
    assert storage.keys("a:") == ["a:1", "a:2"]
    assert storage.keys("a%") == ["a%"]
    assert storage.keys("a_") == ["a_"]
    assert storage.keys("zzz") == []


def test_delete_removes_and_ignores_absent_keys(storage):
    storage.put("k", 1)
    storage.delete("k")
    storage.delete("never")
    assert storage.get("k") is None
    assert storage.keys() == []


def test_update_applies_a_function_and_none_deletes(storage):
    assert storage.update("count", lambda current: (current or 0) + 1) == 1
    assert storage.update("count", lambda current: current + 1) == 2
    assert storage.get("count") == 2
    assert storage.update("count", lambda current: None) is None
    assert storage.keys() == []


def test_a_failing_update_changes_nothing(storage):
    storage.put("k", {"n": 1})

    def explode(current):
        current["n"] = 99
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        storage.update("k", explode)
    with pytest.raises(ValueError):
        storage.update("k", lambda current: float("nan"))
    assert storage.get("k") == {"n": 1}


@pytest.mark.parametrize("namespace", ["", "   ", "n" * 257, None])
def test_namespaces_must_be_nonblank_and_short(tmp_path, namespace):
    with pytest.raises(ValueError):
        InMemoryStorage(namespace)
    with pytest.raises(ValueError):
        SQLiteStorage(tmp_path / "n.db", namespace=namespace)


def test_updates_are_atomic_across_threads(storage):
    def increment() -> None:
        for _ in range(50):
            storage.update("count", lambda current: (current or 0) + 1)

    threads = [threading.Thread(target=increment) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert storage.get("count") == 200


# -- SQLiteStorage ---------------------------------------------------------------------------


def test_sqlite_namespaces_in_one_file_are_separate(tmp_path):
    first = SQLiteStorage(tmp_path / "shared.db", namespace="one")
    second = SQLiteStorage(tmp_path / "shared.db", namespace="two")
    try:
        first.put("k", "first")
        second.put("k", "second")
        assert (first.get("k"), second.get("k")) == ("first", "second")
        assert first.keys() == ["k"]
        second.delete("k")
        assert first.get("k") == "first"
    finally:
        first.close()
        second.close()


def test_sqlite_values_persist_and_the_file_uses_wal(tmp_path):
    path = tmp_path / "durable.db"
    store = SQLiteStorage(path, namespace="n")
    store.put("k", {"kept": True})
    store.close()
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    reopened = SQLiteStorage(path, namespace="n")
    try:
        assert reopened.get("k") == {"kept": True}
    finally:
        reopened.close()


def test_sqlite_update_is_atomic_across_connections(tmp_path):
    path = tmp_path / "counter.db"
    stores = [SQLiteStorage(path, namespace="n", timeout_seconds=30) for _ in range(4)]

    def increment(store: SQLiteStorage) -> None:
        for _ in range(25):
            store.update("count", lambda current: (current or 0) + 1)

    threads = [threading.Thread(target=increment, args=(store,)) for store in stores]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert stores[0].get("count") == 100
    finally:
        for store in stores:
            store.close()


def test_a_file_that_is_not_a_database_is_a_storage_error(tmp_path):
    path = tmp_path / "corrupt.db"
    path.write_bytes(b"this is not a SQLite database, just some text" * 100)
    with pytest.raises(StorageError, match="not a usable SQLite database"):
        SQLiteStorage(path, namespace="n")
    assert path.read_bytes().startswith(b"this is not a SQLite database")
    assert str(path) not in open_files(), "the failed connection is closed"


def open_files() -> set[str]:
    descriptors = Path("/proc/self/fd")
    return {os.readlink(descriptors / name) for name in os.listdir(descriptors)
            if (descriptors / name).is_symlink()}


def test_a_corrupt_stored_value_is_a_storage_error(tmp_path):
    path = tmp_path / "values.db"
    store = SQLiteStorage(path, namespace="n")
    try:
        store.put("k", 1)
        with sqlite3.connect(path) as connection:
            connection.execute("UPDATE protolink_values SET value = 'NaN' WHERE key = 'k'")
            connection.execute("INSERT INTO protolink_values VALUES ('n', 'broken', '{not json')")
        with pytest.raises(StorageError, match="not valid JSON"):
            store.get("k")
        with pytest.raises(StorageError, match="not valid JSON"):
            store.get("broken")
    finally:
        store.close()


def test_a_closed_sqlite_storage_refuses_use(tmp_path):
    store = SQLiteStorage(tmp_path / "closed.db", namespace="n")
    store.close()
    with pytest.raises(StorageError):
        store.get("k")
