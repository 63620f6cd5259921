"""Run one command in a sandbox appliance and pass its output through: ``protolink-sandbox exec``.

The command line's one call is timed against ``docker exec``, so it does not load grpcio,
protobuf or asyncio (together several times the cost of ``docker exec`` itself): it makes the
one ``Execute`` call :class:`~protolink.sandbox.client.SandboxBackend` makes for a process
(:mod:`.process_stream`), over :mod:`.grpc_call`, with the messages it needs encoded here
(their schema is ``proto/protolink/sandbox/v1/process.proto``; ``tests/unit/sandbox`` holds this
codec to the generated one). Every other client keeps using grpcio.

Given a ``stdin`` descriptor (``exec -i``), the command's standard input is a pipe fed from it:
what it holds goes as ``input`` requests of at most :data:`MAX_INPUT_BYTES`, one at a time as
the server's window takes them, until its end closes the pipe. A command that ends before it
has read everything ends the call all the same: the rest is never read.

What the server sends is untrusted and checked as :mod:`.process_stream` checks it: events in
order (started?, output*, finished, or an error), output capped at ``max_output_bytes``
whatever the server claims, a process that sends nothing for :data:`IDLE_SECONDS` given up,
and the whole call bounded by its timeout plus :data:`GRACE_SECONDS`. The output's bytes are
written as they arrive, exactly as the command wrote them.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from protolink.errors import SandboxNotReachedError, SandboxProtocolError, SandboxUnavailableError
from protolink.execution.output import OutputCap
from protolink.wire import protowire

from .addresses import socket_path
from .grpc_call import Call, authority, open_socket

EXECUTE_METHOD = "/protolink.sandbox.v1.Sandbox/Execute"
#: The same bounds as :mod:`.process_stream` and :mod:`.client` (held equal by the unit tests).
IDLE_SECONDS = 20.0
GRACE_SECONDS = 30.0
CONNECT_SECONDS = 5.0
#: An event holds at most the output cap in output, or an error message of 4096 characters.
EVENT_OVERHEAD_BYTES = 64 * 1024
#: The exit codes a Finished event may report (negative: killed by that signal).
EXIT_CODES = range(-255, 256)
STDOUT, STDERR = 1, 2
_VARINT, _FIXED64, _LENGTH = protowire.VARINT, protowire.FIXED64, protowire.LENGTH
_REQUEST_ID = 1
#: The most bytes of standard input one request carries (the server's limit, held equal by the unit tests).
MAX_INPUT_BYTES = 64 * 1024


class Command(NamedTuple):
    """What to run: the process spec's fields, as :func:`protolink.wire.convert.execute_request` sends them."""

    argv: Sequence[str]
    cwd: str
    env: Mapping[str, str]
    timeout_seconds: float
    max_output_bytes: int


class Outcome(NamedTuple):
    """How the command ended (its output was written already)."""

    exit_code: int | None
    timed_out: bool
    truncated: bool


def execute(address: str, token: str | None, command: Command, *, outputs: Mapping[int, int] | None = None,
            stdin: int | None = None, connect_seconds: float = 0.0, fingerprint: str | None = None) -> Outcome:
    """Run ``command`` in the appliance at ``address``, writing its output to the file
    descriptors ``outputs`` maps each channel to (default: this process's stdout and stderr),
    its standard input read from the descriptor ``stdin`` (None: empty). A TCP appliance speaks
    TLS: ``fingerprint`` is its certificate's (CertificateMismatchError for another).

    SandboxNotReachedError when nothing answers there (nothing ran); ``connect_seconds`` gives
    a server that is starting that long to answer. Other failures raise as :mod:`.client`'s do.
    """
    request = execute_request(command, stdin=stdin is not None)
    deadline = time.monotonic() + command.timeout_seconds + GRACE_SECONDS
    sock = _connect(address, connect_seconds)
    if socket_path(address) is None:
        sock = _pinned_tls(sock, address, fingerprint)
    metadata = [("authorization", f"Bearer {token}")] if token else []
    call = Call(sock, authority(address), EXECUTE_METHOD, metadata,
                max_message_bytes=max(command.max_output_bytes, 0) + EVENT_OVERHEAD_BYTES)
    try:
        call.settimeout(CONNECT_SECONDS)
        try:
            call.send(request, end=stdin is None)
        except TimeoutError:
            raise SandboxUnavailableError(f"the sandbox did not take the request within {CONNECT_SECONDS:g} s") from None
        return _follow(call, command, deadline, {STDOUT: 1, STDERR: 2} if outputs is None else outputs,
                       None if stdin is None else _Input(stdin))
    finally:
        call.close()


