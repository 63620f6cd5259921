"""The sandbox service: one sandbox per request, per token, from warm pools; see docs/service.md.

``connect(address, token=...)`` gives an async :class:`ServiceClient`; :class:`SyncServiceClient`
is the same for scripts and notebooks. ``python -m protolink.sandbox.service`` runs the service.
"""

from __future__ import annotations

from protolink._lazy import lazy_exports

_EXPORTS = {
    "connect": ".client",
    "ServiceClient": ".client",
    "Sandbox": ".client",
    "SandboxStatus": ".client",
    "SyncServiceClient": ".sync",
    "SyncSandbox": ".sync",
    "ServiceEvent": ".events",
    "EventSink": ".events",
    "ServiceConfig": ".config",
    "Template": ".config",
    "Quota": ".tokens",
    "Tokens": ".tokens",
    "serve": ".daemon",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
