"""The agent runtime; it knows no particular tool.

Names load on first use, so importing one module (``protolink.core.tools``) stays cheap. The
error types are :mod:`protolink.errors`, the bottom of the package; they are exported here too.
"""

from __future__ import annotations

from protolink._exports import CORE
from protolink._lazy import lazy_exports

_EXPORTS = CORE

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
