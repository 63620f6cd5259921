"""The one place where gRPC statuses and our exceptions are translated (the errors themselves
are in :mod:`protolink.errors`).

Operation errors (a bad path, a conflict, a missing file) cross the wire as a status code plus
an :class:`~protolink.wire._pb.errors_pb2.Error` (kind and safe message) in the trailing
metadata, and are raised on the host as the same builtin or ProtoLink types the local backend
raises. Class names and tracebacks never cross the wire.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple, NoReturn, TypeVar

import grpc
from google.protobuf.message import DecodeError

from protolink.errors import (
    ArchiveError,
    CaFileError,
    DocumentError,
    QuotaExceededError,
    ResourceConflictError,
    ResourceUnchangedError,
    RootNotWritableError,
    SandboxAuthenticationError,
    SandboxError,
    SandboxLimitError,
    SandboxLostError,
    SandboxNotFoundError,
    SandboxNotReachedError,
    SandboxPermissionError,
    SandboxProtectionError,
    SandboxProtocolError,
    SandboxUnavailableError,
    ToolExecutionError,
    TransferAbandonedError,
    TransferLimitError,
)

from ._pb import errors_pb2

T = TypeVar("T")

ERROR_METADATA_KEY = "protolink-error-bin"
#: How gRPC's channel fails a call it could not send because no connection could be made.
NOT_CONNECTED_DETAILS = "failed to connect to all addresses"
#: The details of the INTERNAL status grpcio puts in place of the other side's when a write
#: fails because that side has just ended the call (grpc/grpc#36066).
WRITE_FAILED_DETAILS = "Internal error from Core"
MAX_MESSAGE_CHARS = 4096
#: The most missing protections an untrusted answer may name (the server checks seven).
MAX_MISSING = 16
Kind = errors_pb2.ErrorKind


#: Each error kind: the status it travels with, and the exception raised on the host.
KINDS: dict[int, tuple[grpc.StatusCode, type[Exception]]] = {
    Kind.ERROR_KIND_INVALID_ARGUMENT: (grpc.StatusCode.INVALID_ARGUMENT, ValueError),
    Kind.ERROR_KIND_NOT_FOUND: (grpc.StatusCode.NOT_FOUND, FileNotFoundError),
    Kind.ERROR_KIND_ALREADY_EXISTS: (grpc.StatusCode.ALREADY_EXISTS, FileExistsError),
    Kind.ERROR_KIND_PERMISSION_DENIED: (grpc.StatusCode.PERMISSION_DENIED, PermissionError),
    Kind.ERROR_KIND_CONFLICT: (grpc.StatusCode.ABORTED, ResourceConflictError),
    Kind.ERROR_KIND_TIMEOUT: (grpc.StatusCode.DEADLINE_EXCEEDED, TimeoutError),
    Kind.ERROR_KIND_FAILED: (grpc.StatusCode.FAILED_PRECONDITION, RuntimeError),
    Kind.ERROR_KIND_OS_ERROR: (grpc.StatusCode.FAILED_PRECONDITION, OSError),
    Kind.ERROR_KIND_LIMIT_EXCEEDED: (grpc.StatusCode.RESOURCE_EXHAUSTED, SandboxLimitError),
    Kind.ERROR_KIND_INTERNAL: (grpc.StatusCode.INTERNAL, SandboxError),
    Kind.ERROR_KIND_TOOL_EXECUTION: (grpc.StatusCode.FAILED_PRECONDITION, ToolExecutionError),
    Kind.ERROR_KIND_DOCUMENT: (grpc.StatusCode.INVALID_ARGUMENT, DocumentError),
    Kind.ERROR_KIND_RESOURCE_UNCHANGED: (grpc.StatusCode.FAILED_PRECONDITION, ResourceUnchangedError),
    Kind.ERROR_KIND_UNSAFE_ARCHIVE: (grpc.StatusCode.INVALID_ARGUMENT, ArchiveError),
    Kind.ERROR_KIND_TRANSFER_LIMIT: (grpc.StatusCode.OUT_OF_RANGE, TransferLimitError),
    Kind.ERROR_KIND_TRANSFER_ABANDONED: (grpc.StatusCode.ABORTED, TransferAbandonedError),
    Kind.ERROR_KIND_PROTECTION_MISSING: (grpc.StatusCode.FAILED_PRECONDITION, SandboxProtectionError),
    Kind.ERROR_KIND_SANDBOX_NOT_FOUND: (grpc.StatusCode.NOT_FOUND, SandboxNotFoundError),
    Kind.ERROR_KIND_QUOTA_EXCEEDED: (grpc.StatusCode.RESOURCE_EXHAUSTED, QuotaExceededError),
    Kind.ERROR_KIND_SANDBOX_PERMISSION_DENIED: (grpc.StatusCode.PERMISSION_DENIED, SandboxPermissionError),
    Kind.ERROR_KIND_UNAVAILABLE: (grpc.StatusCode.UNAVAILABLE, SandboxUnavailableError),
    Kind.ERROR_KIND_UNAUTHENTICATED: (grpc.StatusCode.UNAUTHENTICATED, SandboxAuthenticationError),
    Kind.ERROR_KIND_SANDBOX_LOST: (grpc.StatusCode.UNAVAILABLE, SandboxLostError),
    Kind.ERROR_KIND_CA_FILE: (grpc.StatusCode.FAILED_PRECONDITION, CaFileError),
    Kind.ERROR_KIND_ROOT_NOT_WRITABLE: (grpc.StatusCode.PERMISSION_DENIED, RootNotWritableError),
}

#: What a status without a (valid) error kind means: a transport or server fault.
STATUSES: dict[grpc.StatusCode, type[SandboxError] | None] = {
    grpc.StatusCode.OK: None,
    grpc.StatusCode.CANCELLED: SandboxUnavailableError,  # the server went away mid-call
    grpc.StatusCode.UNKNOWN: SandboxError,
    grpc.StatusCode.INVALID_ARGUMENT: SandboxProtocolError,
    grpc.StatusCode.DEADLINE_EXCEEDED: SandboxUnavailableError,
    # Every "not found" travels with its kind; a bare one can only mean no such sandbox.
    grpc.StatusCode.NOT_FOUND: SandboxNotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: SandboxProtocolError,
    grpc.StatusCode.PERMISSION_DENIED: SandboxProtocolError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: SandboxProtocolError,  # e.g. an oversized answer
    grpc.StatusCode.FAILED_PRECONDITION: SandboxProtocolError,
    grpc.StatusCode.ABORTED: SandboxProtocolError,
    grpc.StatusCode.OUT_OF_RANGE: SandboxProtocolError,
    grpc.StatusCode.UNIMPLEMENTED: SandboxProtocolError,  # a server of another version
    grpc.StatusCode.INTERNAL: SandboxProtocolError,  # e.g. an answer that does not parse
    grpc.StatusCode.UNAVAILABLE: SandboxUnavailableError,
    grpc.StatusCode.DATA_LOSS: SandboxProtocolError,
    grpc.StatusCode.UNAUTHENTICATED: SandboxAuthenticationError,
}

# Most specific first: the first class an exception is an instance of decides its kind.
_CLASSIFY: tuple[tuple[type[BaseException], int], ...] = (
    (SandboxProtectionError, Kind.ERROR_KIND_PROTECTION_MISSING),
    (SandboxLostError, Kind.ERROR_KIND_SANDBOX_LOST),
    (SandboxUnavailableError, Kind.ERROR_KIND_UNAVAILABLE),
    (SandboxLimitError, Kind.ERROR_KIND_LIMIT_EXCEEDED),
    (SandboxNotFoundError, Kind.ERROR_KIND_SANDBOX_NOT_FOUND),
    (QuotaExceededError, Kind.ERROR_KIND_QUOTA_EXCEEDED),
    (SandboxPermissionError, Kind.ERROR_KIND_SANDBOX_PERMISSION_DENIED),
    (SandboxAuthenticationError, Kind.ERROR_KIND_UNAUTHENTICATED),
    (CaFileError, Kind.ERROR_KIND_CA_FILE),
    (RootNotWritableError, Kind.ERROR_KIND_ROOT_NOT_WRITABLE),
    (SandboxError, Kind.ERROR_KIND_INTERNAL),
    (ResourceConflictError, Kind.ERROR_KIND_CONFLICT),
    (ResourceUnchangedError, Kind.ERROR_KIND_RESOURCE_UNCHANGED),
    (ToolExecutionError, Kind.ERROR_KIND_TOOL_EXECUTION),
    (DocumentError, Kind.ERROR_KIND_DOCUMENT),
    (ArchiveError, Kind.ERROR_KIND_UNSAFE_ARCHIVE),
    (TransferLimitError, Kind.ERROR_KIND_TRANSFER_LIMIT),
    (TransferAbandonedError, Kind.ERROR_KIND_TRANSFER_ABANDONED),
    (FileNotFoundError, Kind.ERROR_KIND_NOT_FOUND),
    (FileExistsError, Kind.ERROR_KIND_ALREADY_EXISTS),
    (PermissionError, Kind.ERROR_KIND_PERMISSION_DENIED),
    (TimeoutError, Kind.ERROR_KIND_TIMEOUT),
    (OSError, Kind.ERROR_KIND_OS_ERROR),
    (ValueError, Kind.ERROR_KIND_INVALID_ARGUMENT),
    (RuntimeError, Kind.ERROR_KIND_FAILED),
)


def to_status(error: BaseException) -> tuple[grpc.StatusCode, errors_pb2.Error]:
    """The status and wire error for an exception raised by an operation in the sandbox, or
    by the sandbox service refusing a call.

    Unexpected exceptions become ``INTERNAL`` with a fixed message: their text may hold
    details of the server, and only the server's log sees them.
    """
    kind = next((kind for cls, kind in _CLASSIFY if isinstance(error, cls)), Kind.ERROR_KIND_INTERNAL)
    if kind == Kind.ERROR_KIND_INTERNAL:
        return KINDS[kind][0], errors_pb2.Error(kind=kind, message="internal sandbox error")
    number = error.errno if isinstance(error, OSError) and isinstance(error.errno, int) else 0
    message = error.strerror if number and isinstance(error.strerror, str) else str(error)
    wire = errors_pb2.Error(kind=kind, message=message[:MAX_MESSAGE_CHARS], errno=number)
    if isinstance(error, SandboxProtectionError):
        wire.missing.update(error.missing)
    if isinstance(error, (CaFileError, RootNotWritableError)):
        wire.path = error.path[:MAX_MESSAGE_CHARS]
    if isinstance(error, RootNotWritableError):
        wire.uid, wire.gid, wire.fix = error.uid, error.gid, error.fix[:MAX_MESSAGE_CHARS]
    return KINDS[kind][0], wire


async def abort_with(context: grpc.aio.ServicerContext, status: tuple[grpc.StatusCode, errors_pb2.Error]) -> NoReturn:
    """End a server's call with ``status`` (:func:`to_status`'s pair): its code, and its wire error
    in the trailing metadata, from which the caller raises the same typed error."""
    code, wire = status
    await context.abort(code, wire.message, trailing_metadata=((ERROR_METADATA_KEY, wire.SerializeToString()),))
    raise AssertionError("unreachable")  # abort raises


def from_status(
    code: grpc.StatusCode, details: str | None, trailing_metadata: object = ()
) -> Exception:
    """The exception to raise on the host for a failed call.

    A valid error kind that agrees with the status gives the operation's own exception type;
    anything else is a sandbox fault chosen by the status alone. All of it is untrusted.
    """
    wire = _wire_error(trailing_metadata)
    if wire is not None and wire.kind in KINDS and KINDS[wire.kind][0] == code:
        return from_wire(wire)
    cls = STATUSES.get(code, SandboxProtocolError) or SandboxProtocolError
    if code == grpc.StatusCode.UNAVAILABLE and (details or "").startswith(NOT_CONNECTED_DETAILS):
        cls = SandboxNotReachedError
    name = code.name if isinstance(code, grpc.StatusCode) else str(code)
    return cls(f"sandbox call failed ({name}): {_clip(details or '')}".rstrip(": "))


def parsed_answer(answer: T | None) -> T:
    """``answer`` as received; grpc.aio hands over None (and logs) for one that does not parse."""
    if answer is None:
        raise SandboxProtocolError("the sandbox sent an answer that does not parse")
    return answer


def checked_answer(decode: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``decode(*args, **kwargs)`` of something the server sent; whatever does not fit its
    shape is the server's fault: SandboxProtocolError."""
    try:
        return decode(*args, **kwargs)
    except (TypeError, ValueError, KeyError) as error:
        raise SandboxProtocolError(f"the sandbox sent an invalid answer: {error}") from None


