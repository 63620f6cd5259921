"""The one error hierarchy of ProtoLink.

::

    ProtoLinkError
    ├── ToolArgumentError        (ValueError)    arguments fail the tool's input schema
    ├── ToolNotFoundError        (LookupError)   no tool of that name is registered
    ├── DirectCallError          (RuntimeError)  a PreparedTool was called outside an Agent
    ├── AuthorizationError       (PermissionError)
    │   ├── PolicyDeniedError                    the policy's effect is ``deny``
    │   └── ApprovalDeniedError                  declined, missing handler, or wrong request id
    ├── BudgetExceededError      (RuntimeError)  a run budget is spent
    ├── ToolExecutionError       (RuntimeError)  a tool failed while executing
    ├── ResourceConflictError    (RuntimeError)  a resource changed since it was approved or saved
    ├── SerializationError       (ValueError)    a configuration cannot be (de)serialized
    └── StorageError             (RuntimeError)  storage is unreadable or corrupt

Leaves also subclass the builtin a caller would naturally catch. Tools raise the spec's
documented builtins (``ValueError``, ``RuntimeError``) directly where the spec names them.
"""

from __future__ import annotations


class ProtoLinkError(Exception):
    """Root of every error ProtoLink raises on purpose."""


class ToolArgumentError(ProtoLinkError, ValueError):
    """Tool arguments do not satisfy the tool's input schema."""


class ToolNotFoundError(ProtoLinkError, LookupError):
    """No tool with the requested name is registered on the agent."""


class DirectCallError(ProtoLinkError, RuntimeError):
    """A prepared tool was called directly instead of through an Agent."""


class AuthorizationError(ProtoLinkError, PermissionError):
    """An action was not authorized to run."""


class PolicyDeniedError(AuthorizationError):
    """The capability policy denies the action."""


class ApprovalDeniedError(AuthorizationError):
    """Approval was declined, could not be requested, or answered the wrong request."""


class BudgetExceededError(ProtoLinkError, RuntimeError):
    """A run budget (tool calls or wall time) is exhausted."""


class ToolExecutionError(ProtoLinkError, RuntimeError):
    """A tool failed while executing."""


class ResourceConflictError(ProtoLinkError, RuntimeError):
    """A resource no longer matches the state that was approved or recorded."""


class SerializationError(ProtoLinkError, ValueError):
    """An agent configuration cannot be serialized or loaded."""


class StorageError(ProtoLinkError, RuntimeError):
    """A storage backend is unreadable, corrupt, or refused an operation."""
