"""XLSX documents: worksheet rows of cached cell values, in sheet and row order.

The workbook opens read-only with ``data_only=True``: formulas are not evaluated, a formula
without a cached value reads as an empty cell, and external links are not loaded. Rows are
located by sheet title and one-based row number.
"""

from __future__ import annotations

import datetime
import io
from collections.abc import Generator
from typing import Any

from protolink.errors import DocumentError

from .sections import DocumentSection

# Excel's own row limit. openpyxl fills gaps between stored rows with empty ones, so a hostile
# row number would otherwise make it count far past any real sheet.
MAX_SCANNED_ROWS = 1_048_576


def workbook_sections(data: bytes, format_name: str) -> Generator[DocumentSection, None, None]:
    from openpyxl import load_workbook

    workbook = load_workbook(io.BytesIO(data), read_only=True, data_only=True, keep_links=False)
    try:
        scanned = 0
        for sheet in workbook.worksheets:
            # Declared dimensions are untrusted: without them rows are as wide as their cells.
            sheet.reset_dimensions()
            for number, values in enumerate(sheet.iter_rows(values_only=True), start=1):
                scanned += 1
                if scanned > MAX_SCANNED_ROWS:
                    raise DocumentError(f"XLSX document has more than {MAX_SCANNED_ROWS} rows to scan")
                if any(value is not None for value in values):
                    yield DocumentSection({"sheet": sheet.title, "row": number},
                                          cells=tuple(cell_text(value) for value in values))
    finally:
        workbook.close()


def cell_text(value: Any) -> str:
    """A cached cell value as text: empty for none, TRUE/FALSE, ISO 8601 for dates and times."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    return str(value)
