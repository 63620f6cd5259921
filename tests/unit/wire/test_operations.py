"""The table of operations: every operation has one row, and each row's converters carry the
typed method's arguments to the server and its result back, unchanged."""

from __future__ import annotations

from typing import Any

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
from protolink.execution.operations import OPERATIONS
from protolink.revisions import ResourceRevision, ResourceSnapshot, revision_of
from protolink.wire.operations import WIRE_OPERATIONS

ROOTS = ["/ws"]
LIMITS = DocumentLimits(timeout_seconds=7)
REVISION = ResourceRevision("/ws/a.txt", True, size=2, sha256="0" * 64, mode=0o644, identity=(1, 2),
                            parent_identity=(1, 1))
META = DocumentMetadata("/ws/a.csv", "csv", 10)

#: Per operation: the typed method's keyword arguments, and a result the implementation may return.
CASES: dict[str, tuple[dict[str, Any], Any]] = {
    "ReadText": ({"path": "/ws/a.txt", "roots": ROOTS, "offset": 3, "max_chars": 100, "max_file_bytes": 1000},
                 TextChunk("/ws/a.txt", "hello", next_offset=8)),
    "ListFiles": ({"path": "/ws", "roots": ROOTS, "pattern": "*.py", "recursive": True, "max_results": 5},
                  Listing((FileEntry("/ws/a.py", "file", 3), FileEntry("/ws/d", "directory", None)), 4, 1, True)),
    "SearchFiles": ({"path": "/ws", "roots": ROOTS, "query": "x", "pattern": "*", "case_sensitive": True,
                     "max_results": 5, "max_file_bytes": 100},
                    SearchResult((SearchMatch("/ws/a.py", 2, "x = 1", False),), 3, 0, False)),
    "SnapshotFile": ({"path": "/ws/a.txt", "roots": ROOTS, "max_file_bytes": 100},
                     ResourceSnapshot(revision_of("/ws/a.txt", b"hi", mode=0o600, identity=(1, 2),
                                                  parent_identity=(1, 1)), b"hi")),
    "ReplaceFile": ({"expected": REVISION, "data": b"new", "mode": 0o600, "roots": ROOTS},
                    revision_of("/ws/a.txt", b"new", mode=0o600, identity=(1, 3), parent_identity=(1, 1))),
    "ReadDocument": ({"path": "/ws/a.csv", "roots": ROOTS, "limits": LIMITS},
                     DocumentExtraction(META, (DocumentSection({"row": 1}, cells=("a", "b")),), False)),
    "SearchDocument": ({"path": "/ws/a.csv", "query": "a", "roots": ROOTS, "limits": LIMITS, "max_results": 3},
                       DocumentSearchResult(META, "a", (DocumentMatch({"row": 1, "column": 1}, "a"),), True)),
}


def test_every_operation_has_one_row_and_a_case_here():
    assert set(WIRE_OPERATIONS) == set(OPERATIONS) == set(CASES)
    assert all(row.operation is OPERATIONS[name] for name, row in WIRE_OPERATIONS.items())


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_row_carries_the_arguments_and_the_result_unchanged(name):
    row = WIRE_OPERATIONS[name]
    arguments, result = CASES[name]
    request = row.request_type.FromString(row.request(**arguments).SerializeToString())
    assert row.arguments(request) == arguments
    assert (row.limits(request) == LIMITS) == row.operation.document
    response = type(row.response(result)).FromString(row.response(result).SerializeToString())
    assert row.answer(response, **arguments) == result
