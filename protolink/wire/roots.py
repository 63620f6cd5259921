"""Roots as both sides describe them: host directories mounted at the same absolute path inside
a sandbox, read-only unless writable."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Root:
    """A host directory mounted at the same absolute path inside the sandbox."""

    path: str
    writable: bool = False

    @classmethod
    def parse(cls, text: str) -> Root:
        """``PATH``, ``PATH:ro`` or ``PATH:rw`` (the command line and ``PROTOLINK_SANDBOX_ROOTS``)."""
        path, _, mode = text.rpartition(":") if text.endswith((":ro", ":rw")) else (text, "", "ro")
        return cls(path, writable=mode == "rw")
