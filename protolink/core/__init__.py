"""The agent runtime; it knows no particular tool.

Names load on first use, so importing one module (``protolink.core.errors``) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "Action": "tools",
    "Agent": "agent",
    "AgentCard": "cards",
    "ApprovalDecision": "approvals",
    "ApprovalDeniedError": "errors",
    "ApprovalHandler": "approvals",
    "ApprovalRequest": "approvals",
    "Artifact": "tools",
    "AuthorizationError": "errors",
    "BudgetExceededError": "errors",
    "CapabilityPolicy": "policy",
    "DirectCallError": "errors",
    "Effect": "policy",
    "Event": "events",
    "EventBus": "events",
    "Policy": "policy",
    "PolicyDeniedError": "errors",
    "Preparation": "tools",
    "PreparedTool": "tools",
    "ProtoLinkError": "errors",
    "ResourceConflictError": "errors",
    "RunContext": "runs",
    "SerializationError": "errors",
    "StorageError": "errors",
    "Subscription": "events",
    "Tool": "tools",
    "ToolArgumentError": "errors",
    "ToolContext": "tools",
    "ToolExecutionError": "errors",
    "ToolNotFoundError": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
