"""Located sections and the limits that bound an extraction.

A section is one located piece of a document: text (a file, a PDF page, a Word paragraph) or
one table row of string cells (a CSV record, a Word table row, a worksheet row). Locations are
small mappings of one-based positions: ``{"line": 1}``, ``{"page": 3}``, ``{"row": 2}``,
``{"paragraph": 4}``, ``{"table": 1, "row": 2}``, ``{"sheet": "Q1", "row": 7}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_COLUMNS = 100

Location = Mapping[str, "int | str"]


@dataclass(frozen=True)
class DocumentLimits:
    """Bounds of one extraction: input bytes, output characters shared by text and cells,
    sections, declared expanded bytes of an Office archive, and the worker timeout."""

    max_file_bytes: int = 8_388_608
    max_output_chars: int = 20_000
    max_sections: int = 100
    max_archive_bytes: int = 33_554_432
    timeout_seconds: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "max_output_chars", "max_sections", "max_archive_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        timeout = self.timeout_seconds
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise ValueError(f"timeout_seconds must be a positive finite number, not {timeout!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_file_bytes": self.max_file_bytes,
            "max_output_chars": self.max_output_chars,
            "max_sections": self.max_sections,
            "max_archive_bytes": self.max_archive_bytes,
            "timeout_seconds": self.timeout_seconds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DocumentLimits:
        return cls(**{name: data[name] for name in cls().to_dict()})


@dataclass(frozen=True)
class DocumentSection:
    """Located text, or one located row of string cells; exactly one of ``text``/``cells``."""

    location: Location
    text: str | None = None
    cells: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.cells is None):
            raise ValueError("a section holds either text or cells")
        if not isinstance(self.location, Mapping) or not all(
            isinstance(key, str) and isinstance(value, (int, str)) and not isinstance(value, bool)
            for key, value in self.location.items()
        ):
            raise ValueError("a section location maps names to integers or strings")
        if self.text is not None and not isinstance(self.text, str):
            raise ValueError("section text must be a string")
        if self.cells is not None and not all(isinstance(cell, str) for cell in self.cells):
            raise ValueError("section cells must be strings")
        object.__setattr__(self, "location", dict(self.location))
        if self.cells is not None:
            object.__setattr__(self, "cells", tuple(self.cells))

    @property
    def empty(self) -> bool:
        """True when the section carries no visible content (blank text, all-empty cells)."""
        if self.text is not None:
            return not self.text.strip()
        return not any(self.cells or ())

    def to_dict(self) -> dict[str, Any]:
        if self.text is not None:
            return {"location": dict(self.location), "text": self.text}
        return {"location": dict(self.location), "cells": list(self.cells or ())}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DocumentSection:
        cells = data.get("cells")
        return cls(
            location=data["location"],
            text=data.get("text"),
            cells=None if cells is None else tuple(cells),
        )


@dataclass
class _Budget:
    chars: int
    sections: list[DocumentSection] = field(default_factory=list)
    truncated: bool = False


def bounded_sections(
    sections: Iterable[DocumentSection], limits: DocumentLimits
) -> tuple[tuple[DocumentSection, ...], bool]:
    """Keep sections in order until ``max_sections`` or the shared character budget is spent.

    Empty sections are skipped. Rows keep at most :data:`MAX_COLUMNS` cells (trailing empty
    cells are dropped first); the rows after a cut one are kept. Returns the kept sections and whether anything was left out; the
    source is consumed only as far as needed, so parsing stops early.
    """
    budget = _Budget(chars=limits.max_output_chars)
    for section in sections:
        if section.empty:
            continue
        if len(budget.sections) == limits.max_sections or budget.chars == 0:
            budget.truncated = True
            break
        if section.text is not None:
            _add_text(budget, section)
        else:
            _add_row(budget, section)
    return tuple(budget.sections), budget.truncated


def _add_text(budget: _Budget, section: DocumentSection) -> None:
    text = section.text or ""
    if len(text) > budget.chars:
        text = text[: budget.chars]
        budget.truncated = True
    budget.chars -= len(text)
    budget.sections.append(DocumentSection(section.location, text=text))


def _add_row(budget: _Budget, section: DocumentSection) -> None:
    cells = list(section.cells or ())
    while cells and not cells[-1]:
        cells.pop()
    if len(cells) > MAX_COLUMNS:
        del cells[MAX_COLUMNS:]
        budget.truncated = True
    kept: list[str] = []
    for cell in cells:
        if len(cell) > budget.chars:
            kept.append(cell[: budget.chars])
            budget.truncated = True
            budget.chars = 0
            break
        kept.append(cell)
        budget.chars -= len(cell)
    budget.sections.append(DocumentSection(section.location, cells=tuple(kept)))
