"""The host side of the sandbox appliance: the gRPC client backend and the Docker lifecycle.

Names load on first use, so ``python -m protolink.sandbox.protogen`` runs before the
generated code exists.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "errors": "protolink.sandbox.errors",
    "connect": "protolink.sandbox.client",
    "SandboxBackend": "protolink.sandbox.client",
    "SandboxInfo": "protolink.sandbox.client",
    "DockerSandbox": "protolink.sandbox.docker",
    "Root": "protolink.sandbox.docker",
    "reap": "protolink.sandbox.reaper",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    value = module if module.__name__.endswith(f".{name}") else getattr(module, name)
    globals()[name] = value
    return value
