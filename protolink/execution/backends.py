"""The backend types, by what each does, and the one that unites them.

- :class:`ExecutionBackend`: the spec's interface for running processes (``boundary`` and
  ``execute``); a backend written against it alone is accepted everywhere.
- :class:`ProcessBackend`: an ExecutionBackend that also resolves commands where it runs them.
- :class:`WorkspaceBackend`: file operations beneath explicit roots, where the files are.
- :class:`DocumentBackend`: document extraction beneath explicit roots, where the files are.
- :class:`Backend`: all three; what the host (:class:`~protolink.execution.local.LocalExecutionBackend`)
  and a sandbox (``SandboxBackend``) are, and what every machine-touching tool accepts.

Tools never ask which class a backend is: :func:`process_backend` gives any ExecutionBackend
the ProcessBackend face, resolving by the host's rules where the backend does not resolve.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from protolink.revisions import ResourceRevision, ResourceSnapshot

from .documents import DocumentExtraction, DocumentLimits, DocumentSearchResult
from .fsread import TextChunk
from .fssearch import Listing, SearchResult
from .process_types import Emitter, ProcessResult, ProcessSpec
from .resolve import Resolved, resolve_command


@runtime_checkable
class ExecutionBackend(Protocol):
    """Where processes run. ``boundary`` names it in previews (``"host"``, ``"sandbox:..."``).

    ``execute`` honors the spec exactly, emits ``process.output`` events through
    ``execution.emit`` as output arrives, and returns a :class:`ProcessResult`; on
    cancellation it kills and reaps the process group, then raises ProcessCancelledError.
    """

    boundary: str

    async def execute(self, spec: ProcessSpec, execution: Emitter) -> ProcessResult: ...


@runtime_checkable
class ProcessBackend(ExecutionBackend, Protocol):
    """An ExecutionBackend that resolves commands by the rules of
    :mod:`protolink.execution.resolve` where it runs them.

    ``resolve_now`` answers at once where resolving needs no round trip (this host), so that
    tools configured at registration can resolve then; elsewhere it returns None and the
    command is resolved when each call is prepared.
    """

    async def resolve_command(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> Resolved: ...

    def resolve_now(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> Resolved | None: ...


@runtime_checkable
class WorkspaceBackend(Protocol):
    """File operations beneath explicit roots, wherever the files are.

    Paths must be absolute and written beneath one of ``roots`` (canonical absolute
    directories), as :func:`~protolink.execution.paths.canonical_target` spells them: callers
    resolve aliases where the roots were registered, so every backend sees the same real
    paths. ``..``, symlinks beneath roots and special files are rejected (ValueError),
    missing targets raise FileNotFoundError, and a conditional replacement whose target
    changed raises ResourceConflictError without writing.
    """

    async def read_text(self, path: str, *, roots: Sequence[str], offset: int, max_chars: int,
                        max_file_bytes: int) -> TextChunk: ...

    async def list_files(self, path: str, *, roots: Sequence[str], pattern: str, recursive: bool,
                         max_results: int) -> Listing: ...

    async def search_files(self, path: str, *, roots: Sequence[str], query: str, pattern: str,
                           case_sensitive: bool, max_results: int, max_file_bytes: int) -> SearchResult: ...

    async def snapshot_file(self, path: str, *, roots: Sequence[str], max_file_bytes: int) -> ResourceSnapshot: ...

    async def replace_file(self, expected: ResourceRevision, data: bytes | None, mode: int | None, *,
                           roots: Sequence[str]) -> ResourceRevision: ...


@runtime_checkable
class DocumentBackend(Protocol):
    """Where documents are read. Both methods apply the filesystem path rules to ``path`` and
    ``roots`` (real spellings, as for WorkspaceBackend), the extraction ``limits``, and stop
    waiting after ``limits.timeout_seconds`` (TimeoutError). Unreadable or unsupported
    documents raise ValueError (DocumentError)."""

    async def read_document(self, path: str, *, roots: Sequence[str], limits: DocumentLimits) -> DocumentExtraction: ...

    async def search_document(self, path: str, query: str, *, roots: Sequence[str], limits: DocumentLimits,
                              max_results: int) -> DocumentSearchResult: ...


@runtime_checkable
class Backend(ProcessBackend, WorkspaceBackend, DocumentBackend, Protocol):
    """Processes, files and documents in one place: the host, or a sandbox."""


def process_backend(backend: ExecutionBackend) -> ProcessBackend:
    """``backend`` as a ProcessBackend; one that does not resolve commands gets the host's rules
    (resolved when each call is prepared, on a thread)."""
    return backend if isinstance(backend, ProcessBackend) else _ResolvedOnHost(backend)


class _ResolvedOnHost:
    """An ExecutionBackend of the spec's minimal shape, resolving by the host's rules."""

    def __init__(self, backend: ExecutionBackend) -> None:
        self.boundary = backend.boundary
        self._backend = backend

    async def execute(self, spec: ProcessSpec, execution: Emitter) -> ProcessResult:
        return await self._backend.execute(spec, execution)

    async def resolve_command(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> Resolved:
        return await asyncio.to_thread(resolve_command, argv, cwd, env)

    def resolve_now(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> Resolved | None:
        return None
