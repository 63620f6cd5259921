"""Revisions of resources: what a file (or any resource) looked like when it was observed.

A :class:`ResourceRevision` records what is known of one state (existence, size, SHA-256, mode,
identity); :meth:`~ResourceRevision.matches` compares only what it records. A
:class:`ResourceSnapshot` is a revision with its exact bytes. Execution backends produce them;
recovery records (:mod:`protolink.core.resources`) keep them.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Identity = tuple[int, int]


@dataclass(frozen=True)
class ResourceRevision:
    """One observed (or planned) state of a resource.

    ``identity`` and ``parent_identity`` are ``(device, inode)`` pairs for files. A field left
    ``None`` is unknown and is not compared by :meth:`matches`.
    """

    resource_id: str
    exists: bool
    size: int | None = None
    sha256: str | None = None
    mode: int | None = None
    identity: Identity | None = None
    parent_identity: Identity | None = None

    def matches(self, actual: ResourceRevision) -> bool:
        """True when ``actual`` agrees with every field this revision records."""
        if (self.resource_id, self.exists) != (actual.resource_id, actual.exists):
            return False
        recorded = ("size", "sha256", "mode", "identity", "parent_identity")
        return all(getattr(self, name) in (None, getattr(actual, name)) for name in recorded)

    def to_dict(self) -> dict[str, Any]:
        return {
            "resource_id": self.resource_id,
            "exists": self.exists,
            "size": self.size,
            "sha256": self.sha256,
            "mode": self.mode,
            "identity": None if self.identity is None else list(self.identity),
            "parent_identity": None if self.parent_identity is None else list(self.parent_identity),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResourceRevision:
        return cls(
            resource_id=str(data["resource_id"]),
            exists=bool(data["exists"]),
            size=_optional_int(data.get("size")),
            sha256=None if data.get("sha256") is None else str(data["sha256"]),
            mode=_optional_int(data.get("mode")),
            identity=_identity(data.get("identity")),
            parent_identity=_identity(data.get("parent_identity")),
        )


@dataclass(frozen=True)
class ResourceSnapshot:
    """A revision together with its exact bytes (``None`` when the resource is absent)."""

    revision: ResourceRevision
    data: bytes | None

    @property
    def resource_id(self) -> str:
        return self.revision.resource_id

    @property
    def exists(self) -> bool:
        return self.revision.exists

    def to_dict(self) -> dict[str, Any]:
        encoded = None if self.data is None else base64.b64encode(self.data).decode("ascii")
        return {"revision": self.revision.to_dict(), "data": encoded}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResourceSnapshot:
        encoded = data.get("data")
        raw = None if encoded is None else base64.b64decode(encoded, validate=True)
        return cls(revision=ResourceRevision.from_dict(data["revision"]), data=raw)


def revision_of(resource_id: str, data: bytes, *, mode: int, identity: Identity | None = None,
                parent_identity: Identity | None = None) -> ResourceRevision:
    """The revision of existing content ``data`` (size and SHA-256 computed here)."""
    return ResourceRevision(resource_id, True, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                            mode=mode, identity=identity, parent_identity=parent_identity)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _identity(value: Any) -> Identity | None:
    if value is None:
        return None
    device, inode = value
    return int(device), int(inode)
