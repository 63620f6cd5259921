"""Write recovery against a backend: checkpoints before mutation, restoration, conflicts, uncertainty.

Files live under ``workspace``; checkpoints stay with the test process (the host), as they do
in production.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from filesystem_agents import Approver, file_agent

from protolink import RunContext, StorageCheckpointStore
from protolink.errors import ResourceConflictError, ResourceUnchangedError, StorageError
from protolink.storage import InMemoryStorage, SQLiteStorage


class FailingStorage(InMemoryStorage):
    """In-memory storage whose updates fail from the ``fail_from``-th update on (1-based)."""

    def __init__(self, fail_from: int) -> None:
        super().__init__("file-changes")
        self.fail_from = fail_from
        self.updates = 0

    def update(self, key: str, fn: Callable[[Any | None], Any | None]) -> Any | None:
        self.updates += 1
        if self.updates >= self.fail_from:
            raise StorageError("disk full")
        return super().update(key, fn)


class WriteThenFailBackend:
    """The backend under test, except that a replacement raises after it has written."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def replace_file(self, *args: Any, **kwargs: Any) -> Any:
        await self._backend.replace_file(*args, **kwargs)
        raise ConnectionResetError("connection lost after the write")


@pytest.fixture
def note(workspace: Path) -> Path:
    path = workspace / "note.txt"
    path.write_bytes(b"line one\r\nline two \xc3\xa9\n")
    path.chmod(0o640)
    return path


@pytest.fixture
async def read_only_root(backend_kind: str, backend: Any, workspace: Path,
                         command_uid: int | None) -> AsyncIterator[Any]:
    """The backend under test seeing ``workspace`` (holding note.txt) as a read-only root: the
    host through a read-only bind mount, whose file system refuses writes (EROFS); a sandbox
    server given it as a read-only root, which refuses writes before touching the file system.
    The behavioural backends' roots are all writable, so this one is made here."""
    (workspace / "note.txt").write_text("kept\n")
    if backend_kind == "local":
        subprocess.run(["mount", "--bind", "-o", "ro", str(workspace), str(workspace)], check=True)
        try:
            yield backend
        finally:
            subprocess.run(["umount", str(workspace)], check=True)
    elif backend_kind == "server":
        from tests.sandbox_server import sandbox_server

        async with sandbox_server([(workspace, False)]) as server:
            yield server.backend
    else:
        from protolink.sandbox.docker import DockerSandbox
        from protolink.sandbox.provision import ensure_image

        image = await asyncio.to_thread(ensure_image)
        async with DockerSandbox([workspace], image=image, command_uid=command_uid) as sandbox_backend:
            yield sandbox_backend


async def test_replace_then_preview_then_restore(workspace: Path, note: Path, backend) -> None:
    agent = file_agent(workspace, backend)
    change = await agent.call_tool("replace_file", path=str(note), content="new content\n")
    assert note.read_text() == "new content\n"

    preview = await agent.call_tool("preview_change", change_id=change["change_id"])
    assert preview["state"] == "applied"
    assert (preview["conflict"], preview["uncertain"]) == (False, False)
    assert "-new content\n" in preview["diff"] and "+line two é\n" in preview["diff"]

    restored = await agent.call_tool("restore_change", change_id=change["change_id"])
    assert restored["state"] == "restored"
    assert note.read_bytes() == b"line one\r\nline two \xc3\xa9\n"  # lossless, CRLF included
    assert stat.S_IMODE(note.stat().st_mode) == 0o640


async def test_restoring_a_created_file_removes_it(workspace: Path, backend) -> None:
    agent = file_agent(workspace, backend)
    target = workspace / "created.txt"
    change = await agent.call_tool("create_file", path=str(target), content="temporary\n")
    preview = await agent.call_tool("preview_change", change_id=change["change_id"])
    assert preview["diff"].startswith(f"--- {target}\n+++ /dev/null\n")
    await agent.call_tool("restore_change", change_id=change["change_id"])
    assert not target.exists()


async def test_restore_after_an_external_modification_is_a_conflict(workspace: Path, note: Path,
                                                                    backend) -> None:
    approver = Approver()
    agent = file_agent(workspace, backend, approver=approver)
    change = await agent.call_tool("edit_file", path=str(note), old_text="one", new_text="1")
    note.write_text("someone else's work\n")

    preview = await agent.call_tool("preview_change", change_id=change["change_id"])
    assert (preview["state"], preview["conflict"]) == ("applied", True)
    requests = len(approver.requests)
    with pytest.raises(ResourceConflictError):
        await agent.call_tool("restore_change", change_id=change["change_id"])
    assert len(approver.requests) == requests  # refused before asking anyone
    assert note.read_text() == "someone else's work\n"


