"""LocalExecutionBackend: processes, workspace files and documents on this host (not a sandbox)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .local_processes import HostLauncher, LocalProcesses
from .operations import LocalOperations
from .process_types import Emitter, ProcessResult, ProcessSpec
from .resolve import Resolved, resolve_command


class LocalExecutionBackend(LocalOperations):
    """The first-party host backend: a :class:`~protolink.execution.backends.Backend` whose
    every operation runs on this host, through the shared implementations in
    :mod:`protolink.execution` (which the sandbox server calls inside a container)."""

    boundary = "host"

    def __init__(self) -> None:
        self._launcher = HostLauncher()
        self._processes = LocalProcesses(self._launcher)

    async def resolve_command(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> Resolved:
        """Resolve argv[0], the file it runs and the working directory on this host."""
        return await self._launcher.resolve_command(argv, cwd, env)

    def resolve_now(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> Resolved:
        """Resolve on this host at once (blocking: a few file system calls)."""
        return resolve_command(argv, cwd, env)

    async def execute(self, spec: ProcessSpec, execution: Emitter) -> ProcessResult:
        """Run ``spec`` on this host; see :mod:`protolink.execution.local_processes`."""
        return await self._processes.execute(spec, execution)
