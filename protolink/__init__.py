"""ProtoLink: an agent runtime and its built-in tools, with a locked-down container backend.

Public names load on first use, so ``import protolink.execution`` (what the sandbox server
needs) does not import the agent runtime.
"""

from __future__ import annotations

from ._exports import CORE
from ._lazy import lazy_exports

_LAZY = {
    **CORE,
    "StorageCheckpointStore": "protolink.core.resources",
    "Assistant": "protolink.agents",
}

__all__ = sorted(_LAZY)
__version__ = "0.1.0"

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
