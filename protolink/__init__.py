"""ProtoLink: an agent runtime and its built-in tools, with a locked-down container backend.

Public names load on first use, so ``import protolink.execution`` (what the sandbox server
needs) does not import the agent runtime.
"""

from __future__ import annotations

import importlib
from typing import Any

from .core import __all__ as _core_names

_LAZY = {
    **dict.fromkeys(_core_names, "protolink.core"),
    "StorageCheckpointStore": "protolink.core.resources",
    "Assistant": "protolink.agents",
}

__all__ = sorted(_LAZY)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
