"""Pure document extraction: the section budget, the result types a wire layer maps, parser errors."""

from __future__ import annotations

import sys

import pytest

from protolink.errors import DocumentError
from protolink.execution.documents import (
    DocumentExtraction,
    DocumentMatch,
    DocumentMetadata,
    DocumentSearchResult,
)
from protolink.execution.extract import (
    DocumentLimits,
    DocumentSection,
    bounded_sections,
    detect_format,
    extract,
)


def rows(*cells: tuple[str, ...]) -> list[DocumentSection]:
    return [DocumentSection({"row": number}, cells=row) for number, row in enumerate(cells, start=1)]


def test_the_budget_skips_empty_sections_and_keeps_locations():
    sections = [DocumentSection({"page": 1}, text="  \n"), DocumentSection({"page": 2}, text="two"),
                *rows(("", ""), ("a",))]
    kept, truncated = bounded_sections(sections, DocumentLimits())
    assert [section.to_dict() for section in kept] == [
        {"location": {"page": 2}, "text": "two"}, {"location": {"row": 2}, "cells": ["a"]}]
    assert truncated is False


def test_the_budget_reports_truncation_only_when_content_is_left_out():
    limits = DocumentLimits(max_output_chars=4, max_sections=2)
    assert bounded_sections(rows(("ab",), ("cd",)), limits)[1] is False
    assert bounded_sections(rows(("ab",), ("cd",), ("",)), limits)[1] is False
    assert bounded_sections(rows(("ab",), ("cd",), ("e",)), limits)[1] is True
    kept, truncated = bounded_sections(rows(("abc", "def")), limits)
    assert kept[0].cells == ("abc", "d") and truncated


def test_the_budget_stops_reading_its_source_once_full():
    pulled = []

    def source():
        for number in range(1, 1000):
            pulled.append(number)
            yield DocumentSection({"row": number}, cells=("x",))

    kept, truncated = bounded_sections(source(), DocumentLimits(max_sections=3))
    assert len(kept) == 3 and truncated
    assert pulled == [1, 2, 3, 4]


@pytest.mark.parametrize("arguments", [
    {"text": "a", "cells": ("b",)}, {}, {"text": 1}, {"cells": ("a", 2)},
])
def test_sections_hold_text_or_string_cells(arguments):
    with pytest.raises(ValueError):
        DocumentSection({"line": 1}, **arguments)
    with pytest.raises(ValueError):
        DocumentSection({"line": True}, text="a")


@pytest.mark.parametrize("field, value", [
    ("max_file_bytes", 0), ("max_output_chars", -1), ("max_sections", 1.5), ("max_archive_bytes", True),
    ("timeout_seconds", 0), ("timeout_seconds", float("inf")),
])
def test_limits_must_be_positive(field, value):
    with pytest.raises(ValueError, match=field):
        DocumentLimits(**{field: value})


def test_results_round_trip_through_plain_dictionaries():
    metadata = DocumentMetadata("/r/a.xlsx", "xlsx", 123)
    extraction = DocumentExtraction(metadata, (DocumentSection({"sheet": "S", "row": 2}, cells=("1", "")),
                                               DocumentSection({"paragraph": 1}, text="t")), True)
    assert DocumentExtraction.from_dict(extraction.to_dict()) == extraction
    search = DocumentSearchResult(metadata, "q", (DocumentMatch({"sheet": "S", "row": 2, "column": 1}, "1"),), False)
    assert DocumentSearchResult.from_dict(search.to_dict()) == search
    assert DocumentLimits.from_dict(DocumentLimits(max_sections=7).to_dict()) == DocumentLimits(max_sections=7)


def test_formats_come_from_the_extension():
    assert detect_format("/r/Report.PDF") == "pdf"
    assert detect_format("/r/data.tsv") == "tsv"
    for path in ("/r/macro.docm", "/r/legacy.doc", "/r/noext", "/r/archive.zip"):
        with pytest.raises(DocumentError, match="unsupported document type"):
            detect_format(path)


@pytest.mark.parametrize("format_name, module, package", [
    ("pdf", "pypdf", "pypdf"), ("docx", "docx", "python-docx"), ("xlsx", "openpyxl", "openpyxl"),
])
def test_a_missing_parser_names_the_extra_to_install(monkeypatch, format_name, module, package):
    import io
    import zipfile

    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as writer:
        writer.writestr("[Content_Types].xml", "<Types/>")
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(RuntimeError, match=rf"requires {package}: pip install 'protolink\[documents\]'"):
        extract(archive.getvalue(), format_name, DocumentLimits())


def test_a_pdf_whose_encryption_dictionary_pypdf_cannot_read_is_still_encrypted():
    """pypdf reads the encryption dictionary to try the empty password; when that fails, the
    trailer naming an /Encrypt dictionary still makes the document an encrypted one."""
    damaged = (b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog >>\nendobj\n2 0 obj\n<< /Filter /Standard /V 2 /R 3 >>\n"
               b"endobj\ntrailer\n<< /Root 1 0 R /Encrypt 2 0 R /ID [<00> <00>] >>\n%%EOF\n")
    with pytest.raises(DocumentError, match="encrypted"):
        extract(damaged, "pdf", DocumentLimits())
    with pytest.raises(DocumentError, match="could not be parsed"):
        extract(damaged.replace(b"/Encrypt 2 0 R ", b""), "pdf", DocumentLimits())
