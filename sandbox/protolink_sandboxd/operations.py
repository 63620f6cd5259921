"""The operations a worker process performs: request message in, response message out.

Each one decodes its request with :mod:`protolink.wire.convert`, calls the same blocking
implementation in :mod:`protolink.execution` that the host backend runs on a thread, and
encodes the result. No rule is restated here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from protolink.execution import documents, fsread, fssearch, fswrite
from protolink.wire import convert
from protolink.wire._pb import documents_pb2, workspace_pb2


@dataclass(frozen=True)
class Operation:
    """One RPC served by a worker: how to parse its request, how to answer it, what to call it."""

    request: type[Message]
    run: Callable[[Any], Message]
    what: str
    #: Document extraction: the request's own timeout applies.
    document: bool = False


def _read_text(request: workspace_pb2.ReadTextRequest) -> workspace_pb2.ReadTextResponse:
    chunk = fsread.read_text(request.path, list(request.roots), offset=request.offset,
                             max_chars=request.max_chars, max_file_bytes=request.max_file_bytes)
    return convert.text_chunk_response(chunk)


def _list_files(request: workspace_pb2.ListFilesRequest) -> workspace_pb2.ListFilesResponse:
    result = fssearch.list_files(request.path, list(request.roots), pattern=request.pattern,
                                 recursive=request.recursive, max_results=request.max_results)
    return convert.listing_response(result)


def _search_files(request: workspace_pb2.SearchFilesRequest) -> workspace_pb2.SearchFilesResponse:
    result = fssearch.search_files(request.path, list(request.roots), query=request.query, pattern=request.pattern,
                                   case_sensitive=request.case_sensitive, max_results=request.max_results,
                                   max_file_bytes=request.max_file_bytes)
    return convert.search_response(result)


def _snapshot_file(request: workspace_pb2.SnapshotFileRequest) -> workspace_pb2.SnapshotFileResponse:
    result = fswrite.snapshot_file(request.path, list(request.roots), max_file_bytes=request.max_file_bytes)
    return convert.snapshot_response(result)


def _replace_file(request: workspace_pb2.ReplaceFileRequest) -> workspace_pb2.ReplaceFileResponse:
    convert.require(request.HasField("expected"), "expected revision is required")
    written = fswrite.replace_file(
        convert.revision(request.expected),
        request.data if request.HasField("data") else None,
        request.mode if request.HasField("mode") else None,
        list(request.roots),
    )
    return workspace_pb2.ReplaceFileResponse(revision=convert.revision_message(written))


def _read_document(request: documents_pb2.ReadDocumentRequest) -> documents_pb2.ReadDocumentResponse:
    limits = convert.document_limits(request.limits)
    return convert.extraction_response(documents.extract_document(request.path, list(request.roots), limits))


def _search_document(request: documents_pb2.SearchDocumentRequest) -> documents_pb2.SearchDocumentResponse:
    limits = convert.document_limits(request.limits)
    result = documents.search_document_file(request.path, request.query, list(request.roots), limits,
                                            request.max_results)
    return convert.document_search_response(result)


OPERATIONS: dict[str, Operation] = {
    "ReadText": Operation(workspace_pb2.ReadTextRequest, _read_text, "reading the file"),
    "ListFiles": Operation(workspace_pb2.ListFilesRequest, _list_files, "listing"),
    "SearchFiles": Operation(workspace_pb2.SearchFilesRequest, _search_files, "the file search"),
    "SnapshotFile": Operation(workspace_pb2.SnapshotFileRequest, _snapshot_file, "the file snapshot"),
    "ReplaceFile": Operation(workspace_pb2.ReplaceFileRequest, _replace_file, "the file replacement"),
    "ReadDocument": Operation(documents_pb2.ReadDocumentRequest, _read_document, "document extraction", document=True),
    "SearchDocument": Operation(documents_pb2.SearchDocumentRequest, _search_document, "document extraction",
                                document=True),
}
