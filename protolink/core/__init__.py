"""The agent runtime; it knows no particular tool."""

from .agent import Agent
from .approvals import ApprovalDecision, ApprovalHandler, ApprovalRequest
from .cards import AgentCard
from .errors import (
    ApprovalDeniedError,
    AuthorizationError,
    BudgetExceededError,
    DirectCallError,
    PolicyDeniedError,
    ProtoLinkError,
    ResourceConflictError,
    SerializationError,
    StorageError,
    ToolArgumentError,
    ToolExecutionError,
    ToolNotFoundError,
)
from .events import Event, EventBus, Subscription
from .policy import CapabilityPolicy, Effect, Policy
from .runs import RunContext
from .tools import Action, Artifact, Preparation, PreparedTool, Tool, ToolContext

__all__ = [
    "Action", "Agent", "AgentCard", "ApprovalDecision", "ApprovalDeniedError", "ApprovalHandler",
    "ApprovalRequest", "Artifact", "AuthorizationError", "BudgetExceededError", "CapabilityPolicy",
    "DirectCallError", "Effect", "Event", "EventBus", "Policy", "PolicyDeniedError", "Preparation",
    "PreparedTool", "ProtoLinkError", "ResourceConflictError", "RunContext", "SerializationError",
    "StorageError", "Subscription", "Tool", "ToolArgumentError", "ToolContext", "ToolExecutionError",
    "ToolNotFoundError",
]
