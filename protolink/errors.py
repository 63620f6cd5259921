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
    ├── ResourceUnchangedError   (OSError)       a replacement failed before its commit point
    ├── SerializationError       (ValueError)    a configuration cannot be (de)serialized
    ├── StorageError             (RuntimeError)  storage is unreadable or corrupt
    ├── DocumentError            (ValueError)    a document cannot be extracted
    ├── ArchiveError             (ValueError)    a transferred tree holds an unsafe entry
    ├── TransferLimitError       (ValueError)    a transfer goes past one of its limits
    ├── TransferAbandonedError   (ConnectionError) an upload's stream ended before its end
    └── SandboxError             (RuntimeError)  the sandbox failed, or refused the call
        ├── SandboxUnavailableError                dead, unreachable or unresponsive
        │   ├── SandboxNotReachedError             no connection: the call never left the host
        │   ├── SandboxProtectionError             the server found a protection missing and refused
        │   ├── SandboxLostError                   its node or task is gone: never recreated
        │   └── SandboxEngineError                 the Docker Engine lacks something a sandbox needs
        ├── RootNotWritableError   (PermissionError) a writable root the command user cannot write
        ├── CaFileError            (ValueError)    a CA file that is missing, too large or holds no certificate
        ├── SandboxProtocolError                   a malformed, oversized or unexpected answer
        ├── SandboxAuthenticationError             the token is missing or wrong
        ├── SandboxLimitError                      a supervised worker hit a hard limit and was killed
        ├── SandboxNotFoundError   (LookupError)   the service has no such sandbox for this token
        ├── SandboxPermissionError (PermissionError) the service's configuration does not allow it
        ├── QuotaExceededError                     a token's quota of sandboxes, memory or CPUs is spent
        ├── RepositoryError                        a CI job's repository cannot be fetched or copied
        ├── CertificateMismatchError               the service's TLS certificate is not the pinned one
        └── AuditLogError                          the audit log cannot be read, continued or written

Leaves also subclass the builtin a caller would naturally catch. Tools raise the spec's
documented builtins (``ValueError``, ``RuntimeError``) directly where the spec names them.
This module is the bottom of the package: it imports nothing of ProtoLink. How sandbox
errors cross the wire is :mod:`protolink.wire.status`.
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


class ResourceUnchangedError(ProtoLinkError, OSError):
    """A replacement failed before its commit point (a read-only or full file system, say):
    the resource is unchanged, so the change is recorded as failed rather than uncertain."""

    @classmethod
    def of(cls, path: str, error: OSError) -> ResourceUnchangedError:
        """The error for a replacement of ``path`` that ``error`` stopped before its commit point
        (on the host; in a sandbox, a write its server refuses before performing it)."""
        return cls(error.errno, f"{path} was not changed: {error.strerror or error}")


class SerializationError(ProtoLinkError, ValueError):
    """An agent configuration cannot be serialized or loaded."""


class StorageError(ProtoLinkError, RuntimeError):
    """A storage backend is unreadable, corrupt, or refused an operation."""


class DocumentError(ProtoLinkError, ValueError):
    """A document cannot be extracted: unsupported, encrypted, malformed, or over a limit."""


class ArchiveError(ProtoLinkError, ValueError):
    """A transferred tree holds an entry that is never written: an absolute or ``..`` name, a
    link out of the destination, a hard link, a special file, set-id bits, or a write through a
    symlink. Nothing of the transfer is left behind."""


class TransferLimitError(ProtoLinkError, ValueError):
    """A transfer goes past one of its limits (bytes, files, path length, depth); nothing of it
    is left behind."""


class TransferAbandonedError(ProtoLinkError, ConnectionError):
    """An upload's stream ended before its end (the caller stopped sending, or the call ended
    first); nothing of it is kept."""


class SandboxError(ProtoLinkError, RuntimeError):
    """The sandbox failed or refused the call."""


class SandboxUnavailableError(SandboxError):
    """The sandbox is dead, unreachable or does not answer in time."""


class SandboxNotReachedError(SandboxUnavailableError):
    """No connection to the sandbox could be made: the call was never sent, so it is safe to
    make again."""


class SandboxProtectionError(SandboxUnavailableError):
    """The sandbox's server refused to serve because a protection it checks at start is missing
    (no_new_privs, seccomp, capabilities, network, read_only_root, pids_limit, memory_limit):
    ``missing`` maps each one's name to what the server found instead."""

    def __init__(self, message: str, *, missing: dict[str, str]) -> None:
        super().__init__(message)
        self.missing = missing


class SandboxLostError(SandboxUnavailableError):
    """The sandbox's task is gone (its node left or stopped, the task failed): its state is lost
    and it is never recreated; create a new one."""


class SandboxEngineError(SandboxUnavailableError):
    """The Docker Engine refused or failed what a sandbox needs; the message says what is missing
    (an image, a runtime, the bridge TCP mode publishes through) and keeps the engine's words."""


class RootNotWritableError(SandboxError, PermissionError):
    """A root declared writable that the sandbox's command user cannot write; the message names
    the root, the uid and gid, and the one command that fixes it."""

    def __init__(self, message: str, *, path: str, uid: int, gid: int, fix: str) -> None:
        super().__init__(message)
        self.path, self.uid, self.gid, self.fix = path, uid, gid, fix


class CaFileError(SandboxError, ValueError):
    """A certificate authority file given to a sandbox (``ca_file``) that is missing, not a
    readable regular file, too large, or holds no certificate; the message names the path."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class SandboxProtocolError(SandboxError):
    """The sandbox answered with something malformed, oversized or unexpected."""


class SandboxAuthenticationError(SandboxError):
    """The sandbox refused the call's credentials."""


class SandboxLimitError(SandboxError):
    """A supervised worker exceeded a hard limit (memory, CPU time) and was killed."""


class SandboxNotFoundError(SandboxError, LookupError):
    """The sandbox service has no such sandbox for this token (one another token owns looks the same)."""


class SandboxPermissionError(SandboxError, PermissionError):
    """The sandbox service's configuration does not allow what was asked (a host root, say)."""


class QuotaExceededError(SandboxError):
    """A token's quota (concurrent sandboxes, total memory, total CPUs) would be exceeded; refused at once."""


class RepositoryError(SandboxError):
    """A CI job's repository could not be fetched (cloned) or copied into its workspace."""


class CertificateMismatchError(SandboxError):
    """A server (the service, a node's gateway, a sandbox in TCP mode) presented a TLS
    certificate whose fingerprint is not the one the client pins."""


class AuditLogError(SandboxError):
    """The service's audit log cannot be read, continued (its last line is not a valid record)
    or written; the message names the file."""