async def test_a_change_during_restore_approval_is_a_conflict_and_stays_restorable(
        workspace: Path, note: Path, backend) -> None:
    approver = Approver()
    agent = file_agent(workspace, backend, approver=approver)
    change = await agent.call_tool("replace_file", path=str(note), content="v2\n")

    approver.before_approving = lambda: note.write_text("v3\n")
    with pytest.raises(ResourceConflictError):
        await agent.call_tool("restore_change", change_id=change["change_id"])
    assert note.read_text() == "v3\n"

    preview = await agent.call_tool("preview_change", change_id=change["change_id"])
    assert (preview["state"], preview["conflict"], preview["uncertain"]) == ("applied", True, False)


async def test_restore_needs_a_saved_applied_change(workspace: Path, note: Path, backend) -> None:
    agent = file_agent(workspace, backend)
    change = await agent.call_tool("replace_file", path=str(note), content="v2\n")
    await agent.call_tool("restore_change", change_id=change["change_id"])
    with pytest.raises(ResourceConflictError, match="restored"):
        await agent.call_tool("restore_change", change_id=change["change_id"])
    with pytest.raises(ValueError, match="no recorded change"):
        await agent.call_tool("restore_change", change_id="chg_unknown")
    with pytest.raises(ValueError, match="no recorded change"):
        await agent.call_tool("preview_change", change_id="chg_unknown")


async def test_restore_of_a_file_replaced_by_a_symlink_is_a_conflict(workspace: Path, note: Path,
                                                                     backend) -> None:
    agent = file_agent(workspace, backend)
    change = await agent.call_tool("replace_file", path=str(note), content="v2\n")
    elsewhere = workspace / "elsewhere.txt"
    elsewhere.write_text("v2\n")
    note.unlink()
    note.symlink_to(elsewhere)
    preview = await agent.call_tool("preview_change", change_id=change["change_id"])
    assert (preview["conflict"], preview["diff"]) == (True, None)
    with pytest.raises(ResourceConflictError):
        await agent.call_tool("restore_change", change_id=change["change_id"])
    assert elsewhere.read_text() == "v2\n" and note.is_symlink()


async def test_records_correlate_action_task_and_run(workspace: Path, note: Path, backend) -> None:
    agent = file_agent(workspace, backend)
    completed = []
    agent.events.add_sink(lambda event: completed.append(event) if event.type == "action.completed" else None)
    run = RunContext(task_id="task-7")
    change = await agent.call_tool("replace_file", path=str(note), content="v2\n", context=run)
    assert (change["run_id"], change["task_id"]) == (run.run_id, "task-7")
    assert change["action_id"] == completed[-1].action_id


async def test_a_conflicting_write_is_recorded_as_failed(workspace: Path, note: Path, backend) -> None:
    storage = InMemoryStorage("file-changes")
    approver = Approver()
    approver.before_approving = lambda: note.write_text("changed\n")
    agent = file_agent(workspace, backend, approver=approver, checkpoints=StorageCheckpointStore(storage))
    with pytest.raises(ResourceConflictError):
        await agent.call_tool("replace_file", path=str(note), content="mine\n")
    [change_id] = storage.keys()
    preview = await agent.call_tool("preview_change", change_id=change_id)
    assert (preview["state"], preview["uncertain"]) == ("failed", False)


@pytest.mark.root  # the host's read-only file system is a bind mount
async def test_a_write_a_read_only_root_refuses_is_recorded_as_failed(workspace: Path, read_only_root) -> None:
    """Nothing is written when a read-only root refuses a write, on the host as in a sandbox:
    every write raises ResourceUnchangedError and is recorded failed, not uncertain."""
    storage = InMemoryStorage("file-changes")
    agent = file_agent(workspace, read_only_root, checkpoints=StorageCheckpointStore(storage))
    note = workspace / "note.txt"
    for tool, arguments in (("create_file", {"path": str(workspace / "new.txt"), "content": "new\n"}),
                            ("replace_file", {"path": str(note), "content": "replaced\n"}),
                            ("edit_file", {"path": str(note), "old_text": "kept", "new_text": "edited"})):
        with pytest.raises(ResourceUnchangedError, match="was not changed"):
            await agent.call_tool(tool, **arguments)
    assert len(storage.keys()) == 3
    for change_id in storage.keys():
        preview = await agent.call_tool("preview_change", change_id=change_id)
        assert (preview["state"], preview["uncertain"]) == ("failed", False)
    assert note.read_text() == "kept\n" and os.listdir(workspace) == ["note.txt"]


