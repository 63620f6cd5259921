"""Wire conversions: faithful both ways, and answers that do not fit their shape are refused."""

from __future__ import annotations

import hashlib
import math

import pytest

from protolink.execution.documents import (
    DocumentExtraction,
    DocumentLimits,
    DocumentMatch,
    DocumentMetadata,
    DocumentSearchResult,
    DocumentSection,
)
from protolink.execution.fsread import TextChunk
from protolink.execution.fssearch import FileEntry, Listing, SearchMatch, SearchResult
from protolink.execution.process_types import ProcessSpec
from protolink.execution.resolve import Resolved
from protolink.revisions import ResourceRevision, ResourceSnapshot
from protolink.wire import convert, operation_convert
from protolink.wire._pb import documents_pb2, process_pb2, workspace_pb2

ROOTS = ["/ws"]
DATA = b"hello\n"
REVISION = ResourceRevision("/ws/a.txt", True, size=len(DATA), sha256=hashlib.sha256(DATA).hexdigest(), mode=0o644,
                            identity=(2**63 + 5, 77), parent_identity=(2**63 + 5, 2))
LIMITS = DocumentLimits(max_sections=3, max_output_chars=50)


def test_process_spec_roundtrip():
    spec = ProcessSpec(("/bin/echo", "hé", ""), "/ws", {"A": "1", "EMPTY": ""}, 2.5, 4096)
    assert convert.process_spec(convert.execute_request(spec)) == spec


@pytest.mark.parametrize("change, problem", [
    ({"argv": []}, "argv"),
    ({"cwd": "relative"}, "cwd"),
    ({"timeout_seconds": 0}, "timeout"),
    ({"timeout_seconds": math.inf}, "timeout"),
    ({"timeout_seconds": math.nan}, "timeout"),
    ({"max_output_bytes": -1}, "max_output_bytes"),
])
def test_malformed_process_requests_are_refused(change, problem):
    fields = {"argv": ["/bin/true"], "cwd": "/ws", "timeout_seconds": 1.0, "max_output_bytes": 10, **change}
    with pytest.raises(ValueError, match=problem):
        convert.process_spec(process_pb2.ExecuteRequest(**fields))


def test_finished_facts_are_bounded():
    assert convert.finished_facts(process_pb2.Finished(exit_code=-9, timed_out=True, duration_seconds=1.5)) == {
        "exit_code": -9, "truncated": False, "timed_out": True, "canceled": False, "duration_seconds": 1.5}
    assert convert.finished_facts(process_pb2.Finished())["exit_code"] is None
    for lie in (process_pb2.Finished(exit_code=1 << 40), process_pb2.Finished(duration_seconds=-1),
                process_pb2.Finished(duration_seconds=math.nan)):
        with pytest.raises(ValueError):
            convert.finished_facts(lie)


def test_a_resolved_command_may_change_only_the_executable():
    argv = ["sh", "-c", "true"]
    good = process_pb2.ResolveCommandResponse(argv=["/bin/sh", "-c", "true"], cwd="/ws", real_executable="/usr/bin/dash")
    assert convert.resolved_command(good, argv) == Resolved(("/bin/sh", "-c", "true"), "/ws", "/usr/bin/dash")
    for lie in (process_pb2.ResolveCommandResponse(argv=["/bin/sh", "-c", "rm -rf /"], cwd="/ws", real_executable="/bin/sh"),
                process_pb2.ResolveCommandResponse(argv=["/bin/sh", "-c"], cwd="/ws", real_executable="/bin/sh"),
                process_pb2.ResolveCommandResponse(argv=["sh", "-c", "true"], cwd="/ws", real_executable="/bin/sh"),
                process_pb2.ResolveCommandResponse(argv=["/bin/sh", "-c", "true"], cwd="/ws"),
                process_pb2.ResolveCommandResponse(argv=["/bin/sh", "-c", "true"], cwd="/ws", real_executable="dash")):
        with pytest.raises(ValueError):
            convert.resolved_command(lie, argv)


def test_revision_and_snapshot_roundtrip_with_unknown_fields_left_unknown():
    assert operation_convert.revision(operation_convert.revision_message(REVISION)) == REVISION
    absent = ResourceRevision("/ws/new", False, parent_identity=(1, 2))
    assert operation_convert.revision(operation_convert.revision_message(absent)) == absent
    for snapshot in (ResourceSnapshot(REVISION, DATA), ResourceSnapshot(absent, None)):
        wire = operation_convert.snapshot_response(snapshot)
        assert operation_convert.snapshot(wire, roots=ROOTS, max_file_bytes=100) == snapshot


@pytest.mark.parametrize("lie", [
    ResourceSnapshot(REVISION, b"hello, altered\n"),  # bytes that do not match the hash
    ResourceSnapshot(ResourceRevision("/etc/passwd", True, size=6, sha256=REVISION.sha256, mode=0o644), DATA),
    ResourceSnapshot(ResourceRevision("/ws/a.txt", False), DATA),
    ResourceSnapshot(REVISION, None),
])
def test_a_snapshot_must_be_lossless_and_inside_the_roots(lie):
    with pytest.raises(ValueError):
        operation_convert.snapshot(operation_convert.snapshot_response(lie), roots=ROOTS, max_file_bytes=100)


