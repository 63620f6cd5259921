"""Recoverable resources: snapshots, conditional replacement, and checkpoints kept on the host.

A :class:`Resource` reads a :class:`ResourceSnapshot` and replaces it only while it still
matches an expected revision. :func:`apply_change` records a :class:`ResourceChange` in a
:class:`CheckpointStore` *before* mutating, so every mutation can be inspected and, when it
is known to have been applied and the resource still holds the exact postimage, restored.

Change states::

    prepared ──> applied ──> restoring ──> restored
        │                        │  └──(conflict)──> applied
        ├──(conflict)──> failed  └──(error)──> uncertain
        └──(error)──> uncertain

A ``prepared`` or ``restoring`` record left behind by an interrupted operation is reported as
uncertain; nothing is replayed or guessed.
"""

from __future__ import annotations

import asyncio
import binascii
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args, runtime_checkable

from protolink.errors import ResourceConflictError, ResourceUnchangedError, StorageError
from protolink.execution.filesystem import FilesystemResource
from protolink.revisions import ResourceRevision, ResourceSnapshot, revision_of

from .ids import new_id

if TYPE_CHECKING:
    from protolink.storage import Storage

__all__ = [
    "ChangeInspection", "ChangeState", "CheckpointStore", "FilesystemResource", "Resource", "ResourceChange",
    "ResourceRevision", "ResourceSnapshot", "ResourceUnchangedError", "StorageCheckpointStore", "apply_change",
    "inspect_change", "restore_change",
]

ChangeState = Literal["prepared", "applied", "restoring", "restored", "failed", "uncertain"]
Operation = Literal["create", "replace"]
UNCERTAIN_STATES: frozenset[str] = frozenset({"prepared", "restoring", "uncertain"})


