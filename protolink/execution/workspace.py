"""Workspace file operations: the WorkspaceBackend protocol and its host implementation.

The operations that must run next to the files (descriptor-based reads, bounded listing and
search, snapshots, conditional atomic replacement) take plain arguments, the roots among
them, and return plain frozen dataclasses. Every path and root rule is applied inside the
synchronous implementations in :mod:`~protolink.execution.fsread`,
:mod:`~protolink.execution.fssearch` and :mod:`~protolink.execution.fswrite`, which the
sandbox server calls too. Recovery checkpoints are not kept here: they stay with the caller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from protolink.revisions import ResourceRevision, ResourceSnapshot

from . import fsread, fssearch, fswrite
from .fsread import TextChunk
from .fssearch import FileEntry, Listing, SearchMatch, SearchResult

__all__ = [
    "FileEntry", "Listing", "LocalWorkspace", "SearchMatch", "SearchResult", "TextChunk", "WorkspaceBackend",
]


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


class LocalWorkspace:
    """WorkspaceBackend on this host: each operation runs on a worker thread.

    Cancellation stops waiting; the bounded work in the thread may finish afterwards.
    """

    async def read_text(self, path: str, *, roots: Sequence[str], offset: int, max_chars: int,
                        max_file_bytes: int) -> TextChunk:
        return await asyncio.to_thread(fsread.read_text, path, roots, offset=offset, max_chars=max_chars,
                                       max_file_bytes=max_file_bytes)

    async def list_files(self, path: str, *, roots: Sequence[str], pattern: str, recursive: bool,
                         max_results: int) -> Listing:
        return await asyncio.to_thread(fssearch.list_files, path, roots, pattern=pattern, recursive=recursive,
                                       max_results=max_results)

    async def search_files(self, path: str, *, roots: Sequence[str], query: str, pattern: str,
                           case_sensitive: bool, max_results: int, max_file_bytes: int) -> SearchResult:
        return await asyncio.to_thread(fssearch.search_files, path, roots, query=query, pattern=pattern,
                                       case_sensitive=case_sensitive, max_results=max_results,
                                       max_file_bytes=max_file_bytes)

    async def snapshot_file(self, path: str, *, roots: Sequence[str], max_file_bytes: int) -> ResourceSnapshot:
        return await asyncio.to_thread(fswrite.snapshot_file, path, roots, max_file_bytes=max_file_bytes)

    async def replace_file(self, expected: ResourceRevision, data: bytes | None, mode: int | None, *,
                           roots: Sequence[str]) -> ResourceRevision:
        return await asyncio.to_thread(fswrite.replace_file, expected, data, mode, roots)