def test_an_invalid_revision_is_refused():
    for lie in (workspace_pb2.Revision(resource_id="relative", exists=True),
                workspace_pb2.Revision(resource_id="/ws/a", exists=True, sha256="XYZ"),
                workspace_pb2.Revision(resource_id="/ws/a", exists=True, mode=0o170000),
                workspace_pb2.Revision(resource_id="/ws/a", exists=True, size=-1)):
        with pytest.raises(ValueError):
            operation_convert.revision(lie)


def test_listing_and_search_roundtrip():
    listing = Listing((FileEntry("/ws/a", "file", 3), FileEntry("/ws/d", "directory"), FileEntry("/ws/l", "other")),
                      scanned=3, skipped=1, truncated=True)
    assert operation_convert.listing(operation_convert.listing_response(listing), roots=ROOTS, max_results=3) == listing
    found = SearchResult((SearchMatch("/ws/a", 2, "needle", False),), scanned=9, skipped=0, truncated=False)
    assert operation_convert.search_result(operation_convert.search_response(found), roots=ROOTS, max_results=1) == found


def test_listing_and_search_answers_are_bounded_by_the_request():
    listing = Listing((FileEntry("/ws/a", "file", 3), FileEntry("/ws/b", "file", 3)), 2, 0, False)
    with pytest.raises(ValueError, match="more entries"):
        operation_convert.listing(operation_convert.listing_response(listing), roots=ROOTS, max_results=1)
    with pytest.raises(ValueError, match="outside the roots"):
        operation_convert.listing(operation_convert.listing_response(listing), roots=["/other"], max_results=5)
    with pytest.raises(ValueError, match="entry type"):
        operation_convert.listing(workspace_pb2.ListFilesResponse(items=[workspace_pb2.FileEntry(path="/ws/a")]),
                         roots=ROOTS, max_results=5)
    long_line = workspace_pb2.SearchFilesResponse(items=[workspace_pb2.SearchMatch(path="/ws/a", line=1, text="x" * 501)])
    with pytest.raises(ValueError, match="longer"):
        operation_convert.search_result(long_line, roots=ROOTS, max_results=5)
    line_zero = workspace_pb2.SearchFilesResponse(items=[workspace_pb2.SearchMatch(path="/ws/a", line=0, text="x")])
    with pytest.raises(ValueError, match="one-based"):
        operation_convert.search_result(line_zero, roots=ROOTS, max_results=5)


def test_text_chunks_are_bounded_by_the_request():
    chunk = TextChunk("/ws/a", "abc", 3)
    assert operation_convert.text_chunk(operation_convert.text_chunk_response(chunk), roots=ROOTS, max_chars=3) == chunk
    with pytest.raises(ValueError, match="more characters"):
        operation_convert.text_chunk(operation_convert.text_chunk_response(chunk), roots=ROOTS, max_chars=2)
    with pytest.raises(ValueError, match="outside"):
        operation_convert.text_chunk(operation_convert.text_chunk_response(TextChunk("/etc/passwd", "", None)), roots=ROOTS, max_chars=2)


def test_document_results_roundtrip():
    metadata = DocumentMetadata("/ws/book.xlsx", "xlsx", 1234)
    extraction = DocumentExtraction(metadata, (
        DocumentSection({"sheet": "Q1", "row": 7}, cells=("a", "", "3")),
        DocumentSection({"page": 2}, text="two\nlines"),
        DocumentSection({"row": 1}, cells=()),
    ), truncated=True)
    wire = operation_convert.extraction_response(extraction)
    assert operation_convert.extraction(wire, roots=ROOTS, limits=LIMITS) == extraction
    assert list(operation_convert.extraction(wire, roots=ROOTS, limits=LIMITS).sections[0].location) == ["sheet", "row"]
    found = DocumentSearchResult(metadata, "two", (DocumentMatch({"page": 2, "line": 1}, "two"),), False)
    wire_search = operation_convert.document_search_response(found)
    assert operation_convert.document_search(wire_search, roots=ROOTS, query="two", limits=LIMITS, max_results=1) == found


def test_document_answers_are_bounded_by_the_limits():
    metadata = documents_pb2.DocumentMetadata(path="/ws/a.txt", format="txt", input_bytes=10)
    text = documents_pb2.DocumentSection(text="x")
    with pytest.raises(ValueError, match="sections"):
        operation_convert.extraction(documents_pb2.ReadDocumentResponse(metadata=metadata, sections=[text] * 4),
                            roots=ROOTS, limits=LIMITS)
    with pytest.raises(ValueError, match="characters"):
        operation_convert.extraction(documents_pb2.ReadDocumentResponse(
            metadata=metadata, sections=[documents_pb2.DocumentSection(text="x" * 51)]), roots=ROOTS, limits=LIMITS)
    with pytest.raises(ValueError, match="neither"):
        operation_convert.extraction(documents_pb2.ReadDocumentResponse(metadata=metadata, sections=[documents_pb2.DocumentSection()]),
                            roots=ROOTS, limits=LIMITS)
    repeated = documents_pb2.DocumentSection(text="x", location=[documents_pb2.LocationPart(name="row", number=1)] * 2)
    with pytest.raises(ValueError, match="repeated"):
        operation_convert.extraction(documents_pb2.ReadDocumentResponse(metadata=metadata, sections=[repeated]),
                            roots=ROOTS, limits=LIMITS)
    with pytest.raises(ValueError, match="another query"):
        operation_convert.document_search(documents_pb2.SearchDocumentResponse(metadata=metadata, query="other"),
                                 roots=ROOTS, query="mine", limits=LIMITS, max_results=1)
