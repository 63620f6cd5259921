"""Document extraction and search: the blocking implementations and their result types.

A document is read through :mod:`protolink.execution.paths` (absolute path beneath a root, no
symlink, regular file, at most ``max_file_bytes``), then extracted by the pure functions in
:mod:`protolink.execution.extract`. The sandbox server calls :func:`extract_document` and
:func:`search_document_file` too; the results are plain frozen dataclasses with ``to_dict`` and
``from_dict`` so a wire layer can carry them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from protolink.errors import DocumentError

from .extract import (
    DocumentLimits,
    DocumentSection,
    detect_format,
    extract,
)
from .paths import open_regular_file, read_bounded

__all__ = [
    "MAX_QUERY_CHARS",
    "MAX_SEARCH_RESULTS",
    "SNIPPET_CHARS",
    "DocumentError",
    "DocumentExtraction",
    "DocumentLimits",
    "DocumentMatch",
    "DocumentMetadata",
    "DocumentSearchResult",
    "DocumentSection",
    "extract_document",
    "search_document_file",
]

MAX_SEARCH_RESULTS = 100
MAX_QUERY_CHARS = 1_000
SNIPPET_CHARS = 200

T = TypeVar("T")


@dataclass(frozen=True)
class DocumentMetadata:
    """The canonical path, the format and the number of input bytes read."""

    path: str
    format: str
    input_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "input_bytes": self.input_bytes}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DocumentMetadata:
        return cls(path=str(data["path"]), format=str(data["format"]), input_bytes=int(data["input_bytes"]))


@dataclass(frozen=True)
class DocumentExtraction:
    """Metadata, located sections in document order, and whether anything was left out."""

    metadata: DocumentMetadata
    sections: tuple[DocumentSection, ...]
    truncated: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "metadata": self.metadata.to_dict(),
            "sections": [section.to_dict() for section in self.sections],
            "truncated": self.truncated,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DocumentExtraction:
        return cls(
            metadata=DocumentMetadata.from_dict(data["metadata"]),
            sections=tuple(DocumentSection.from_dict(item) for item in data["sections"]),
            truncated=bool(data["truncated"]),
        )


@dataclass(frozen=True)
class DocumentMatch:
    """One match: its location (a text line, or a row cell's column) and a snippet around it."""

    location: Mapping[str, int | str]
    snippet: str

    def to_dict(self) -> dict[str, Any]:
        return {"location": dict(self.location), "snippet": self.snippet}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DocumentMatch:
        return cls(location=dict(data["location"]), snippet=str(data["snippet"]))


@dataclass(frozen=True)
class DocumentSearchResult:
    """Matches in document order; ``truncated`` when the extraction or the results are incomplete."""

    metadata: DocumentMetadata
    query: str
    matches: tuple[DocumentMatch, ...]
    truncated: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "metadata": self.metadata.to_dict(),
            "query": self.query,
            "matches": [match.to_dict() for match in self.matches],
            "truncated": self.truncated,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DocumentSearchResult:
        return cls(
            metadata=DocumentMetadata.from_dict(data["metadata"]),
            query=str(data["query"]),
            matches=tuple(DocumentMatch.from_dict(item) for item in data["matches"]),
            truncated=bool(data["truncated"]),
        )


def extract_document(path: str, roots: Sequence[str], limits: DocumentLimits) -> DocumentExtraction:
    """Read and extract one document (blocking)."""
    format_name = detect_format(path)
    with open_regular_file(path, roots) as opened:
        data = read_bounded(opened, limits.max_file_bytes)
    sections, truncated = extract(data, format_name, limits)
    return DocumentExtraction(DocumentMetadata(opened.path, format_name, len(data)), sections, truncated)


def search_document_file(
    path: str, query: str, roots: Sequence[str], limits: DocumentLimits, max_results: int
) -> DocumentSearchResult:
    """Literal, case-insensitive search inside the bounded extraction of one document (blocking)."""
    check_search(query, max_results)
    extraction = extract_document(path, roots, limits)
    matches, more = _find(extraction.sections, query, max_results)
    return DocumentSearchResult(extraction.metadata, query, matches, extraction.truncated or more)


def check_search(query: str, max_results: int) -> None:
    """ValueError unless ``query`` is one nonblank line of at most MAX_QUERY_CHARS and
    ``max_results`` is 1–MAX_SEARCH_RESULTS."""
    if not isinstance(query, str) or not query.strip() or len(query) > MAX_QUERY_CHARS:
        raise ValueError(f"query must be nonblank text of at most {MAX_QUERY_CHARS} characters")
    if "\n" in query or "\r" in query:
        raise ValueError("query must be a single line; matches are found within lines and cells")
    if isinstance(max_results, bool) or not isinstance(max_results, int) or not 1 <= max_results <= MAX_SEARCH_RESULTS:
        raise ValueError(f"max_results must be 1–{MAX_SEARCH_RESULTS}, not {max_results!r}")


def _find(
    sections: Sequence[DocumentSection], query: str, max_results: int
) -> tuple[tuple[DocumentMatch, ...], bool]:
    pattern = re.compile(re.escape(query), re.IGNORECASE)
    matches: list[DocumentMatch] = []
    for location, text in _searchable(sections):
        found = pattern.search(text)
        if found is None:
            continue
        if len(matches) == max_results:
            return tuple(matches), True
        matches.append(DocumentMatch(location, _snippet(text, found)))
    return tuple(matches), False


def _searchable(sections: Sequence[DocumentSection]) -> Iterator[tuple[dict[str, int | str], str]]:
    """Each text line with its line location, and each cell with its column location."""
    for section in sections:
        if section.text is not None:
            first = int(section.location.get("line", 1))
            for index, line in enumerate(section.text.split("\n")):
                yield {**section.location, "line": first + index}, line.removesuffix("\r")
        else:
            for index, cell in enumerate(section.cells or (), start=1):
                yield {**section.location, "column": index}, cell


def _snippet(text: str, found: re.Match[str]) -> str:
    if len(text) <= SNIPPET_CHARS:
        return text
    context = max(0, (SNIPPET_CHARS - len(found.group())) // 2)
    start = min(max(0, found.start() - context), len(text) - SNIPPET_CHARS)
    return text[start:start + SNIPPET_CHARS]
