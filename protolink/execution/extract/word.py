"""DOCX documents: top-level body paragraphs and table rows, in document order.

Paragraphs are located by their one-based index among body paragraphs; table rows by table and
row. A cell spanning several grid columns repeats its text in each; a cell continuing a vertical
merge is empty (its text belongs to the first row of the merge). Nested tables are not read.
"""

from __future__ import annotations

import io
from collections.abc import Generator

from .sections import MAX_COLUMNS, DocumentSection


def word_sections(data: bytes, format_name: str) -> Generator[DocumentSection, None, None]:
    import docx
    from docx.table import Table

    document = docx.Document(io.BytesIO(data))
    paragraphs = tables = 0
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            tables += 1
            for number, row in enumerate(block.rows, start=1):
                yield DocumentSection({"table": tables, "row": number}, cells=_row_cells(row))
        else:
            paragraphs += 1
            yield DocumentSection({"paragraph": paragraphs}, text=block.text)


def _row_cells(row) -> tuple[str, ...]:
    """The row's grid cells; a span repeats only up to the column limit.

    python-docx's ``row.cells`` repeats a spanning cell once per spanned column, which a hostile
    ``gridSpan`` turns into an unbounded loop. This walks the same ``w:tc`` elements; past the
    limit each contributes one cell, so content beyond it still marks the row as cut.
    """
    from docx.table import _Cell

    cells: list[str] = []
    for tc in row._tr.tc_lst:
        text = "" if tc.vMerge == "continue" else _Cell(tc, row.table).text
        cells.extend([text] * max(1, min(tc.grid_span, MAX_COLUMNS - len(cells))))
    return tuple(cells)
