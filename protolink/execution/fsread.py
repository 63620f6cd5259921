"""Bounded text reads of regular files beneath the roots."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .paths import open_regular_file, read_bounded

MAX_READ_CHARS = 20_000


@dataclass(frozen=True)
class TextChunk:
    """Characters ``[offset, next_offset)`` of a UTF-8 file; ``next_offset`` is None at the end."""

    path: str
    content: str
    next_offset: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "content": self.content, "next_offset": self.next_offset}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TextChunk:
        return cls(path=data["path"], content=data["content"], next_offset=data["next_offset"])


def decode_text(data: bytes, path: str) -> str:
    """``data`` as text; ValueError for NUL-containing (binary) content or invalid UTF-8."""
    if b"\0" in data:
        raise ValueError(f"{path} contains NUL bytes (binary content)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not valid UTF-8 (byte {error.start})") from None


def read_text(path: str, roots: Sequence[str], *, offset: int, max_chars: int, max_file_bytes: int) -> TextChunk:
    """Up to ``max_chars`` (1–20,000) characters from character ``offset`` of a UTF-8 file.

    The whole file (at most ``max_file_bytes``) is read and decoded on every call, so offsets
    count Unicode characters of the file as it is now.
    """
    if offset < 0:
        raise ValueError("offset must be >= 0")
    if not 1 <= max_chars <= MAX_READ_CHARS:
        raise ValueError(f"max_chars must be between 1 and {MAX_READ_CHARS}")
    with open_regular_file(path, roots) as opened:
        text = decode_text(read_bounded(opened, max_file_bytes), opened.path)
    content = text[offset : offset + max_chars]
    end = offset + len(content)
    return TextChunk(path=opened.path, content=content, next_offset=end if end < len(text) else None)
