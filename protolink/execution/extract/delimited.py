"""CSV and TSV documents: one section per record, string cells, one-based row numbers."""

from __future__ import annotations

import csv
import io
from collections.abc import Generator

from protolink.errors import DocumentError

from .sections import DocumentSection
from .text import decode_utf8

DELIMITERS = {"csv": ",", "tsv": "\t"}


def delimited_sections(data: bytes, format_name: str) -> Generator[DocumentSection, None, None]:
    """Records in file order; ``row`` counts records (a quoted field may span lines)."""
    text = decode_utf8(data, format_name)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=DELIMITERS[format_name])
    try:
        for number, record in enumerate(reader, start=1):
            yield DocumentSection({"row": number}, cells=tuple(record))
    except csv.Error as error:
        raise DocumentError(f"{format_name} document is malformed near line {reader.line_num}: {error}") from None
