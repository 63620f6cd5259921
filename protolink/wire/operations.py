"""The table of operations the host sends and the sandbox server performs: one row each.

A row pairs an :class:`~protolink.execution.operations.Operation` (its name is the RPC's, its
implementation is what the server's worker runs) with its messages and the converters both ways:

- ``request`` (host): the typed method's keyword arguments -> the request message;
- ``arguments`` (server): the request message -> the implementation's keyword arguments;
- ``response`` (server): the implementation's result -> the response message;
- ``answer`` (host): the response message and the keyword arguments -> the result, checked as
  data from an adversary (:mod:`.operation_convert`).

The host's ``SandboxBackend.perform`` and the server's handlers and workers are driven by it.
Adding an operation: the RPC in ``proto/`` (``make proto``), the implementation and its
``Operation`` in ``protolink.execution.operations``, and its row here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

from protolink.errors import SandboxProtocolError
from protolink.execution import operations as op
from protolink.execution.documents import DocumentLimits
from protolink.revisions import ResourceRevision

from . import convert, operation_convert
from ._pb import documents_pb2 as documents
from ._pb import workspace_pb2 as workspace

R = TypeVar("R")


@dataclass(frozen=True)
class WireOperation(Generic[R]):
    """One row of the table; see the module."""

    operation: op.Operation[R]
    request_type: type[Message]
    request: Callable[..., Message]
    arguments: Callable[[Any], dict[str, Any]]
    response: Callable[[R], Message]
    answer: Callable[..., R]

    @property
    def name(self) -> str:
        return self.operation.name

    def limits(self, request: Message) -> DocumentLimits | None:
        """A document operation's limits (its timeout among them), read from its request."""
        if not self.operation.document:
            return None
        return operation_convert.document_limits(request.limits)  # type: ignore[attr-defined]


def _fields(message: Message, *names: str) -> dict[str, Any]:
    return {name: getattr(message, name) for name in names}


def _roots(request: Any) -> list[str]:
    return list(request.roots)


def _replace_request(*, expected: ResourceRevision, data: bytes | None, mode: int | None,
                     roots: Sequence[str]) -> workspace.ReplaceFileRequest:
    return workspace.ReplaceFileRequest(expected=operation_convert.revision_message(expected), data=data, mode=mode,
                                        roots=roots)


def _replace_arguments(request: workspace.ReplaceFileRequest) -> dict[str, Any]:
    convert.require(request.HasField("expected"), "expected revision is required")
    return {"expected": operation_convert.revision(request.expected),
            "data": request.data if request.HasField("data") else None,
            "mode": request.mode if request.HasField("mode") else None, "roots": _roots(request)}


def _replace_answer(response: workspace.ReplaceFileResponse, *, expected: ResourceRevision,
                    **_: Any) -> ResourceRevision:
    written = operation_convert.revision(response.revision)
    if written.resource_id != expected.resource_id:
        raise SandboxProtocolError("the sandbox reported a write to another file")
    return written


ROWS: tuple[WireOperation[Any], ...] = (
    WireOperation(
        op.READ_TEXT, workspace.ReadTextRequest,
        request=lambda **a: workspace.ReadTextRequest(**a),
        arguments=lambda r: {**_fields(r, "path", "offset", "max_chars", "max_file_bytes"), "roots": _roots(r)},
        response=operation_convert.text_chunk_response,
        answer=lambda response, *, roots, max_chars, **_: operation_convert.text_chunk(response, roots=roots,
                                                                                       max_chars=max_chars),
    ),
    WireOperation(
        op.LIST_FILES, workspace.ListFilesRequest,
        request=lambda **a: workspace.ListFilesRequest(**a),
        arguments=lambda r: {**_fields(r, "path", "pattern", "recursive", "max_results"), "roots": _roots(r)},
        response=operation_convert.listing_response,
        answer=lambda response, *, roots, max_results, **_: operation_convert.listing(response, roots=roots,
                                                                                       max_results=max_results),
    ),
    WireOperation(
        op.SEARCH_FILES, workspace.SearchFilesRequest,
        request=lambda **a: workspace.SearchFilesRequest(**a),
        arguments=lambda r: {**_fields(r, "path", "query", "pattern", "case_sensitive", "max_results", "max_file_bytes"),
                             "roots": _roots(r)},
        response=operation_convert.search_response,
        answer=lambda response, *, roots, max_results, **_: operation_convert.search_result(
            response, roots=roots, max_results=max_results),
    ),
    WireOperation(
        op.SNAPSHOT_FILE, workspace.SnapshotFileRequest,
        request=lambda **a: workspace.SnapshotFileRequest(**a),
        arguments=lambda r: {**_fields(r, "path", "max_file_bytes"), "roots": _roots(r)},
        response=operation_convert.snapshot_response,
        answer=lambda response, *, roots, max_file_bytes, **_: operation_convert.snapshot(
            response, roots=roots, max_file_bytes=max_file_bytes),
    ),
    WireOperation(
        op.REPLACE_FILE, workspace.ReplaceFileRequest,
        request=_replace_request,
        arguments=_replace_arguments,
        response=lambda written: workspace.ReplaceFileResponse(revision=operation_convert.revision_message(written)),
        answer=_replace_answer,
    ),
    WireOperation(
        op.READ_DOCUMENT, documents.ReadDocumentRequest,
        request=lambda *, limits, **a: documents.ReadDocumentRequest(
            limits=operation_convert.limits_message(limits), **a),
        arguments=lambda r: {"path": r.path, "roots": _roots(r),
                             "limits": operation_convert.document_limits(r.limits)},
        response=operation_convert.extraction_response,
        answer=lambda response, *, roots, limits, **_: operation_convert.extraction(response, roots=roots,
                                                                                    limits=limits),
    ),
    WireOperation(
        op.SEARCH_DOCUMENT, documents.SearchDocumentRequest,
        request=lambda *, limits, **a: documents.SearchDocumentRequest(
            limits=operation_convert.limits_message(limits), **a),
        arguments=lambda r: {**_fields(r, "path", "query", "max_results"), "roots": _roots(r),
                             "limits": operation_convert.document_limits(r.limits)},
        response=operation_convert.document_search_response,
        answer=lambda response, *, roots, query, limits, max_results, **_: operation_convert.document_search(
            response, roots=roots, query=query, limits=limits, max_results=max_results),
    ),
)

WIRE_OPERATIONS: dict[str, WireOperation[Any]] = {row.name: row for row in ROWS}
