"""PDF documents: the text pypdf extracts from each page, located by one-based page number.

No OCR and no reconstruction of table geometry. Encrypted PDFs are refused.
"""

from __future__ import annotations

import io
from collections.abc import Generator

from .sections import DocumentError, DocumentSection


def pdf_sections(data: bytes, format_name: str) -> Generator[DocumentSection, None, None]:
    """Page text in page order; pages are parsed only as far as the consumer reads."""
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted:
        raise DocumentError("PDF document is encrypted; encrypted documents are unsupported")
    for number, page in enumerate(reader.pages, start=1):
        yield DocumentSection({"page": number}, text=page.extract_text())
