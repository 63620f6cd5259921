"""Conversions between wire messages and the plain types of :mod:`protolink.execution`.

Both ends use these functions: the host client to build requests and read answers, the
sandbox server to read requests and build answers. Decoding checks shapes and bounds and
raises ValueError; the client reports that as a protocol error (the answer is untrusted), the
server as ``INVALID_ARGUMENT`` (the request is malformed). The semantics themselves (path
rules, limits, extraction) stay in :mod:`protolink.execution`.

The document types load at the first document conversion: their module loads every format's
extractor, which the sandbox server's start (a cold sandbox's first command waits for it) and a
command never need.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from google.protobuf.message import DecodeError, Message

from protolink.execution.fsread import MAX_READ_CHARS, TextChunk
from protolink.execution.fssearch import (
    MAX_LINE_CHARS,
    FileEntry,
    Listing,
    SearchMatch,
    SearchResult,
)
from protolink.execution.output import Channel
from protolink.execution.process_types import ProcessSpec
from protolink.execution.resolve import Resolved
from protolink.revisions import ResourceRevision, ResourceSnapshot

from ._pb import documents_pb2 as documents
from ._pb import process_pb2 as process
from ._pb import workspace_pb2 as workspace

if TYPE_CHECKING:
    from protolink.execution.documents import (
        DocumentExtraction,
        DocumentLimits,
        DocumentMetadata,
        DocumentSearchResult,
        DocumentSection,
    )

M = TypeVar("M", bound=Message)

#: A process exit code or the negative number of the signal that ended it.
EXIT_CODES = range(-255, 256)
CHANNELS: dict[int, Channel] = {process.CHANNEL_STDOUT: "stdout", process.CHANNEL_STDERR: "stderr"}
CHANNEL_NUMBERS = {name: number for number, name in CHANNELS.items()}
ENTRY_TYPES = {
    workspace.ENTRY_TYPE_FILE: "file",
    workspace.ENTRY_TYPE_DIRECTORY: "directory",
    workspace.ENTRY_TYPE_OTHER: "other",
}
ENTRY_TYPE_NUMBERS = {name: number for number, name in ENTRY_TYPES.items()}


def parse(cls: type[M], data: bytes) -> M:
    """A ``cls`` message from ``data``; ValueError when the bytes are not one."""
    try:
        return cls.FromString(data)
    except DecodeError:
        raise ValueError(f"malformed {cls.DESCRIPTOR.name}") from None


def require(condition: bool, problem: str) -> None:
    """ValueError(``problem``) unless ``condition`` holds."""
    if not condition:
        raise ValueError(problem)


def beneath(path: str, roots: Iterable[str]) -> bool:
    """True when ``path`` is one of ``roots`` or lies beneath one, compared component-wise."""
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _count(value: int, what: str) -> int:
    require(value >= 0, f"{what} must not be negative")
    return value


def _finite(value: float, what: str) -> float:
    require(math.isfinite(value) and value >= 0, f"{what} must be a finite number >= 0")
    return value


# Processes ---------------------------------------------------------------------------------


def execute_request(spec: ProcessSpec, written: tuple[str, str] | None = None) -> process.ExecuteRequest:
    """The request for ``spec``; ``written`` is the (argv[0], cwd) it was resolved from, to check again."""
    resolved_from = process.CommandAsWritten(executable=written[0], cwd=written[1]) if written else None
    return process.ExecuteRequest(
        argv=spec.argv,
        cwd=spec.cwd,
        env=dict(spec.env),
        timeout_seconds=spec.timeout_seconds,
        max_output_bytes=spec.max_output_bytes,
        resolved_from=resolved_from,
        real_executable=spec.real_executable or "",
    )


def process_spec(request: process.ExecuteRequest) -> ProcessSpec:
    require(len(request.argv) > 0, "argv must contain at least the executable")
    require(request.cwd.startswith("/"), "cwd must be an absolute path")
    require(math.isfinite(request.timeout_seconds) and request.timeout_seconds > 0,
            "timeout_seconds must be a positive finite number")
    require(not request.real_executable or request.real_executable.startswith("/"),
            "real_executable must be an absolute path")
    return ProcessSpec(
        argv=tuple(request.argv),
        cwd=request.cwd,
        env=dict(request.env),
        timeout_seconds=request.timeout_seconds,
        max_output_bytes=_count(request.max_output_bytes, "max_output_bytes"),
        real_executable=request.real_executable or None,
    )


def command_as_written(request: process.ExecuteRequest) -> tuple[str, str] | None:
    """The (argv[0], cwd) the request's command was resolved from, when it asks for a check."""
    if not request.HasField("resolved_from"):
        return None
    written = request.resolved_from
    require(written.cwd.startswith("/"), "resolved_from.cwd must be an absolute path")
    return written.executable, written.cwd