def _connect(address: str, seconds: float) -> socket.socket:
    """A socket connected to ``address``, trying again for up to ``seconds``."""
    until = time.monotonic() + seconds
    while True:
        try:
            return open_socket(address, CONNECT_SECONDS)
        except SandboxNotReachedError:
            if time.monotonic() >= until:
                raise
        time.sleep(0.02)


def _pinned_tls(sock: socket.socket, address: str, fingerprint: str | None) -> socket.socket:
    """``sock`` (connected to the TCP appliance at ``address``) in TLS, once the certificate it
    presented is the one ``fingerprint`` pins; closed otherwise."""
    from .digests import SERVER_NAME, check_pinned, pinning_context

    try:
        if fingerprint is None:
            raise SandboxNotReachedError(f"the appliance at {address} speaks TLS, and no fingerprint of its "
                                         f"certificate is recorded: `protolink-sandbox down`, then `up` again")
        try:  # the pinned fingerprint is the check, on this very connection
            tls = pinning_context().wrap_socket(sock, server_hostname=SERVER_NAME)
        except OSError as error:  # ssl.SSLError is one
            raise SandboxNotReachedError(f"no TLS answer from the appliance at {address}: {error}") from None
    except BaseException:
        sock.close()
        raise
    try:
        check_pinned(tls.getpeercert(binary_form=True) or b"", fingerprint, address)
    except BaseException:
        tls.close()
        raise
    return tls


def _follow(call: Call, command: Command, deadline: float, outputs: Mapping[int, int],
            stdin: _Input | None) -> Outcome:
    """Read the process's events to its Finished facts, writing its output as it comes (and
    sending ``stdin`` meanwhile)."""
    cap = OutputCap(max(command.max_output_bytes, 0))
    begun = False
    events = call.messages(stdin)
    while True:
        now = time.monotonic()
        call.settimeout(max(min(deadline - now, IDLE_SECONDS), 0.001))
        try:
            event = next(events, None)
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise SandboxUnavailableError("the sandbox did not finish the process within "
                                              f"{command.timeout_seconds + GRACE_SECONDS:g} s") from None
            raise SandboxUnavailableError(f"the sandbox sent nothing for {IDLE_SECONDS:g} seconds") from None
        if event is None:
            raise SandboxProtocolError("the sandbox ended the process stream")
        kind, body = parse_event(memoryview(event))  # its fields are read as views of it, not copied
        if kind == "keepalive":
            continue
        if kind == "error":  # rare: the generated code and the grpcio client's rules load for it
            from protolink.wire._pb.errors_pb2 import Error
            from protolink.wire.convert import parse
            from protolink.wire.status import checked_answer, from_wire

            raise from_wire(checked_answer(parse, Error, bytes(body)))
        if kind is None or (kind == "started" and begun):
            raise SandboxProtocolError(f"the sandbox sent an unexpected {kind or 'empty'} event")
        begun = True
        if kind == "output":
            channel, data = parse_output(body)
            _write(outputs[channel], cap.take(data))
        elif kind == "finished":
            exit_code, finished_truncated, timed_out = parse_finished(body)
            return Outcome(exit_code, timed_out, cap.truncated or finished_truncated)