def from_wire(wire: errors_pb2.Error) -> Exception:
    """The exception to raise on the host for a wire error (an Execute ``error`` event, or the
    error a failed call carries); an unknown kind is a protocol fault. Untrusted."""
    if wire.kind not in KINDS:
        return SandboxProtocolError(f"the sandbox sent an error of unknown kind {wire.kind}")
    cls = KINDS[wire.kind][1]
    if wire.errno and issubclass(cls, OSError):
        return cls(wire.errno, _clip(wire.message))
    if cls is SandboxProtectionError:
        missing = list(wire.missing.items())[:MAX_MISSING]
        return SandboxProtectionError(_clip(wire.message), missing={_clip(name): _clip(found) for name, found in missing})
    if cls is CaFileError:
        return CaFileError(_clip(wire.message), path=_clip(wire.path))
    if cls is RootNotWritableError:
        return RootNotWritableError(_clip(wire.message), path=_clip(wire.path), uid=wire.uid, gid=wire.gid,
                                    fix=_clip(wire.fix))
    return cls(_clip(wire.message))


def from_rpc_error(error: grpc.RpcError) -> Exception:
    """:func:`from_status` for an error raised by a grpc.aio call."""
    return from_status(*Status.raised_by(error))


class Status(NamedTuple):
    """A call's status as the other side sent it."""

    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]

    @classmethod
    def raised_by(cls, error: grpc.RpcError) -> Status:
        """The status a call's ``error`` carries."""
        return cls(error.code(), error.details() or "", tuple(error.trailing_metadata() or ()))


