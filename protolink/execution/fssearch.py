"""Bounded listing and literal-text search beneath the roots.

Both walk directories through descriptors (no symlink is followed) in filesystem order, and
report ``scanned`` (entries visited), ``skipped`` (directories not entered and files not
searched because they are too deep, unreadable, binary or oversized) and ``truncated`` (a
limit cut the result short). Traversal visits at most 10,000 entries and 20 directory levels;
search reads at most 32 MiB in total.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Self, TypeVar

from .paths import (
    EntryType,
    entry_type,
    open_child_directory,
    open_directory,
    open_regular_at,
    read_descriptor,
    resolve_under_roots,
)

MAX_RESULTS = 1_000
MAX_ENTRIES = 10_000
MAX_LEVELS = 20
MAX_SEARCH_BYTES = 32 * 1024 * 1024
MAX_LINE_CHARS = 500

Item = TypeVar("Item", "FileEntry", "SearchMatch")
_Entries = Generator[tuple[int, os.DirEntry[str], str], None, None]


@dataclass(frozen=True)
class FileEntry:
    """A listed entry; symlinks and special files have type ``"other"``. ``size`` is for files."""

    path: str
    type: EntryType
    size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "type": self.type, "size": self.size}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FileEntry:
        return cls(path=data["path"], type=data["type"], size=data.get("size"))


@dataclass(frozen=True)
class SearchMatch:
    """A matching line: one-based ``line`` number and at most 500 characters of its text."""

    path: str
    line: int
    text: str
    text_truncated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "text": self.text, "text_truncated": self.text_truncated}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchMatch:
        return cls(path=data["path"], line=data["line"], text=data["text"], text_truncated=data["text_truncated"])


@dataclass(frozen=True)
class _Traversal(Generic[Item]):
    items: tuple[Item, ...]
    scanned: int
    skipped: int
    truncated: bool

    item_type: ClassVar[type[Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"items": [item.to_dict() for item in self.items], "scanned": self.scanned,
                "skipped": self.skipped, "truncated": self.truncated}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        return cls(items=tuple(cls.item_type.from_dict(item) for item in data["items"]), scanned=data["scanned"],
                   skipped=data["skipped"], truncated=data["truncated"])


@dataclass(frozen=True)
class Listing(_Traversal[FileEntry]):
    """Entries matching a filename glob, in traversal order, with the traversal counters."""

    item_type = FileEntry


@dataclass(frozen=True)
class SearchResult(_Traversal[SearchMatch]):
    """Matching lines in traversal order, with the traversal counters."""

    item_type = SearchMatch


def list_files(path: str, roots: Sequence[str], *, pattern: str = "*", recursive: bool = False,
               max_results: int = 100) -> Listing:
    """Entries of the directory ``path`` (and below, when ``recursive``) whose name matches ``pattern``."""
    matches = _name_matcher(pattern)
    _check_max_results(max_results)
    target = resolve_under_roots(path, roots)
    items: list[FileEntry] = []
    walk = _Walk(recursive)
    with open_directory(target) as dir_fd, closing(walk.entries(dir_fd, target.path)) as entries:
        for _, entry, entry_path in entries:
            if not matches(entry.name):
                continue
            if len(items) == max_results:
                walk.truncated = True
                break
            items.append(_file_entry(entry, entry_path))
    return Listing(tuple(items), walk.scanned, walk.skipped, walk.truncated)


def search_files(path: str, roots: Sequence[str], *, query: str, pattern: str = "*", case_sensitive: bool = False,
                 max_results: int = 100, max_file_bytes: int) -> SearchResult:
    """Lines containing the literal ``query`` in UTF-8 files beneath the directory ``path``.

    Files larger than ``max_file_bytes``, binary (NUL bytes or invalid UTF-8) or unreadable
    are skipped; symlinks and special files are not searched.
    """
    if not query or "\n" in query or "\r" in query:
        raise ValueError("query must be non-empty text on a single line")
    matches = _name_matcher(pattern)
    _check_max_results(max_results)
    needle = query if case_sensitive else query.casefold()
    fold: Callable[[str], str] = _same if case_sensitive else str.casefold
    target = resolve_under_roots(path, roots)
    items: list[SearchMatch] = []
    budget = MAX_SEARCH_BYTES
    walk = _Walk(recursive=True)
    with open_directory(target) as dir_fd, closing(walk.entries(dir_fd, target.path)) as entries:
        for parent_fd, entry, entry_path in entries:
            if not entry.is_file(follow_symlinks=False) or not matches(entry.name):
                continue
            try:
                with open_regular_at(parent_fd, entry.name, entry_path) as opened:
                    size = opened.stat.st_size
                    if size > max_file_bytes:
                        walk.skipped += 1
                        continue
                    if size > budget:
                        walk.truncated = True
                        break
                    data = read_descriptor(opened.fd, min(size + 1, budget))
            except (OSError, ValueError):
                walk.skipped += 1
                continue
            budget -= len(data)
            text = _text_or_none(data, size)
            if text is None:
                walk.skipped += 1
                continue
            for match in _matching_lines(entry_path, text, needle, fold):
                if len(items) == max_results:
                    walk.truncated = True
                    break
                items.append(match)
            if walk.truncated:
                break
    return SearchResult(tuple(items), walk.scanned, walk.skipped, walk.truncated)


class _Walk:
    """A depth-first directory walk through descriptors, counting what it visits and skips.

    Close the generator from :meth:`entries` (``contextlib.closing``) to release its descriptors
    when stopping early.
    """

    def __init__(self, recursive: bool) -> None:
        self.recursive = recursive
        self.scanned = 0
        self.skipped = 0
        self.truncated = False

    def entries(self, dir_fd: int, path: str, level: int = 1) -> _Entries:
        """``(directory fd, entry, entry path)`` for each entry, a directory before its contents."""
        with os.scandir(dir_fd) as scan:
            for entry in scan:
                if self.scanned == MAX_ENTRIES:
                    self.truncated = True
                    return
                self.scanned += 1
                entry_path = f"{path}/{entry.name}" if path != "/" else f"/{entry.name}"
                yield dir_fd, entry, entry_path
                if self.recursive and entry.is_dir(follow_symlinks=False):
                    yield from self._descend(dir_fd, entry.name, entry_path, level + 1)
                    if self.truncated:
                        return

    def _descend(self, dir_fd: int, name: str, path: str, level: int) -> _Entries:
        if level > MAX_LEVELS:
            self.skipped += 1
            return
        try:
            child = open_child_directory(dir_fd, name, path)
        except (OSError, ValueError):
            self.skipped += 1
            return
        try:
            yield from self.entries(child, path, level)
        finally:
            os.close(child)


def _matching_lines(path: str, text: str, needle: str, fold: Callable[[str], str]) -> Iterator[SearchMatch]:
    if needle not in fold(text):  # one pass over the whole file rules out most files
        return
    for number, line in enumerate(text.split("\n"), start=1):
        if needle in fold(line):
            line = line.removesuffix("\r")
            yield SearchMatch(path, number, line[:MAX_LINE_CHARS], len(line) > MAX_LINE_CHARS)


def _file_entry(entry: os.DirEntry[str], path: str) -> FileEntry:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return FileEntry(path, "other")
    kind = entry_type(st.st_mode)
    return FileEntry(path, kind, st.st_size if kind == "file" else None)


def _text_or_none(data: bytes, size: int) -> str | None:
    """Decoded text, or None for binary, invalid UTF-8, or a file that grew while read."""
    if len(data) > size or b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _name_matcher(pattern: str) -> Callable[[str], bool]:
    if not pattern or "/" in pattern or "\0" in pattern:
        raise ValueError("pattern must be a non-empty filename glob without '/'")
    if pattern == "*":
        return _always
    compiled = re.compile(fnmatch.translate(pattern))
    return lambda name: compiled.match(name) is not None


def _check_max_results(max_results: int) -> None:
    if not 1 <= max_results <= MAX_RESULTS:
        raise ValueError(f"max_results must be between 1 and {MAX_RESULTS}")


def _always(name: str) -> bool:
    return True


def _same(text: str) -> str:
    return text