class _Input:
    """The command's standard input, read from ``fd`` as :class:`~.grpc_call.Requests`."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def next(self) -> tuple[bytes, bool]:
        try:
            data = os.read(self.fd, MAX_INPUT_BYTES)
        except OSError:  # a descriptor that cannot be read (closed, a directory) has no more input
            data = b""
        return input_request(data, close=not data), not data


# The messages ----------------------------------------------------------------------------


def execute_request(command: Command, *, stdin: bool = False) -> bytes:
    """An ExecuteRequest (process.proto) for ``command``, with request id 1, its standard input
    fed by later :func:`input_request` messages when ``stdin``; ValueError when a field cannot
    be sent (text that is not UTF-8)."""
    key, varint, field = protowire.key, protowire.varint, protowire.length_delimited
    try:
        out = bytearray(key(7, _VARINT) + varint(_REQUEST_ID))
        out += b"".join(field(1, arg.encode()) for arg in command.argv)
        out += field(2, command.cwd.encode())
        for name, value in command.env.items():
            out += field(3, field(1, name.encode()) + field(2, value.encode()))
        out += key(4, _FIXED64) + struct.pack("<d", command.timeout_seconds)
        out += key(5, _VARINT) + varint(command.max_output_bytes)
        if stdin:
            out += key(11, _VARINT) + varint(1)
    except UnicodeEncodeError as error:
        raise ValueError(f"cannot send this request to the sandbox: {error}") from None
    return bytes(out)


def input_request(data: bytes, *, close: bool) -> bytes:
    """An ExecuteRequest (process.proto) carrying ``data`` for the standard input of request 1
    (then closing it when ``close``)."""
    field = protowire.length_delimited(1, data) if data else b""
    if close:
        field += protowire.key(2, _VARINT) + protowire.varint(1)
    return protowire.key(7, _VARINT) + protowire.varint(_REQUEST_ID) + protowire.length_delimited(12, field)


#: ExecuteEvent's oneof ``event``, by field number.
EVENT_KINDS = {1: "started", 7: "output", 3: "finished", 4: "keepalive", 6: "error"}


def parse_event(data: bytes | memoryview) -> tuple[str | None, bytes | memoryview]:
    """The kind of an ExecuteEvent of request 1 and that field's bytes, a slice of ``data``
    (kind None: no event set)."""
    kind: str | None = None
    body: bytes | memoryview = b""
    request_id = 0
    for number, wire_type, value in _fields(data):
        if number == 5:
            request_id = _expect(value, wire_type, _VARINT)
        elif number in EVENT_KINDS:
            kind, body = EVENT_KINDS[number], _expect(value, wire_type, _LENGTH)
    if request_id != _REQUEST_ID:
        raise SandboxProtocolError(f"the sandbox sent an event for request {request_id}, never made")
    return kind, body


def parse_output(data: bytes | memoryview) -> tuple[int, bytes | memoryview]:
    """An Output's channel (STDOUT or STDERR) and bytes, a slice of ``data``."""
    channel = 0
    chunk: bytes | memoryview = b""
    for number, wire_type, value in _fields(data):
        if number == 1:
            channel = _expect(value, wire_type, _VARINT)
        elif number == 3:
            chunk = _expect(value, wire_type, _LENGTH)
    if channel not in (STDOUT, STDERR):
        raise SandboxProtocolError(f"the sandbox sent output on unknown channel {channel}")
    return channel, chunk


def parse_finished(data: bytes | memoryview) -> tuple[int | None, bool, bool]:
    """A Finished event's exit code (None: absent), ``truncated`` and ``timed_out``, checked
    as :func:`protolink.wire.convert.finished_facts` checks them."""
    exit_code: int | None = None
    flags = {2: 0, 3: 0}
    duration = 0.0
    for number, wire_type, value in _fields(data):
        if number == 1:
            exit_code = _signed(_expect(value, wire_type, _VARINT))
        elif number in flags:
            flags[number] = _expect(value, wire_type, _VARINT)
        elif number == 5:
            duration = struct.unpack("<d", _expect(value, wire_type, _FIXED64))[0]
    if exit_code is not None and exit_code not in EXIT_CODES:
        raise SandboxProtocolError(f"the sandbox sent an invalid answer: exit code {exit_code} is out of range")
    if not (math.isfinite(duration) and duration >= 0):
        raise SandboxProtocolError("the sandbox sent an invalid answer: duration_seconds must be a finite number >= 0")
    return exit_code, bool(flags[2]), bool(flags[3])


def _fields(data: bytes | memoryview) -> Iterator[tuple[int, int, int | bytes | memoryview]]:
    try:
        yield from protowire.fields(data)
    except ValueError:
        raise SandboxProtocolError("the sandbox sent an answer that does not parse") from None


def _expect(value: int | bytes | memoryview, wire_type: int, expected: int) -> Any:
    if wire_type != expected:
        raise SandboxProtocolError("the sandbox sent an answer that does not parse")
    return value


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _write(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