class CallEnd:
    """The status ``call`` (a ``grpc.aio`` call that streams requests) ended with, as the other
    side sent it.

    grpcio (1.85; grpc/grpc#36066) sets INTERNAL "Internal error from Core" as a call's status
    when a write fails because the other side has just ended the call (a refusal that arrives
    while requests are still being written), before or after it sets the status that came: that
    one is then the call's first status or its last. The first is kept here (a call's done
    callbacks run as it is set); the last is the one the call raises. Of the two, the one that
    is not grpcio's INTERNAL of a failed write is the call's.
    """

    def __init__(self, call: grpc.aio.Call) -> None:
        self.status: Status | None = None
        call.add_done_callback(self._ended)

    def of(self, raised: Status) -> Status:
        """The call's status: the first one set, unless that was grpcio's INTERNAL of a failed
        write, and then ``raised``, the last (the one the call raises)."""
        if self.status is not None and not _write_failed(self.status):
            return self.status
        return raised

    def error(self, raised: Status) -> Exception:
        """The exception to raise on the host for the call's end (:func:`from_status`)."""
        return from_status(*self.of(raised))

    def _ended(self, call: grpc.aio.Call) -> None:
        if self.status is None:
            code, details, trailing = _at_once(call.code()), _at_once(call.details()), _at_once(call.trailing_metadata())
            if code is not None:
                self.status = Status(code, details or "", tuple(trailing or ()))


def _write_failed(status: Status) -> bool:
    """Whether ``status`` is grpcio's INTERNAL of a failed write, not one the other side sent."""
    return status.code == grpc.StatusCode.INTERNAL and status.details == WRITE_FAILED_DETAILS


def _at_once(coroutine: Coroutine[Any, Any, T]) -> T | None:
    """What ``coroutine`` returns when it finishes without waiting (a call's status once set), else None."""
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    coroutine.close()
    return None


def _wire_error(trailing_metadata: object) -> errors_pb2.Error | None:
    try:
        for key, value in trailing_metadata:  # type: ignore[attr-defined]
            if key == ERROR_METADATA_KEY and isinstance(value, bytes):
                return errors_pb2.Error.FromString(value)
    except (DecodeError, TypeError, ValueError):
        return None
    return None


def _clip(text: str) -> str:
    text = text if isinstance(text, str) else ""
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "…"
