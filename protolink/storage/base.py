"""The synchronous Storage contract: a namespace of JSON documents addressed by key."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from protolink.errors import StorageError


@runtime_checkable
class Storage(Protocol):
    """A namespaced key -> JSON value store with one atomic read-modify-write.

    Values are JSON data (no NaN or infinities). ``get`` returns a detached copy, or ``None``
    for a missing key. ``update(key, fn)`` applies ``fn(current)`` atomically and stores the
    returned value; returning ``None`` deletes the key.
    """

    namespace: str

    def get(self, key: str) -> Any | None: ...

    def put(self, key: str, value: Any) -> None: ...

    def delete(self, key: str) -> None: ...

    def keys(self, prefix: str = "") -> list[str]: ...

    def update(self, key: str, fn: Callable[[Any | None], Any | None]) -> Any | None: ...


def encode(value: Any) -> str:
    """Serialize one JSON value, rejecting non-finite numbers and non-JSON types."""
    try:
        return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise ValueError(f"value is not finite JSON data: {error}") from None


def decode(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as error:
        raise StorageError(f"stored value is not valid JSON: {error}") from None


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name}")


def check_namespace(namespace: str) -> str:
    if not isinstance(namespace, str) or not namespace.strip() or len(namespace) > 256:
        raise ValueError("namespace must be a nonblank string of at most 256 characters")
    return namespace


def is_finite_json(value: Any) -> bool:
    """True when ``value`` is JSON data with only finite numbers."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_finite_json(v) for k, v in value.items())
    if isinstance(value, list):
        return all(is_finite_json(item) for item in value)
    return value is None or isinstance(value, (str, int, bool))
