"""The public names of the agent runtime and where each lives, for ``protolink`` and
``protolink.core`` alike (both load them on first use). Importing this imports nothing else."""

from __future__ import annotations

CORE: dict[str, str] = {
    "Action": "protolink.core.tools",
    "Agent": "protolink.core.agent",
    "AgentCard": "protolink.core.cards",
    "ApprovalDecision": "protolink.core.approvals",
    "ApprovalDeniedError": "protolink.errors",
    "ApprovalHandler": "protolink.core.approvals",
    "ApprovalRequest": "protolink.core.approvals",
    "Artifact": "protolink.core.tools",
    "AuthorizationError": "protolink.errors",
    "BudgetExceededError": "protolink.errors",
    "CapabilityPolicy": "protolink.core.policy",
    "DirectCallError": "protolink.errors",
    "Effect": "protolink.core.policy",
    "Event": "protolink.core.events",
    "EventBus": "protolink.core.events",
    "Policy": "protolink.core.policy",
    "PolicyDeniedError": "protolink.errors",
    "Preparation": "protolink.core.tools",
    "PreparedTool": "protolink.core.tools",
    "ProtoLinkError": "protolink.errors",
    "ResourceConflictError": "protolink.errors",
    "RunContext": "protolink.core.runs",
    "SerializationError": "protolink.errors",
    "StorageError": "protolink.errors",
    "Subscription": "protolink.core.events",
    "Tool": "protolink.core.tools",
    "ToolArgumentError": "protolink.errors",
    "ToolContext": "protolink.core.tools",
    "ToolExecutionError": "protolink.errors",
    "ToolNotFoundError": "protolink.errors",
}
