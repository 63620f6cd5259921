"""Resource revisions, change records, the storage checkpoint store and the change state machine.

The state machine runs against a small in-memory Resource so each failure point can be hit
exactly; the file-backed behaviour is in tests/behaviour/test_recovery.py.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from protolink import StorageCheckpointStore
from protolink.core.resources import (
    CheckpointStore,
    Resource,
    ResourceChange,
    apply_change,
    inspect_change,
    restore_change,
)
from protolink.errors import ResourceConflictError, ResourceUnchangedError, StorageError
from protolink.revisions import ResourceRevision, ResourceSnapshot, revision_of
from protolink.storage import InMemoryStorage


class MemoryResource:
    """A Resource over a dict; ``fail_after_write`` makes the next replace raise having written."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[bytes, int]] = {}
        self.versions: dict[str, int] = {}
        self.replacements = 0
        self.fail_after_write = False

    def revision(self, resource_id: str) -> ResourceRevision:
        if resource_id not in self.items:
            return ResourceRevision(resource_id, False)
        data, mode = self.items[resource_id]
        return revision_of(resource_id, data, mode=mode, identity=(1, self.versions[resource_id]))

    async def read(self, resource_id: str) -> ResourceSnapshot:
        item = self.items.get(resource_id)
        return ResourceSnapshot(self.revision(resource_id), None if item is None else item[0])

    async def replace(self, expected_snapshot: ResourceSnapshot, data: bytes | None,
                      mode: int | None) -> ResourceRevision:
        resource_id = expected_snapshot.resource_id
        if not expected_snapshot.revision.matches(self.revision(resource_id)):
            raise ResourceConflictError(f"{resource_id} changed")
        self.replacements += 1
        if data is None:
            del self.items[resource_id]
        else:
            self.items[resource_id] = (data, mode if mode is not None else 0o600)
            self.versions[resource_id] = self.versions.get(resource_id, 0) + 1
        if self.fail_after_write:
            self.fail_after_write = False
            raise OSError("lost the connection after writing")
        return self.revision(resource_id)

    def put(self, resource_id: str, data: bytes, mode: int = 0o644) -> None:
        """An external writer: new content, new identity."""
        self.items[resource_id] = (data, mode)
        self.versions[resource_id] = self.versions.get(resource_id, 0) + 1


class FlakyStorage(InMemoryStorage):
    """Storage whose updates raise while ``failing`` is True."""

    failing = False

    def update(self, key: str, fn: Any) -> Any:
        if self.failing:
            raise StorageError("storage unavailable")
        return super().update(key, fn)


@pytest.fixture
def resource() -> MemoryResource:
    store = MemoryResource()
    store.put("doc", b"original\n", 0o640)
    return store


@pytest.fixture
def storage() -> FlakyStorage:
    return FlakyStorage("file-changes")


@pytest.fixture
def checkpoints(storage: FlakyStorage) -> StorageCheckpointStore:
    return StorageCheckpointStore(storage)


async def change_doc(resource: MemoryResource, checkpoints: CheckpointStore,
                     data: bytes = b"changed\n") -> ResourceChange:
    before = await resource.read("doc")
    return await apply_change(resource, checkpoints, before, data, 0o640, action_id="act_1", run_id="run_1",
                              task_id="task_1")


def test_protocols_are_satisfied(resource: MemoryResource, checkpoints: StorageCheckpointStore) -> None:
    assert isinstance(resource, Resource)
    assert isinstance(checkpoints, CheckpointStore)


# -- revisions and records ------------------------------------------------------------------


def test_a_revision_matches_only_what_it_records() -> None:
    planned = revision_of("doc", b"x", mode=0o600)
    observed = revision_of("doc", b"x", mode=0o600, identity=(1, 2), parent_identity=(1, 1))
    assert planned.matches(observed)
    assert not observed.matches(revision_of("doc", b"x", mode=0o600, identity=(1, 3), parent_identity=(1, 1)))
    assert not observed.matches(revision_of("doc", b"x", mode=0o644, identity=(1, 2), parent_identity=(1, 1)))
    assert not planned.matches(revision_of("doc", b"y", mode=0o600))
    assert not planned.matches(ResourceRevision("doc", False))
    assert not planned.matches(revision_of("other", b"x", mode=0o600))


