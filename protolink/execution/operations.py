"""The workspace and document operations, each defined once: its name, its blocking
implementation, and the typed method the tools call.

A backend supplies one method, :meth:`Operations.perform`, and gets every typed method from
:class:`Operations`: the host runs the implementation on a worker thread
(:class:`LocalOperations`), a sandbox sends it to its server (``protolink.wire.operations``
pairs each operation with its messages), which runs the same implementation in a supervised
worker. Adding an operation: write its implementation, add its :class:`Operation` here with a
typed method on :class:`Operations`, and its row in ``protolink.wire.operations``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from protolink.revisions import ResourceRevision, ResourceSnapshot

from . import documents, fsread, fssearch, fswrite
from .documents import (
    DocumentExtraction,
    DocumentLimits,
    DocumentSearchResult,
    check_search,
)
from .fsread import TextChunk
from .fssearch import Listing, SearchResult

R = TypeVar("R")


@dataclass(frozen=True)
class Operation(Generic[R]):
    """One operation: ``name`` (the sandbox's RPC too), the blocking implementation ``run``
    called with the typed method's keyword arguments, and ``what`` to call it in errors. A
    ``document`` operation runs a parser: its ``limits`` bound it (timeout included)."""

    name: str
    run: Callable[..., R]
    what: str
    document: bool = False


READ_TEXT = Operation("ReadText", fsread.read_text, "reading the file")
LIST_FILES = Operation("ListFiles", fssearch.list_files, "listing")
SEARCH_FILES = Operation("SearchFiles", fssearch.search_files, "the file search")
SNAPSHOT_FILE = Operation("SnapshotFile", fswrite.snapshot_file, "the file snapshot")
REPLACE_FILE = Operation("ReplaceFile", fswrite.replace_file, "the file replacement")
READ_DOCUMENT = Operation("ReadDocument", documents.extract_document, "document extraction", document=True)
SEARCH_DOCUMENT = Operation("SearchDocument", documents.search_document_file, "document extraction", document=True)

OPERATIONS: dict[str, Operation[Any]] = {
    operation.name: operation
    for operation in (READ_TEXT, LIST_FILES, SEARCH_FILES, SNAPSHOT_FILE, REPLACE_FILE, READ_DOCUMENT,
                      SEARCH_DOCUMENT)
}


class Operations:
    """The typed methods of the WorkspaceBackend and DocumentBackend protocols, on top of
    :meth:`perform`, which each backend supplies."""

    async def perform(self, operation: Operation[R], **arguments: Any) -> R:
        """Run ``operation`` with ``arguments`` wherever this backend's files are."""
        raise NotImplementedError

    async def read_text(self, path: str, *, roots: Sequence[str], offset: int, max_chars: int,
                        max_file_bytes: int) -> TextChunk:
        return await self.perform(READ_TEXT, path=path, roots=roots, offset=offset, max_chars=max_chars,
                                  max_file_bytes=max_file_bytes)

    async def list_files(self, path: str, *, roots: Sequence[str], pattern: str, recursive: bool,
                         max_results: int) -> Listing:
        return await self.perform(LIST_FILES, path=path, roots=roots, pattern=pattern, recursive=recursive,
                                  max_results=max_results)

    async def search_files(self, path: str, *, roots: Sequence[str], query: str, pattern: str,
                           case_sensitive: bool, max_results: int, max_file_bytes: int) -> SearchResult:
        return await self.perform(SEARCH_FILES, path=path, roots=roots, query=query, pattern=pattern,
                                  case_sensitive=case_sensitive, max_results=max_results,
                                  max_file_bytes=max_file_bytes)

    async def snapshot_file(self, path: str, *, roots: Sequence[str], max_file_bytes: int) -> ResourceSnapshot:
        return await self.perform(SNAPSHOT_FILE, path=path, roots=roots, max_file_bytes=max_file_bytes)

    async def replace_file(self, expected: ResourceRevision, data: bytes | None, mode: int | None, *,
                           roots: Sequence[str]) -> ResourceRevision:
        return await self.perform(REPLACE_FILE, expected=expected, data=data, mode=mode, roots=roots)

    async def read_document(self, path: str, *, roots: Sequence[str], limits: DocumentLimits) -> DocumentExtraction:
        return await self.perform(READ_DOCUMENT, path=path, roots=roots, limits=limits)

    async def search_document(self, path: str, query: str, *, roots: Sequence[str], limits: DocumentLimits,
                              max_results: int) -> DocumentSearchResult:
        check_search(query, max_results)
        return await self.perform(SEARCH_DOCUMENT, path=path, query=query, roots=roots, limits=limits,
                                  max_results=max_results)


class LocalOperations(Operations):
    """Operations on this host, each on a worker thread. Cancellation stops waiting; the bounded
    work in the thread may finish afterwards. A document operation's timeout is a deadline on
    the work itself: a parser cannot be stopped, so a result that comes after it is refused."""

    async def perform(self, operation: Operation[R], **arguments: Any) -> R:
        if not operation.document:
            return await asyncio.to_thread(operation.run, **arguments)
        timeout = arguments["limits"].timeout_seconds
        deadline = time.monotonic() + timeout

        def timed() -> tuple[R, float]:
            return operation.run(**arguments), time.monotonic()

        try:
            # The deadline applies to the work: a result that was ready only after it (and
            # reached the event loop in the same moment as the timer) is a timeout too.
            result, finished = await asyncio.wait_for(asyncio.to_thread(timed), timeout)
            if finished <= deadline:
                return result
        except TimeoutError:
            pass
        raise TimeoutError(f"{operation.what} did not finish within {timeout} seconds (the worker may still run)")
