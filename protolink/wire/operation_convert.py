"""Conversions of the workspace and document operations' messages (:mod:`.operations`), by the
rules of :mod:`.convert`: decoding checks shapes and bounds and raises ValueError.

Only the operations' table imports this module: the sandbox server loads it at the first file
call, not at its start (the document types load every format's extractor).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

from protolink.execution.documents import (
    SNIPPET_CHARS,
    DocumentExtraction,
    DocumentLimits,
    DocumentMatch,
    DocumentMetadata,
    DocumentSearchResult,
    DocumentSection,
)
from protolink.execution.extract import MAX_COLUMNS
from protolink.execution.fsread import MAX_READ_CHARS, TextChunk
from protolink.execution.fssearch import (
    MAX_LINE_CHARS,
    FileEntry,
    Listing,
    SearchMatch,
    SearchResult,
)
from protolink.revisions import ResourceRevision, ResourceSnapshot

from ._pb import documents_pb2 as documents
from ._pb import workspace_pb2 as workspace
from .convert import beneath, count, require

ENTRY_TYPES = {
    workspace.ENTRY_TYPE_FILE: "file",
    workspace.ENTRY_TYPE_DIRECTORY: "directory",
    workspace.ENTRY_TYPE_OTHER: "other",
}
ENTRY_TYPE_NUMBERS = {name: number for number, name in ENTRY_TYPES.items()}


# Workspace ---------------------------------------------------------------------------------


def text_chunk(response: workspace.ReadTextResponse, *, roots: Sequence[str], max_chars: int) -> TextChunk:
    require(beneath(response.path, roots), "the answer names a path outside the roots")
    require(len(response.content) <= min(max_chars, MAX_READ_CHARS), "the answer holds more characters than asked")
    next_offset = response.next_offset if response.HasField("next_offset") else None
    require(next_offset is None or next_offset >= 0, "next_offset must not be negative")
    return TextChunk(path=response.path, content=response.content, next_offset=next_offset)


def text_chunk_response(chunk: TextChunk) -> workspace.ReadTextResponse:
    return workspace.ReadTextResponse(path=chunk.path, content=chunk.content, next_offset=chunk.next_offset)


def listing(response: workspace.ListFilesResponse, *, roots: Sequence[str], max_results: int) -> Listing:
    require(len(response.items) <= max_results, "the answer holds more entries than asked")
    items = []
    for item in response.items:
        require(item.type in ENTRY_TYPES, f"unknown entry type {item.type}")
        require(beneath(item.path, roots), "the answer names a path outside the roots")
        size = count(item.size, "size") if item.HasField("size") else None
        items.append(FileEntry(path=item.path, type=ENTRY_TYPES[item.type], size=size))  # type: ignore[arg-type]
    return Listing(tuple(items), count(response.scanned, "scanned"), count(response.skipped, "skipped"),
                   response.truncated)


def listing_response(result: Listing) -> workspace.ListFilesResponse:
    return workspace.ListFilesResponse(
        items=[workspace.FileEntry(path=item.path, type=ENTRY_TYPE_NUMBERS[item.type], size=item.size)
               for item in result.items],
        scanned=result.scanned, skipped=result.skipped, truncated=result.truncated,
    )


def search_result(response: workspace.SearchFilesResponse, *, roots: Sequence[str], max_results: int) -> SearchResult:
    require(len(response.items) <= max_results, "the answer holds more matches than asked")
    items = []
    for item in response.items:
        require(beneath(item.path, roots), "the answer names a path outside the roots")
        require(item.line >= 1, "line numbers are one-based")
        require(len(item.text) <= MAX_LINE_CHARS, "a matching line is longer than the limit")
        items.append(SearchMatch(item.path, item.line, item.text, item.text_truncated))
    return SearchResult(tuple(items), count(response.scanned, "scanned"), count(response.skipped, "skipped"),
                        response.truncated)


def search_response(result: SearchResult) -> workspace.SearchFilesResponse:
    return workspace.SearchFilesResponse(
        items=[workspace.SearchMatch(path=item.path, line=item.line, text=item.text,
                                     text_truncated=item.text_truncated) for item in result.items],
        scanned=result.scanned, skipped=result.skipped, truncated=result.truncated,
    )


def revision_message(revision: ResourceRevision) -> workspace.Revision:
    message = workspace.Revision(resource_id=revision.resource_id, exists=revision.exists, size=revision.size,
                                 sha256=revision.sha256, mode=revision.mode)
    if revision.identity is not None:
        message.identity.CopyFrom(_identity_message(revision.identity))
    if revision.parent_identity is not None:
        message.parent_identity.CopyFrom(_identity_message(revision.parent_identity))
    return message


def revision(message: workspace.Revision) -> ResourceRevision:
    require(message.resource_id.startswith("/"), "a revision names an absolute path")
    sha256 = message.sha256 if message.HasField("sha256") else None
    require(sha256 is None or (len(sha256) == 64 and all(c in "0123456789abcdef" for c in sha256)),
            "sha256 must be 64 lowercase hex digits")
    mode = message.mode if message.HasField("mode") else None
    require(mode is None or 0 <= mode <= 0o7777, "mode must be permission bits")
    return ResourceRevision(
        resource_id=message.resource_id,
        exists=message.exists,
        size=count(message.size, "size") if message.HasField("size") else None,
        sha256=sha256,
        mode=mode,
        identity=_identity(message.identity) if message.HasField("identity") else None,
        parent_identity=_identity(message.parent_identity) if message.HasField("parent_identity") else None,
    )


def snapshot(response: workspace.SnapshotFileResponse, *, roots: Sequence[str], max_file_bytes: int) -> ResourceSnapshot:
    """The snapshot, checked to be lossless: the bytes agree with the revision's size and hash."""
    require(response.HasField("revision"), "the answer has no revision")
    observed = revision(response.revision)
    data = response.data if response.HasField("data") else None
    require(beneath(observed.resource_id, roots), "the answer names a path outside the roots")
    require(observed.exists == (data is not None), "the snapshot's data does not match its existence")
    if data is not None:
        require(len(data) <= max_file_bytes, "the snapshot is larger than the limit")
        require(observed.size == len(data) and observed.sha256 == hashlib.sha256(data).hexdigest(),
                "the snapshot's bytes do not match its size and hash")
    return ResourceSnapshot(observed, data)


