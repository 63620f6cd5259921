"""PDF documents: the text pypdf extracts from each page, located by one-based page number.

No OCR and no reconstruction of table geometry. Encrypted PDFs are refused.
"""

from __future__ import annotations

import io
from collections.abc import Generator

from protolink.errors import DocumentError

from .sections import DocumentSection

#: Where the trailer (or the cross-reference stream's dictionary) that names the encryption lies.
TRAILER_BYTES = 64 * 1024
ENCRYPTED = "PDF document is encrypted; encrypted documents are unsupported"


def pdf_sections(data: bytes, format_name: str) -> Generator[DocumentSection, None, None]:
    """Page text in page order; pages are parsed only as far as the consumer reads."""
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise DocumentError(ENCRYPTED)
        for number, page in enumerate(reader.pages, start=1):
            yield DocumentSection({"page": number}, text=page.extract_text())
    except DocumentError:
        raise
    except Exception:
        # pypdf may fail on the encryption dictionary itself, or miss the trailer that names it
        # and then parse ciphertext as page content: a trailer that names one still makes the
        # document an encrypted one.
        if b"/Encrypt" in data[-TRAILER_BYTES:]:
            raise DocumentError(ENCRYPTED) from None
        raise