async def test_failure_to_save_the_initial_record_prevents_mutation(workspace: Path, note: Path,
                                                                    backend) -> None:
    checkpoints = StorageCheckpointStore(FailingStorage(fail_from=1))
    agent = file_agent(workspace, backend, checkpoints=checkpoints)
    with pytest.raises(StorageError):
        await agent.call_tool("replace_file", path=str(note), content="must not land\n")
    with pytest.raises(StorageError):
        await agent.call_tool("create_file", path=str(workspace / "new.txt"), content="must not land\n")
    assert note.read_bytes() == b"line one\r\nline two \xc3\xa9\n"
    assert sorted(os.listdir(workspace)) == ["note.txt"]


async def test_an_unrecorded_outcome_is_reported_uncertain_and_not_restored(workspace: Path, note: Path,
                                                                            backend) -> None:
    storage = FailingStorage(fail_from=2)  # the prepared record saves; recording the outcome fails
    agent = file_agent(workspace, backend, checkpoints=StorageCheckpointStore(storage))
    with pytest.raises(StorageError):
        await agent.call_tool("replace_file", path=str(note), content="landed\n")
    assert note.read_text() == "landed\n"

    storage.fail_from = 10**9
    [change_id] = storage.keys()
    preview = await agent.call_tool("preview_change", change_id=change_id)
    assert (preview["state"], preview["uncertain"]) == ("prepared", True)
    with pytest.raises(ResourceConflictError, match="inspection"):
        await agent.call_tool("restore_change", change_id=change_id)
    assert note.read_text() == "landed\n"


async def test_an_error_after_a_possible_write_leaves_an_uncertainty_marker(workspace: Path, note: Path,
                                                                            backend) -> None:
    storage = InMemoryStorage("file-changes")
    checkpoints = StorageCheckpointStore(storage)
    flaky = file_agent(workspace, WriteThenFailBackend(backend), checkpoints=checkpoints)
    with pytest.raises(ConnectionResetError):
        await flaky.call_tool("replace_file", path=str(note), content="maybe\n")

    agent = file_agent(workspace, backend, checkpoints=checkpoints)
    [change_id] = storage.keys()
    preview = await agent.call_tool("preview_change", change_id=change_id)
    assert (preview["state"], preview["uncertain"]) == ("uncertain", True)
    assert "ConnectionResetError" in preview["error"]
    assert preview["conflict"] is False  # the file holds the planned postimage: evidence, not a guess
    with pytest.raises(ResourceConflictError):
        await agent.call_tool("restore_change", change_id=change_id)
    assert note.read_text() == "maybe\n"


async def test_an_error_during_restore_leaves_an_uncertainty_marker(workspace: Path, note: Path,
                                                                    backend) -> None:
    storage = InMemoryStorage("file-changes")
    checkpoints = StorageCheckpointStore(storage)
    agent = file_agent(workspace, backend, checkpoints=checkpoints)
    change = await agent.call_tool("replace_file", path=str(note), content="v2\n")

    flaky = file_agent(workspace, WriteThenFailBackend(backend), checkpoints=checkpoints)
    with pytest.raises(ConnectionResetError):
        await flaky.call_tool("restore_change", change_id=change["change_id"])
    preview = await agent.call_tool("preview_change", change_id=change["change_id"])
    assert (preview["state"], preview["uncertain"]) == ("uncertain", True)


async def test_checkpoints_persist_in_sqlite_across_instances(workspace: Path, note: Path, backend,
                                                              tmp_path: Path) -> None:
    database = tmp_path / "recovery.db"
    first = SQLiteStorage(database, namespace="file-changes")
    agent = file_agent(workspace, backend, checkpoints=StorageCheckpointStore(first))
    change = await agent.call_tool("replace_file", path=str(note), content="v2\n")
    first.close()

    second = SQLiteStorage(database, namespace="file-changes")
    later = file_agent(workspace, backend, checkpoints=StorageCheckpointStore(second))
    await later.call_tool("restore_change", change_id=change["change_id"])
    second.close()
    assert note.read_bytes() == b"line one\r\nline two \xc3\xa9\n"