@dataclass(frozen=True)
class ResourceChange:
    """A recovery record: the lossless preimage, the expected postimage and the correlation ids.

    ``after`` is the planned postimage while ``prepared`` and the observed one once ``applied``;
    ``restored`` is the revision a restoration wrote.
    """

    change_id: str
    resource_id: str
    operation: Operation
    state: ChangeState
    before: ResourceSnapshot
    after: ResourceRevision
    action_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    restored: ResourceRevision | None = None
    error: str | None = None

    @property
    def uncertain(self) -> bool:
        """True when an interrupted or failed operation may or may not have taken effect."""
        return self.state in UNCERTAIN_STATES

    def evolve(self, state: ChangeState, **fields: Any) -> ResourceChange:
        return dataclasses.replace(self, state=state, updated_at=time.time(), **fields)

    def to_dict(self) -> dict[str, Any]:
        return {
            "change_id": self.change_id,
            "resource_id": self.resource_id,
            "operation": self.operation,
            "state": self.state,
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
            "action_id": self.action_id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "restored": None if self.restored is None else self.restored.to_dict(),
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResourceChange:
        state, operation = data["state"], data["operation"]
        if state not in get_args(ChangeState) or operation not in get_args(Operation):
            raise ValueError(f"unknown state {state!r} or operation {operation!r}")
        restored = data.get("restored")
        return cls(
            change_id=str(data["change_id"]),
            resource_id=str(data["resource_id"]),
            operation=operation,
            state=state,
            before=ResourceSnapshot.from_dict(data["before"]),
            after=ResourceRevision.from_dict(data["after"]),
            action_id=data.get("action_id"),
            run_id=data.get("run_id"),
            task_id=data.get("task_id"),
            created_at=float(data.get("created_at", 0.0)),
            updated_at=float(data.get("updated_at", 0.0)),
            restored=None if restored is None else ResourceRevision.from_dict(restored),
            error=data.get("error"),
        )


@runtime_checkable
class Resource(Protocol):
    """Something that can be snapshotted and conditionally replaced.

    ``replace`` writes ``data`` with ``mode`` only while the resource still matches
    ``expected_snapshot``'s revision, raising ResourceConflictError (and writing nothing)
    otherwise; ``data=None`` removes it. It returns the revision it wrote.
    """

    async def read(self, resource_id: str) -> ResourceSnapshot: ...

    async def replace(self, expected_snapshot: ResourceSnapshot, data: bytes | None,
                      mode: int | None) -> ResourceRevision: ...


@runtime_checkable
class CheckpointStore(Protocol):
    """Durable recovery records, one per change id (synchronous, like Storage).

    ``save(change, previous=None)`` stores a new record and refuses an existing id;
    ``save(change, previous=state)`` replaces a record only while its stored state is
    ``state`` (ResourceConflictError otherwise). ``load`` returns None for an unknown id.
    """

    def save(self, change: ResourceChange, *, previous: ChangeState | None = None) -> None: ...

    def load(self, change_id: str) -> ResourceChange | None: ...

    def change_ids(self) -> list[str]: ...


class StorageCheckpointStore:
    """A CheckpointStore in a dedicated Storage namespace (one live writer), as JSON records.

    Original bytes are kept losslessly (base64), so protect the storage as application data.
    """

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def save(self, change: ResourceChange, *, previous: ChangeState | None = None) -> None:
        def swap(stored: Any | None) -> dict[str, Any]:
            state = None if stored is None else stored.get("state")
            if state != previous:
                raise ResourceConflictError(
                    f"change {change.change_id} has {_state_text(state)}, expected {_state_text(previous)}"
                )
            return change.to_dict()

        self.storage.update(change.change_id, swap)

    def load(self, change_id: str) -> ResourceChange | None:
        stored = self.storage.get(change_id)
        if stored is None:
            return None
        try:
            return ResourceChange.from_dict(stored)
        except (KeyError, TypeError, ValueError, binascii.Error) as error:
            raise StorageError(f"checkpoint {change_id!r} is corrupt: {error}") from None

    def change_ids(self) -> list[str]:
        return self.storage.keys()


@dataclass(frozen=True)
class ChangeInspection:
    """A recorded change next to the resource's current state.

    ``current`` is None when the resource can no longer be read as a regular resource;
    ``conflict`` is True when it no longer holds the recorded postimage.
    """

    change: ResourceChange
    current: ResourceSnapshot | None
    conflict: bool

    @property
    def uncertain(self) -> bool:
        return self.change.uncertain

    def require_restorable(self) -> ResourceSnapshot:
        """The current snapshot, if restoring is allowed now; ResourceConflictError otherwise."""
        change = self.change
        if change.state != "applied":
            hint = " and needs application-led inspection" if change.uncertain else ""
            raise ResourceConflictError(
                f"change {change.change_id} is {change.state}{hint}; only an applied change can be restored")
        if self.conflict or self.current is None:
            raise ResourceConflictError(
                f"{change.resource_id} no longer holds the postimage of change {change.change_id}")
        return self.current


async def apply_change(resource: Resource, checkpoints: CheckpointStore, before: ResourceSnapshot, data: bytes,
                       mode: int, *, action_id: str | None = None, run_id: str | None = None,
                       task_id: str | None = None) -> ResourceChange:
    """Record, then make, the change from the approved ``before`` snapshot to ``data``/``mode``.

    The ``prepared`` record is saved first; if that fails nothing is mutated. A conflict
    leaves ``failed``; any other error after the write may have happened leaves ``uncertain``.
    """
    now = time.time()
    planned = revision_of(before.resource_id, data, mode=mode, parent_identity=before.revision.parent_identity)
    change = ResourceChange(
        change_id=new_id("chg"), resource_id=before.resource_id,
        operation="replace" if before.exists else "create", state="prepared", before=before,
        after=planned, action_id=action_id, run_id=run_id, task_id=task_id, created_at=now, updated_at=now,
    )
    await _save(checkpoints, change, previous=None)
    after = await _replace_recorded(resource, checkpoints, change, before, data, mode, conflict_state="failed")
    applied = change.evolve("applied", after=after)
    await _save(checkpoints, applied, previous="prepared")
    return applied


async def inspect_change(resource: Resource, checkpoints: CheckpointStore, change_id: str) -> ChangeInspection:
    """The saved record of ``change_id`` and whether the resource still holds its postimage."""
    change = await load_change(checkpoints, change_id)
    try:
        current: ResourceSnapshot | None = await resource.read(change.resource_id)
    except (OSError, ValueError):
        current = None
    conflict = current is None or not change.after.matches(current.revision)
    return ChangeInspection(change=change, current=current, conflict=conflict)


async def restore_change(resource: Resource, checkpoints: CheckpointStore, change_id: str, *,
                         expected: ResourceSnapshot | None = None) -> ResourceChange:
    """Put the preimage back (bytes and mode, or remove a created resource).

    Requires a saved ``applied`` record and the exact expected postimage (also in
    ``expected``, the approved current snapshot, when given); ResourceConflictError otherwise.
    """
    inspection = await inspect_change(resource, checkpoints, change_id)
    current = inspection.require_restorable()
    if expected is not None and expected.revision != current.revision:
        raise ResourceConflictError(f"{current.resource_id} changed since the restoration was approved")
    change = inspection.change
    restoring = change.evolve("restoring")
    await _save(checkpoints, restoring, previous="applied")
    restored = await _replace_recorded(resource, checkpoints, restoring, current, change.before.data,
                                       change.before.revision.mode, conflict_state="applied")
    done = restoring.evolve("restored", restored=restored)
    await _save(checkpoints, done, previous="restoring")
    return done


async def load_change(checkpoints: CheckpointStore, change_id: str) -> ResourceChange:
    """The saved record of ``change_id``; ValueError when there is none."""
    change = await asyncio.to_thread(checkpoints.load, change_id)
    if change is None:
        raise ValueError(f"no recorded change {change_id!r}")
    return change


async def _save(checkpoints: CheckpointStore, change: ResourceChange, *, previous: ChangeState | None) -> None:
    await asyncio.to_thread(checkpoints.save, change, previous=previous)


async def _replace_recorded(resource: Resource, checkpoints: CheckpointStore, record: ResourceChange,
                            expected: ResourceSnapshot, data: bytes | None, mode: int | None, *,
                            conflict_state: ChangeState) -> ResourceRevision:
    """``resource.replace`` while ``record`` is saved: a conflict or a refused write (nothing
    written) moves the record to ``conflict_state``; any other error, after which a write may
    have happened, to ``uncertain``."""
    try:
        return await resource.replace(expected, data, mode)
    except (ResourceConflictError, ResourceUnchangedError) as error:
        await _record_outcome(checkpoints, record.evolve(conflict_state, error=str(error)), record.state, error)
        raise
    except Exception as error:
        await _record_outcome(checkpoints, record.evolve("uncertain", error=_describe(error)), record.state, error)
        raise


async def _record_outcome(checkpoints: CheckpointStore, change: ResourceChange, previous: ChangeState,
                          error: BaseException) -> None:
    # The original error is what the caller must see; a record that cannot be updated stays
    # prepared/restoring, which inspection already reports as uncertain.
    try:
        await _save(checkpoints, change, previous=previous)
    except Exception as record_error:
        error.add_note(f"recording the {change.state} state failed: {_describe(record_error)}")


def _state_text(state: str | None) -> str:
    return "no record" if state is None else f"state {state!r}"


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
