"""storage_tools(): a small JSON key/value store for agents, on an application Storage namespace.

The namespace holds one JSON object (key -> value) under the storage key ``"values"``; every
operation loads that map and every write saves it through ``Storage.update``, atomically for
the Storage implementation. The bundle's tools share one lock, so give the bundle exclusive
ownership of a dedicated namespace and reuse its tools rather than building a second bundle.
"""

from __future__ import annotations

import copy
import threading
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue

from protolink.core.tools import Artifact, Preparation, PreparedTool, ToolContext
from protolink.errors import StorageError
from protolink.storage import Storage
from protolink.storage.base import encode

STORE_KEY = "values"
MAX_KEY_CHARS = 256
MAX_LIST_LIMIT = 1000
READ, WRITE = "storage.read", "storage.write"
TAGS = ("builtin", "storage")


def _nonblank(key: str) -> str:
    if not key.strip():
        raise ValueError("key must not be blank")
    return key


Key = Annotated[str, Field(min_length=1, max_length=MAX_KEY_CHARS,
                           description=f"Nonblank key of at most {MAX_KEY_CHARS} characters."),
                AfterValidator(_nonblank)]


class KeyArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: Key


class ListKeysArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prefix: str = Field(default="", max_length=MAX_KEY_CHARS, description="Literal key prefix to filter by.")
    offset: int = Field(default=0, ge=0, description="Position in the sorted matching keys to start from.")
    limit: int = Field(default=100, ge=1, le=MAX_LIST_LIMIT,
                       description=f"Maximum keys returned (1–{MAX_LIST_LIMIT}).")


class SetValueArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: Key
    value: JsonValue = Field(description="JSON data to store (finite numbers only).")


class _ValueMap:
    """The bundle's map under one storage key, with its limits and its lock."""

    def __init__(self, storage: Storage, *, max_value_bytes: int, max_store_bytes: int, max_keys: int) -> None:
        self.storage = storage
        self.max_value_bytes = max_value_bytes
        self.max_store_bytes = max_store_bytes
        self.max_keys = max_keys
        self._lock = threading.Lock()

    def load(self) -> dict[str, Any]:
        with self._lock:
            return self._checked(self.storage.get(STORE_KEY))

    def check_value(self, value: Any) -> None:
        """ValueError for non-finite or non-JSON data, or a value over ``max_value_bytes``."""
        size = len(encode(value).encode())
        if size > self.max_value_bytes:
            raise ValueError(f"value is {size} bytes of JSON; the limit is {self.max_value_bytes}")

    def set(self, key: str, value: Any) -> bool:
        """Store ``value`` if the map stays within its limits; True when ``key`` is new."""
        created = False

        def put(current: Any | None) -> dict[str, Any]:
            nonlocal created
            values = dict(self._checked(current))
            created = key not in values
            values[key] = value
            if len(values) > self.max_keys:
                raise ValueError(f"the store would hold {len(values)} keys; the limit is {self.max_keys}")
            size = len(encode(values).encode())
            if size > self.max_store_bytes:
                raise ValueError(f"the store would hold {size} bytes of JSON; the limit is {self.max_store_bytes}")
            return values

        with self._lock:
            self.storage.update(STORE_KEY, put)
        return created

    def delete(self, key: str) -> bool:
        """Remove ``key``; False, with nothing written, when it is absent."""
        deleted = False

        def remove(current: Any | None) -> dict[str, Any] | None:
            nonlocal deleted
            values = dict(self._checked(current))
            deleted = key in values
            values.pop(key, None)
            return values or None

        with self._lock:
            if key in self._checked(self.storage.get(STORE_KEY)):
                self.storage.update(STORE_KEY, remove)
        return deleted

    def _checked(self, stored: Any | None) -> dict[str, Any]:
        if stored is None:
            return {}
        if not isinstance(stored, dict):
            raise StorageError(
                f"storage namespace {self.storage.namespace!r} key {STORE_KEY!r} holds "
                f"{type(stored).__name__}, not the JSON object storage_tools keeps there"
            )
        return stored