def snapshot_response(result: ResourceSnapshot) -> workspace.SnapshotFileResponse:
    return workspace.SnapshotFileResponse(revision=revision_message(result.revision), data=result.data)


def _identity_message(identity: tuple[int, int]) -> workspace.Identity:
    return workspace.Identity(device=identity[0], inode=identity[1])


def _identity(message: workspace.Identity) -> tuple[int, int]:
    return (message.device, message.inode)


# Documents ---------------------------------------------------------------------------------


def limits_message(limits: DocumentLimits) -> documents.DocumentLimits:
    return documents.DocumentLimits(**limits.to_dict())


def document_limits(message: documents.DocumentLimits) -> DocumentLimits:
    return DocumentLimits(
        max_file_bytes=message.max_file_bytes,
        max_output_chars=message.max_output_chars,
        max_sections=message.max_sections,
        max_archive_bytes=message.max_archive_bytes,
        timeout_seconds=message.timeout_seconds,
    )


def extraction(response: documents.ReadDocumentResponse, *, roots: Sequence[str],
               limits: DocumentLimits) -> DocumentExtraction:
    require(len(response.sections) <= limits.max_sections, "the answer holds more sections than the limit")
    sections = tuple(_section(item) for item in response.sections)
    chars = sum(len(s.text) if s.text is not None else sum(map(len, s.cells or ())) for s in sections)
    require(chars <= limits.max_output_chars, "the answer holds more characters than the limit")
    return DocumentExtraction(_metadata(response.metadata, roots, limits), sections, response.truncated)


def extraction_response(result: DocumentExtraction) -> documents.ReadDocumentResponse:
    return documents.ReadDocumentResponse(
        metadata=_metadata_message(result.metadata),
        sections=[_section_message(section) for section in result.sections],
        truncated=result.truncated,
    )


def document_search(response: documents.SearchDocumentResponse, *, roots: Sequence[str], query: str,
                    limits: DocumentLimits, max_results: int) -> DocumentSearchResult:
    require(response.query == query, "the answer is for another query")
    require(len(response.matches) <= max_results, "the answer holds more matches than asked")
    matches = []
    for item in response.matches:
        require(len(item.snippet) <= SNIPPET_CHARS, "a snippet is longer than the limit")
        matches.append(DocumentMatch(_location(item.location), item.snippet))
    return DocumentSearchResult(_metadata(response.metadata, roots, limits), query, tuple(matches), response.truncated)


def document_search_response(result: DocumentSearchResult) -> documents.SearchDocumentResponse:
    return documents.SearchDocumentResponse(
        metadata=_metadata_message(result.metadata),
        query=result.query,
        matches=[documents.DocumentMatch(location=_location_message(m.location), snippet=m.snippet)
                 for m in result.matches],
        truncated=result.truncated,
    )


def _metadata(message: documents.DocumentMetadata, roots: Sequence[str], limits: DocumentLimits) -> DocumentMetadata:
    require(beneath(message.path, roots), "the answer names a path outside the roots")
    require(0 <= message.input_bytes <= limits.max_file_bytes, "input_bytes is out of range")
    return DocumentMetadata(message.path, message.format, message.input_bytes)


def _metadata_message(metadata: DocumentMetadata) -> documents.DocumentMetadata:
    return documents.DocumentMetadata(path=metadata.path, format=metadata.format, input_bytes=metadata.input_bytes)


def _section(message: documents.DocumentSection) -> DocumentSection:
    content = message.WhichOneof("content")
    require(content is not None, "a section holds neither text nor cells")
    if content == "text":
        return DocumentSection(_location(message.location), text=message.text)
    require(len(message.row.cells) <= MAX_COLUMNS, "a row holds more cells than the limit")
    return DocumentSection(_location(message.location), cells=tuple(message.row.cells))


def _section_message(section: DocumentSection) -> documents.DocumentSection:
    message = documents.DocumentSection(location=_location_message(section.location))
    if section.text is not None:
        message.text = section.text
    else:
        message.row.cells.extend(section.cells or ())
    return message


def _location(parts: Iterable[documents.LocationPart]) -> dict[str, int | str]:
    location: dict[str, int | str] = {}
    for part in parts:
        value = part.WhichOneof("value")
        require(value is not None and part.name not in location, "a location part is empty or repeated")
        location[part.name] = part.number if value == "number" else part.text
    return location


def _location_message(location: Mapping[str, int | str]) -> list[documents.LocationPart]:
    return [
        documents.LocationPart(name=name, number=value) if isinstance(value, int)
        else documents.LocationPart(name=name, text=value)
        for name, value in location.items()
    ]
