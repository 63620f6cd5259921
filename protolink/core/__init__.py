"""The agent runtime; it knows no particular tool.

Names load on first use, so importing one module (``protolink.core.errors``) stays cheap.
"""

from __future__ import annotations

from protolink._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "Action": ".tools",
    "Agent": ".agent",
    "AgentCard": ".cards",
    "ApprovalDecision": ".approvals",
    "ApprovalDeniedError": ".errors",
    "ApprovalHandler": ".approvals",
    "ApprovalRequest": ".approvals",
    "Artifact": ".tools",
    "AuthorizationError": ".errors",
    "BudgetExceededError": ".errors",
    "CapabilityPolicy": ".policy",
    "DirectCallError": ".errors",
    "Effect": ".policy",
    "Event": ".events",
    "EventBus": ".events",
    "Policy": ".policy",
    "PolicyDeniedError": ".errors",
    "Preparation": ".tools",
    "PreparedTool": ".tools",
    "ProtoLinkError": ".errors",
    "ResourceConflictError": ".errors",
    "RunContext": ".runs",
    "SerializationError": ".errors",
    "StorageError": ".errors",
    "Subscription": ".events",
    "Tool": ".tools",
    "ToolArgumentError": ".errors",
    "ToolContext": ".tools",
    "ToolExecutionError": ".errors",
    "ToolNotFoundError": ".errors",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
