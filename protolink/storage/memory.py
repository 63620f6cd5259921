"""InMemoryStorage: the Storage contract in process memory."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .base import check_namespace, decode, encode


class InMemoryStorage:
    """A Storage namespace held in memory; values are stored encoded, so reads are detached."""

    def __init__(self, namespace: str = "default") -> None:
        self.namespace = check_namespace(namespace)
        self._values: dict[str, str] = {}
        self._lock = threading.RLock()

    def get(self, key: str) -> Any | None:
        with self._lock:
            text = self._values.get(key)
        return None if text is None else decode(text)

    def put(self, key: str, value: Any) -> None:
        text = encode(value)
        with self._lock:
            self._values[key] = text

    def delete(self, key: str) -> None:
        with self._lock:
            self._values.pop(key, None)

    def keys(self, prefix: str = "") -> list[str]:
        with self._lock:
            return sorted(key for key in self._values if key.startswith(prefix))

    def update(self, key: str, fn: Callable[[Any | None], Any | None]) -> Any | None:
        with self._lock:
            current = self.get(key)
            new = fn(current)
            if new is None:
                self._values.pop(key, None)
            else:
                self._values[key] = encode(new)
            return new