def storage_tools(
    storage: Storage,
    *,
    allow_write: bool = False,
    max_value_bytes: int = 65_536,
    max_store_bytes: int = 1_048_576,
    max_keys: int = 1_000,
) -> list[PreparedTool]:
    """Create ``get_value`` and ``list_keys`` (``storage.read``), plus ``set_value`` and
    ``delete_value`` (``storage.write``) when ``allow_write=True``.

    Keys are nonblank strings of at most 256 characters; values are JSON data with finite
    numbers, at most ``max_value_bytes`` encoded. The whole map is limited to
    ``max_store_bytes`` and ``max_keys``. Missing keys return ``found=False``; a stored null
    returns ``found=True, value=None``. Results are detached copies. Deleting an absent key is
    a no-op.
    """
    if not isinstance(storage, Storage):
        raise TypeError(f"storage must implement the Storage protocol, not {type(storage).__name__}")
    for name, limit in (("max_value_bytes", max_value_bytes), ("max_store_bytes", max_store_bytes),
                        ("max_keys", max_keys)):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"{name} must be a positive integer, not {limit!r}")
    values = _ValueMap(storage, max_value_bytes=max_value_bytes, max_store_bytes=max_store_bytes,
                       max_keys=max_keys)

    async def prepare_get(args: KeyArguments, ctx: ToolContext) -> Preparation:
        async def execute(ctx: ToolContext) -> dict[str, Any]:
            stored = values.load()
            found = args.key in stored
            return {"key": args.key, "found": found, "value": copy.deepcopy(stored.get(args.key))}

        return Preparation(execute=execute, capabilities=(READ,))

    async def prepare_list(args: ListKeysArguments, ctx: ToolContext) -> Preparation:
        async def execute(ctx: ToolContext) -> dict[str, Any]:
            keys = sorted(key for key in values.load() if key.startswith(args.prefix))
            end = args.offset + args.limit
            return {"keys": keys[args.offset:end], "next_offset": end if end < len(keys) else None}

        return Preparation(execute=execute, capabilities=(READ,))

    tools = [
        PreparedTool(name="get_value", description="Read the JSON value stored under a key.",
                     arguments=KeyArguments, prepare=prepare_get, capabilities=(READ,), tags=TAGS),
        PreparedTool(name="list_keys",
                     description="List stored keys in sorted order, filtered by a literal prefix, "
                                 "one page at a time (next_offset continues; null when done).",
                     arguments=ListKeysArguments, prepare=prepare_list, capabilities=(READ,), tags=TAGS),
    ]
    if not allow_write:
        return tools

    async def prepare_set(args: SetValueArguments, ctx: ToolContext) -> Preparation:
        values.check_value(args.value)
        value = copy.deepcopy(args.value)

        async def execute(ctx: ToolContext) -> dict[str, Any]:
            return {"key": args.key, "created": values.set(args.key, value)}

        preview = Artifact(kind="storage_write", title=f"set {args.key}",
                           content={"operation": "set", "key": args.key, "value": value})
        return Preparation(execute=execute, capabilities=(WRITE,), artifacts=(preview,))

    async def prepare_delete(args: KeyArguments, ctx: ToolContext) -> Preparation:
        async def execute(ctx: ToolContext) -> dict[str, Any]:
            return {"key": args.key, "deleted": values.delete(args.key)}

        preview = Artifact(kind="storage_write", title=f"delete {args.key}",
                           content={"operation": "delete", "key": args.key})
        return Preparation(execute=execute, capabilities=(WRITE,), artifacts=(preview,))

    tools += [
        PreparedTool(name="set_value", description="Store a JSON value under a key, replacing any previous value.",
                     arguments=SetValueArguments, prepare=prepare_set, capabilities=(WRITE,), tags=TAGS),
        PreparedTool(name="delete_value", description="Delete a key; deleting an absent key changes nothing.",
                     arguments=KeyArguments, prepare=prepare_delete, capabilities=(WRITE,), tags=TAGS),
    ]
    return tools

