"""The host side of the sandbox appliance: the gRPC client backend and the Docker lifecycle.

Names load on first use, so ``python -m protolink.wire.protogen`` runs before the
generated code exists.
"""

from __future__ import annotations

from protolink._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["SandboxError", "SandboxUnavailableError", "SandboxNotReachedError", "SandboxEngineError",
                     "SandboxProtectionError", "SandboxLostError", "RootNotWritableError", "CaFileError",
                     "SandboxProtocolError", "SandboxAuthenticationError", "SandboxLimitError"],
                    "protolink.errors"),
    "connect": "protolink.sandbox.client",
    "SandboxBackend": "protolink.sandbox.client",
    "SandboxInfo": "protolink.sandbox.client",
    "DockerSandbox": "protolink.sandbox.docker",
    "SandboxConfig": "protolink.sandbox.config",
    "Root": "protolink.wire.roots",
    "reap": "protolink.sandbox.leftovers",
    **dict.fromkeys(["upload", "download", "TransferLimits", "TransferResult"], "protolink.sandbox.transfer"),
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
