"""Opaque identifiers for runs, tasks, actions and requests."""

from __future__ import annotations

import uuid


def new_id(prefix: str) -> str:
    """A fresh, unguessable identifier such as ``act_1f0c...``."""
    return f"{prefix}_{uuid.uuid4().hex}"
