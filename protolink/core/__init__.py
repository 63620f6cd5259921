"""The agent runtime; it knows no particular tool.

Names load on first use, so importing one module (``protolink.core.tools``) stays cheap. The
error types are :mod:`protolink.errors`, the bottom of the package; they are exported here too.
"""

from __future__ import annotations

from protolink._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "Action": ".tools",
    "Agent": ".agent",
    "AgentCard": ".cards",
    "ApprovalDecision": ".approvals",
    "ApprovalDeniedError": "protolink.errors",
    "ApprovalHandler": ".approvals",
    "ApprovalRequest": ".approvals",
    "Artifact": ".tools",
    "AuthorizationError": "protolink.errors",
    "BudgetExceededError": "protolink.errors",
    "CapabilityPolicy": ".policy",
    "DirectCallError": "protolink.errors",
    "Effect": ".policy",
    "Event": ".events",
    "EventBus": ".events",
    "Policy": ".policy",
    "PolicyDeniedError": "protolink.errors",
    "Preparation": ".tools",
    "PreparedTool": ".tools",
    "ProtoLinkError": "protolink.errors",
    "ResourceConflictError": "protolink.errors",
    "RunContext": ".runs",
    "SerializationError": "protolink.errors",
    "StorageError": "protolink.errors",
    "Subscription": ".events",
    "Tool": ".tools",
    "ToolArgumentError": "protolink.errors",
    "ToolContext": ".tools",
    "ToolExecutionError": "protolink.errors",
    "ToolNotFoundError": "protolink.errors",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
