"""Pure document extraction: the bytes of one document and its limits in, located sections out.

Formats are chosen by file extension. Office archives are checked before their parser runs;
every parser failure becomes a :class:`DocumentError` (a ``ValueError``). Parsing stops as soon
as the section or character budget is spent.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator
from contextlib import closing

from protolink.errors import DocumentError

from .archive import check_office_archive
from .delimited import delimited_sections
from .pdf import pdf_sections
from .sections import (
    MAX_COLUMNS,
    DocumentLimits,
    DocumentSection,
    bounded_sections,
)
from .text import text_sections
from .word import word_sections
from .workbook import workbook_sections

__all__ = [
    "EXTENSIONS",
    "MAX_COLUMNS",
    "DocumentError",
    "DocumentLimits",
    "DocumentSection",
    "bounded_sections",
    "detect_format",
    "extract",
]

EXTENSIONS: dict[str, str] = {
    ".txt": "txt",
    ".md": "md",
    ".markdown": "md",
    ".rst": "rst",
    ".log": "log",
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".xml": "xml",
    ".csv": "csv",
    ".tsv": "tsv",
    ".pdf": "pdf",
    ".docx": "docx",
    ".xlsx": "xlsx",
}

Reader = Callable[[bytes, str], Generator[DocumentSection, None, None]]

_READERS: dict[str, Reader] = {
    **dict.fromkeys(("txt", "md", "rst", "log", "json", "yaml", "xml"), text_sections),
    "csv": delimited_sections,
    "tsv": delimited_sections,
    "pdf": pdf_sections,
    "docx": word_sections,
    "xlsx": workbook_sections,
}

# Optional parser packages, by the module name an ImportError reports.
_PARSERS = {"pypdf": "pypdf", "docx": "python-docx", "openpyxl": "openpyxl", "lxml": "lxml"}


def detect_format(path: str) -> str:
    """The format named by ``path``'s extension (case-insensitive); DocumentError otherwise."""
    extension = os.path.splitext(path)[1].lower()
    try:
        return EXTENSIONS[extension]
    except KeyError:
        supported = ", ".join(sorted(EXTENSIONS))
        raise DocumentError(
            f"{path}: unsupported document type {extension or '(no extension)'!r}; supported: {supported}"
        ) from None


def extract(data: bytes, format_name: str, limits: DocumentLimits) -> tuple[tuple[DocumentSection, ...], bool]:
    """The bounded sections of one document and whether anything was left out."""
    reader = _READERS[format_name]
    if format_name in ("docx", "xlsx"):
        check_office_archive(data, format_name, limits.max_archive_bytes)
    try:
        with closing(reader(data, format_name)) as sections:
            return bounded_sections(sections, limits)
    except DocumentError:
        raise
    except ImportError as error:
        package = _PARSERS.get((error.name or "").partition(".")[0])
        if package is None:
            raise
        raise RuntimeError(
            f"{format_name} extraction requires {package}: pip install 'protolink[documents]'"
        ) from None
    except Exception as error:
        raise DocumentError(f"{format_name} document could not be parsed: {error}") from None
