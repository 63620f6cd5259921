"""gRPC statuses and sandbox errors are translated in one place, for every status and kind."""

from __future__ import annotations

import errno

import grpc
import pytest

from protolink.errors import (
    ArchiveError,
    CaFileError,
    DocumentError,
    ResourceConflictError,
    ResourceUnchangedError,
    RootNotWritableError,
    SandboxAuthenticationError,
    SandboxError,
    SandboxLimitError,
    SandboxProtectionError,
    SandboxProtocolError,
    SandboxUnavailableError,
    ToolExecutionError,
    TransferAbandonedError,
    TransferLimitError,
)
from protolink.wire._pb import errors_pb2
from protolink.wire.status import (
    ERROR_METADATA_KEY,
    KINDS,
    STATUSES,
    from_status,
    to_status,
)


def _metadata(error: errors_pb2.Error) -> tuple[tuple[str, bytes], ...]:
    return ((ERROR_METADATA_KEY, error.SerializeToString()),)


def _roundtrip(error: BaseException) -> Exception:
    code, wire = to_status(error)
    return from_status(code, wire.message, _metadata(wire))


def test_every_grpc_status_code_is_mapped():
    assert set(STATUSES) == set(grpc.StatusCode)
    for code in grpc.StatusCode:
        if code is not grpc.StatusCode.OK:
            assert isinstance(from_status(code, "details"), SandboxError)


def test_every_error_kind_is_mapped():
    kinds = {value.number for value in errors_pb2.ErrorKind.DESCRIPTOR.values} - {errors_pb2.ERROR_KIND_UNSPECIFIED}
    assert set(KINDS) == kinds


def test_transport_faults_become_sandbox_errors():
    assert isinstance(from_status(grpc.StatusCode.UNAVAILABLE, "connection refused"), SandboxUnavailableError)
    assert isinstance(from_status(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline"), SandboxUnavailableError)
    assert isinstance(from_status(grpc.StatusCode.UNAUTHENTICATED, "token"), SandboxAuthenticationError)
    oversized = from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max")
    assert isinstance(oversized, SandboxProtocolError) and "larger than max" in str(oversized)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("path '/x' must be absolute"),
        FileNotFoundError(errno.ENOENT, "/ws/a does not exist"),
        FileExistsError(errno.EEXIST, "/ws/a exists"),
        PermissionError(errno.EACCES, "/ws/a is in a read-only root"),
        ResourceConflictError("/ws/a changed since it was approved"),
        ResourceUnchangedError(errno.ENOSPC, "/ws/a was not changed: No space left on device"),
        TimeoutError("document extraction did not finish within 1 seconds"),
        RuntimeError("xlsx extraction requires openpyxl"),
        ToolExecutionError("could not start '/bin/nope': No such file or directory"),
        DocumentError("/ws/a.pdf: encrypted documents are unsupported"),
        ArchiveError("'../x' contains '..'"),
        TransferLimitError("/ws/big is 2048 bytes; the limit is 1024"),
        TransferAbandonedError("the upload ended before its data did; nothing of it was kept"),
        SandboxLimitError("document extraction was stopped"),
        OSError(errno.EIO, "input/output error"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_operation_errors_are_raised_on_the_host_as_the_same_type(error):
    raised = _roundtrip(error)
    assert type(raised) is type(error)
    assert str(raised) == str(error)
    if isinstance(error, OSError):
        assert raised.errno == error.errno


def test_unexpected_errors_reveal_nothing_of_the_server():
    code, wire = to_status(KeyError("/etc/shadow secret"))
    assert code is grpc.StatusCode.INTERNAL and wire.message == "internal sandbox error"
    raised = from_status(code, wire.message, _metadata(wire))
    assert type(raised) is SandboxError and "secret" not in str(raised)


def test_a_kind_that_disagrees_with_its_status_is_not_trusted():
    # A lying server cannot turn a transport fault into, say, a "file not found".
    wire = errors_pb2.Error(kind=errors_pb2.ERROR_KIND_NOT_FOUND, message="nope")
    raised = from_status(grpc.StatusCode.UNAVAILABLE, "gone", _metadata(wire))
    assert isinstance(raised, SandboxUnavailableError)


@pytest.mark.parametrize("metadata", [
    ((ERROR_METADATA_KEY, b"\xff\xfe not a message"),),
    ((ERROR_METADATA_KEY, errors_pb2.Error(kind=999, message="x").SerializeToString()),),
    "not pairs",
    None,
])
def test_garbage_error_metadata_falls_back_to_the_status(metadata):
    raised = from_status(grpc.StatusCode.ABORTED, "aborted", metadata)
    assert isinstance(raised, SandboxProtocolError)


def test_an_oversized_message_is_clipped():
    wire = errors_pb2.Error(kind=errors_pb2.ERROR_KIND_INVALID_ARGUMENT, message="x" * 100_000)
    raised = from_status(grpc.StatusCode.INVALID_ARGUMENT, "", _metadata(wire))
    assert isinstance(raised, ValueError) and len(str(raised)) < 5_000


def test_a_missing_protection_crosses_the_wire_with_what_was_found():
    code, wire = to_status(SandboxProtectionError("refused", missing={"seccomp": "mode 0"}))
    raised = from_status(code, wire.message, _metadata(wire))
    assert isinstance(raised, SandboxProtectionError) and raised.missing == {"seccomp": "mode 0"}
    assert str(raised) == "refused"


def test_a_ca_file_error_crosses_the_wire_with_its_path():
    code, wire = to_status(CaFileError("ca_file /etc/ca.pem: No such file or directory", path="/etc/ca.pem"))
    raised = from_status(code, wire.message, _metadata(wire))
    assert isinstance(raised, CaFileError) and raised.path == "/etc/ca.pem"
    assert str(raised) == "ca_file /etc/ca.pem: No such file or directory"


def test_a_root_not_writable_crosses_the_wire_with_its_fix():
    error = RootNotWritableError("root /srv/data is not writable by uid 1500: chown 1500:1500 /srv/data",
                                 path="/srv/data", uid=1500, gid=1500, fix="chown 1500:1500 /srv/data")
    code, wire = to_status(error)
    raised = from_status(code, wire.message, _metadata(wire))
    assert isinstance(raised, RootNotWritableError) and str(raised) == str(error)
    assert (raised.path, raised.uid, raised.gid, raised.fix) == ("/srv/data", 1500, 1500, "chown 1500:1500 /srv/data")
