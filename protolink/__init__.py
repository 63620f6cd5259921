"""ProtoLink: an agent runtime and its built-in tools, with a locked-down container backend."""

from __future__ import annotations

import importlib
from typing import Any

from .core import *  # noqa: F403
from .core import __all__ as _core_all

_LAZY = {
    "StorageCheckpointStore": "protolink.core.resources",
    "Assistant": "protolink.agents",
}

__all__ = sorted([*_core_all, *_LAZY])
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
