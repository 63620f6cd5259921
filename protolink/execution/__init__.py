"""Where things run: process types and backends, workspace file operations, document extraction.

This package holds the one implementation of each rule; the host tools and the sandbox server
both call it.
"""

from __future__ import annotations

from protolink._lazy import lazy_exports

# Names load on first use: `protolink-sandbox exec` imports one small module of this package.
_EXPORTS = {
    "ExecutionBackend": "protolink.execution.backends",
    **dict.fromkeys(["ProcessCancelledError", "ProcessResult", "ProcessSpec"], "protolink.execution.process_types"),
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
