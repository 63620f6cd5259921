"""UTF-8 text documents (TXT, MD, RST, LOG, JSON, YAML, XML), returned as text, uninterpreted."""

from __future__ import annotations

from collections.abc import Generator

from protolink.errors import DocumentError

from .sections import DocumentSection


def decode_utf8(data: bytes, format_name: str) -> str:
    """Strict UTF-8 without a leading byte-order mark; binary (NUL) content is refused."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DocumentError(f"{format_name} document is not valid UTF-8 (byte {error.start})") from None
    if "\0" in text:
        raise DocumentError(f"{format_name} document contains NUL bytes; binary content is refused")
    return text.removeprefix("\ufeff")


def text_sections(data: bytes, format_name: str) -> Generator[DocumentSection, None, None]:
    """The whole file as one text section starting at line 1."""
    yield DocumentSection({"line": 1}, text=decode_utf8(data, format_name))
