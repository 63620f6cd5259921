"""Agents carrying filesystem_tools for the behavioural suites, with a scriptable approver."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from protolink import (
    Agent,
    AgentCard,
    ApprovalRequest,
    CapabilityPolicy,
    RunContext,
    StorageCheckpointStore,
)
from protolink.core.resources import CheckpointStore
from protolink.storage import InMemoryStorage
from protolink.tools import filesystem_tools


class Approver:
    """Approves every request after recording it and running ``before_approving`` (if set).

    ``before_approving`` is where a test changes the file system between approval and apply.
    """

    def __init__(self) -> None:
        self.requests: list[ApprovalRequest] = []
        self.before_approving: Callable[[], None] | None = None

    async def __call__(self, request: ApprovalRequest, run: RunContext) -> bool:
        self.requests.append(request)
        if self.before_approving is not None:
            self.before_approving()
        return True

    def artifact(self, kind: str) -> Any:
        """The content of the last request's artifact of ``kind``."""
        return next(a.content for a in self.requests[-1].artifacts if a.kind == kind)


def file_agent(workspace: Path, backend: Any, *, checkpoints: CheckpointStore | None = None,
               approver: Approver | None = None, roots: Sequence[Path] | None = None,
               writable: bool = True, **options: Any) -> Agent:
    """An agent whose writes and restorations need approval; writes enabled by default."""
    if writable and checkpoints is None:
        checkpoints = StorageCheckpointStore(InMemoryStorage("file-changes"))
    policy = CapabilityPolicy({"filesystem.write": "require_approval", "filesystem.restore": "require_approval"})
    agent = Agent(AgentCard(name="files"), policy=policy, approval_handler=approver or Approver())
    for tool in filesystem_tools(roots=list(roots or [workspace]), checkpoints=checkpoints, backend=backend,
                                 **options):
        agent.add_tool(tool)
    return agent