def test_records_round_trip_with_lossless_bytes() -> None:
    every_byte = bytes(range(256))
    before = ResourceSnapshot(revision_of("doc", every_byte, mode=0o755, identity=(3, 4), parent_identity=(3, 1)),
                              every_byte)
    change = ResourceChange(change_id="chg_1", resource_id="doc", operation="replace", state="applied",
                            before=before, after=revision_of("doc", b"new", mode=0o755, identity=(3, 5)),
                            action_id="act_1", run_id="run_1", task_id=None, created_at=1.0, updated_at=2.0)
    stored = InMemoryStorage()
    stored.put("chg_1", change.to_dict())  # through JSON encoding
    assert ResourceChange.from_dict(stored.get("chg_1")) == change


async def test_the_store_refuses_a_duplicate_or_out_of_order_save(resource, checkpoints) -> None:
    change = await change_doc(resource, checkpoints)
    with pytest.raises(ResourceConflictError):
        checkpoints.save(change)
    with pytest.raises(ResourceConflictError):
        checkpoints.save(change.evolve("restored"), previous="restoring")
    assert checkpoints.load(change.change_id) == change
    assert checkpoints.load("chg_unknown") is None
    assert checkpoints.change_ids() == [change.change_id]


def test_a_corrupt_record_is_a_storage_error(storage, checkpoints) -> None:
    storage.put("chg_bad", {"change_id": "chg_bad", "state": "applied"})
    with pytest.raises(StorageError, match="corrupt"):
        checkpoints.load("chg_bad")


# -- applying -------------------------------------------------------------------------------


async def test_apply_records_prepared_before_mutating(resource, checkpoints, storage) -> None:
    seen_states = []
    original_replace = resource.replace

    async def replace_and_look(*args: Any) -> ResourceRevision:
        seen_states.extend(record["state"] for record in map(storage.get, storage.keys()))
        return await original_replace(*args)

    resource.replace = replace_and_look
    change = await change_doc(resource, checkpoints)
    assert seen_states == ["prepared"]
    assert change.state == "applied"
    assert change.before.data == b"original\n" and change.after == resource.revision("doc")
    assert (change.action_id, change.run_id, change.task_id) == ("act_1", "run_1", "task_1")
    assert checkpoints.load(change.change_id) == change


async def test_failure_to_save_the_initial_record_prevents_mutation(resource, checkpoints, storage) -> None:
    storage.failing = True
    with pytest.raises(StorageError):
        await change_doc(resource, checkpoints)
    assert resource.replacements == 0 and resource.items["doc"][0] == b"original\n"


async def test_a_conflict_is_recorded_as_failed(resource, checkpoints) -> None:
    before = await resource.read("doc")
    resource.put("doc", b"external\n")
    with pytest.raises(ResourceConflictError):
        await apply_change(resource, checkpoints, before, b"mine\n", 0o640)
    [change_id] = checkpoints.change_ids()
    assert checkpoints.load(change_id).state == "failed"
    assert not checkpoints.load(change_id).uncertain


async def test_a_refused_write_is_recorded_as_failed(resource, checkpoints) -> None:
    async def read_only(*args: Any) -> ResourceRevision:
        raise ResourceUnchangedError(30, "read-only file system")

    resource.replace = read_only
    with pytest.raises(ResourceUnchangedError):
        await change_doc(resource, checkpoints)
    [change_id] = checkpoints.change_ids()
    assert checkpoints.load(change_id).state == "failed"


async def test_an_error_after_a_possible_write_is_uncertain(resource, checkpoints) -> None:
    resource.fail_after_write = True
    with pytest.raises(OSError):
        await change_doc(resource, checkpoints)
    [change_id] = checkpoints.change_ids()
    record = checkpoints.load(change_id)
    assert record.state == "uncertain" and record.uncertain and "OSError" in record.error


async def test_an_interrupted_mutation_reads_as_uncertain(resource, checkpoints, storage) -> None:
    original_replace = resource.replace

    async def replace_then_lose_storage(*args: Any) -> ResourceRevision:
        revision = await original_replace(*args)
        storage.failing = True
        return revision

    resource.replace = replace_then_lose_storage
    with pytest.raises(StorageError):
        await change_doc(resource, checkpoints)
    storage.failing = False
    [change_id] = checkpoints.change_ids()
    inspection = await inspect_change(resource, checkpoints, change_id)
    assert (inspection.change.state, inspection.uncertain) == ("prepared", True)
    with pytest.raises(ResourceConflictError, match="inspection"):
        await restore_change(resource, checkpoints, change_id)


