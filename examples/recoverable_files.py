"""Recoverable file writes: one restoration that succeeds and one that conflicts.

Runs offline in a temporary directory::

    python examples/recoverable_files.py

Writes and restorations require approval; this demonstration approves automatically and prints
each preview it is shown. Checkpoints live in SQLite outside the writable root.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from protolink import (
    Agent,
    AgentCard,
    ApprovalRequest,
    CapabilityPolicy,
    ResourceConflictError,
    RunContext,
    StorageCheckpointStore,
)
from protolink.storage import SQLiteStorage
from protolink.tools import filesystem_tools


async def approve_and_show(request: ApprovalRequest, run: RunContext) -> bool:
    print(f"\napproval requested for {request.action.tool}:")
    for artifact in request.artifacts:
        if artifact.kind == "diff":
            print(artifact.content, end="")
    return True


async def main() -> None:
    with tempfile.TemporaryDirectory() as temporary:
        workspace = Path(temporary, "workspace").resolve()
        workspace.mkdir()
        note = workspace / "note.txt"
        note.write_text("first draft\n")
        storage = SQLiteStorage(Path(temporary, "recovery.db"), namespace="file-changes")

        agent = Agent(
            AgentCard(name="editor"),
            policy=CapabilityPolicy({
                "filesystem.read": "allow",
                "filesystem.write": "require_approval",
                "filesystem.restore": "require_approval",
            }, default_effect="deny"),
            approval_handler=approve_and_show,
        )
        for tool in filesystem_tools(roots=[workspace], checkpoints=StorageCheckpointStore(storage)):
            agent.add_tool(tool)

        # 1. A change, its restoration preview, and a successful restoration.
        change = await agent.call_tool("edit_file", path=str(note), old_text="first", new_text="second")
        print(f"applied {change['change_id']}: {note.read_text()!r}")
        preview = await agent.call_tool("preview_change", change_id=change["change_id"])
        print(f"preview: state={preview['state']} conflict={preview['conflict']} uncertain={preview['uncertain']}")
        restored = await agent.call_tool("restore_change", change_id=change["change_id"])
        print(f"{restored['state']}: {note.read_text()!r}")

        # 2. A change that someone else edits afterwards: restoring it would lose their work.
        change = await agent.call_tool("replace_file", path=str(note), content="agent's version\n")
        note.write_text("a human edited this afterwards\n")
        preview = await agent.call_tool("preview_change", change_id=change["change_id"])
        print(f"\npreview: state={preview['state']} conflict={preview['conflict']}")
        try:
            await agent.call_tool("restore_change", change_id=change["change_id"])
        except ResourceConflictError as error:
            print(f"restoration refused: {error}")
        print(f"file kept: {note.read_text()!r}")
        storage.close()


if __name__ == "__main__":
    asyncio.run(main())