def finished_facts(finished: process.Finished) -> dict[str, Any]:
    """The ProcessResult fields a Finished event carries (everything but the output)."""
    exit_code = finished.exit_code if finished.HasField("exit_code") else None
    require(exit_code is None or exit_code in EXIT_CODES, f"exit code {exit_code} is out of range")
    return {
        "exit_code": exit_code,
        "truncated": finished.truncated,
        "timed_out": finished.timed_out,
        "canceled": finished.canceled,
        "duration_seconds": _finite(finished.duration_seconds, "duration_seconds"),
    }


def resolve_request(argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> process.ResolveCommandRequest:
    return process.ResolveCommandRequest(argv=argv, cwd=cwd, env=dict(env))


def resolved_command(response: process.ResolveCommandResponse, argv: Sequence[str]) -> Resolved:
    """The resolved command; only argv[0] may differ from the request, and paths are absolute."""
    resolved = tuple(response.argv)
    require(len(resolved) == len(argv) and resolved[1:] == tuple(argv[1:]),
            "the resolved argv must differ from the request only in argv[0]")
    require(all(path.startswith("/") for path in (resolved[0], response.cwd, response.real_executable)),
            "the resolved executable, its real path and the directory must be absolute paths")
    return Resolved(resolved, response.cwd, response.real_executable)


def resolve_response(resolved: Resolved) -> process.ResolveCommandResponse:
    return process.ResolveCommandResponse(argv=resolved.argv, cwd=resolved.cwd,
                                          real_executable=resolved.real_executable)


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
        size = _count(item.size, "size") if item.HasField("size") else None
        items.append(FileEntry(path=item.path, type=ENTRY_TYPES[item.type], size=size))  # type: ignore[arg-type]
    return Listing(tuple(items), _count(response.scanned, "scanned"), _count(response.skipped, "skipped"),
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
    return SearchResult(tuple(items), _count(response.scanned, "scanned"), _count(response.skipped, "skipped"),
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
        size=_count(message.size, "size") if message.HasField("size") else None,
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
    from protolink.execution.documents import DocumentLimits

    return DocumentLimits(
        max_file_bytes=message.max_file_bytes,
        max_output_chars=message.max_output_chars,
        max_sections=message.max_sections,
        max_archive_bytes=message.max_archive_bytes,
        timeout_seconds=message.timeout_seconds,
    )


def extraction(response: documents.ReadDocumentResponse, *, roots: Sequence[str],
               limits: DocumentLimits) -> DocumentExtraction:
    from protolink.execution.documents import DocumentExtraction

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
    from protolink.execution.documents import SNIPPET_CHARS, DocumentMatch, DocumentSearchResult

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
    from protolink.execution.documents import DocumentMetadata

    require(beneath(message.path, roots), "the answer names a path outside the roots")
    require(0 <= message.input_bytes <= limits.max_file_bytes, "input_bytes is out of range")
    return DocumentMetadata(message.path, message.format, message.input_bytes)


def _metadata_message(metadata: DocumentMetadata) -> documents.DocumentMetadata:
    return documents.DocumentMetadata(path=metadata.path, format=metadata.format, input_bytes=metadata.input_bytes)


def _section(message: documents.DocumentSection) -> DocumentSection:
    from protolink.execution.documents import DocumentSection
    from protolink.execution.extract import MAX_COLUMNS

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
