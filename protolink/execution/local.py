"""LocalExecutionBackend: processes, workspace files and documents on this host (not a sandbox)."""

from __future__ import annotations

from .documents import LocalDocuments
from .processes import LocalProcesses
from .workspace import LocalWorkspace


class LocalExecutionBackend(LocalProcesses, LocalWorkspace, LocalDocuments):
    """The first-party host backend: every operation runs in this process's host.

    It implements the ExecutionBackend, WorkspaceBackend and DocumentBackend protocols by
    calling the shared implementations in :mod:`protolink.execution`; the sandbox server calls
    the same implementations inside a container.
    """

    boundary = "host"
