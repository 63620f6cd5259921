"""Storage: the synchronous key -> JSON contract and its in-memory and SQLite implementations."""

from .base import Storage
from .memory import InMemoryStorage
from .sqlite import SQLiteStorage

__all__ = ["InMemoryStorage", "SQLiteStorage", "Storage"]