async def test_a_failed_outcome_record_keeps_the_original_error(resource, checkpoints, storage) -> None:
    original_replace = resource.replace

    async def lose_storage_then_conflict(*args: Any) -> ResourceRevision:
        storage.failing = True
        raise ResourceConflictError("doc changed")

    resource.replace = lose_storage_then_conflict
    with pytest.raises(ResourceConflictError) as raised:
        await change_doc(resource, checkpoints)
    assert any("recording the failed state failed" in note for note in raised.value.__notes__)
    resource.replace = original_replace


# -- restoring ------------------------------------------------------------------------------


async def test_restore_puts_back_bytes_and_mode(resource, checkpoints) -> None:
    change = await change_doc(resource, checkpoints)
    restored = await restore_change(resource, checkpoints, change.change_id)
    assert resource.items["doc"] == (b"original\n", 0o640)
    assert restored.state == "restored" and restored.restored == resource.revision("doc")
    assert checkpoints.load(change.change_id).state == "restored"


async def test_restore_of_a_creation_removes_the_resource(resource, checkpoints) -> None:
    before = await resource.read("new")
    change = await apply_change(resource, checkpoints, before, b"created\n", 0o600)
    assert change.operation == "create"
    await restore_change(resource, checkpoints, change.change_id)
    assert "new" not in resource.items


async def test_restore_requires_the_exact_postimage(resource, checkpoints) -> None:
    change = await change_doc(resource, checkpoints)
    resource.put("doc", b"changed\n", 0o640)  # same bytes and mode, but not the revision we wrote
    inspection = await inspect_change(resource, checkpoints, change.change_id)
    assert inspection.conflict
    with pytest.raises(ResourceConflictError):
        await restore_change(resource, checkpoints, change.change_id)
    assert checkpoints.load(change.change_id).state == "applied"


async def test_restore_refuses_a_snapshot_other_than_the_approved_one(resource, checkpoints) -> None:
    change = await change_doc(resource, checkpoints)
    approved = await resource.read("doc")
    stale = ResourceSnapshot(revision_of("doc", b"something else\n", mode=0o640), b"something else\n")
    with pytest.raises(ResourceConflictError, match="approved"):
        await restore_change(resource, checkpoints, change.change_id, expected=stale)
    assert (await restore_change(resource, checkpoints, change.change_id, expected=approved)).state == "restored"


async def test_a_conflict_during_restore_returns_the_record_to_applied(resource, checkpoints) -> None:
    change = await change_doc(resource, checkpoints)
    original_replace = resource.replace

    async def external_write_first(*args: Any) -> ResourceRevision:
        resource.put("doc", b"raced\n")
        return await original_replace(*args)

    resource.replace = external_write_first
    with pytest.raises(ResourceConflictError):
        await restore_change(resource, checkpoints, change.change_id)
    assert checkpoints.load(change.change_id).state == "applied"
    assert resource.items["doc"][0] == b"raced\n"


async def test_an_error_during_restore_is_uncertain(resource, checkpoints) -> None:
    change = await change_doc(resource, checkpoints)
    resource.fail_after_write = True
    with pytest.raises(OSError):
        await restore_change(resource, checkpoints, change.change_id)
    assert checkpoints.load(change.change_id).state == "uncertain"


async def test_only_an_applied_change_can_be_restored(resource, checkpoints) -> None:
    change = await change_doc(resource, checkpoints)
    await restore_change(resource, checkpoints, change.change_id)
    with pytest.raises(ResourceConflictError, match="restored"):
        await restore_change(resource, checkpoints, change.change_id)
    with pytest.raises(ValueError, match="no recorded change"):
        await restore_change(resource, checkpoints, "chg_missing")


def test_sha256_in_revisions_is_of_the_exact_bytes() -> None:
    assert revision_of("doc", b"abc", mode=0).sha256 == hashlib.sha256(b"abc").hexdigest()
