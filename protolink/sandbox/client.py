"""SandboxBackend: the execution, workspace and document backend that runs inside a sandbox.

It is a :class:`~protolink.execution.backends.Backend` (processes, workspace files and
documents) that calls the sandbox server over gRPC, so every tool that accepts ``backend=``
runs there unchanged; file and document operations follow the wire's table of operations
(:mod:`protolink.wire.operations`). Everything the server
sends is untrusted: message sizes are bounded, output is capped at the spec's
``max_output_bytes`` whatever the server claims, and answers are checked before results are
built. A dead, unreachable or silent sandbox raises :class:`SandboxUnavailableError` instead
of hanging: unary calls have deadlines; processes run on one Execute call
(:mod:`.process_stream`) with keepalives and deadlines of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protolink.errors import SandboxError, SandboxNotReachedError, SandboxProtocolError
from protolink.execution.operations import Operation, Operations
from protolink.execution.process_types import (
    Emitter,
    ProcessCancelledError,
    ProcessResult,
    ProcessSpec,
)
from protolink.execution.resolve import Resolved
from protolink.wire import convert
from protolink.wire._pb import process_pb2, sandbox_pb2, sandbox_pb2_grpc
from protolink.wire.operations import WIRE_OPERATIONS
from protolink.wire.pipe_passing import DATAGRAM_BYTES
from protolink.wire.keepalive import CLIENT_KEEPALIVE_OPTIONS
from protolink.wire.roots import Root
from protolink.wire.status import checked_answer, from_rpc_error, parsed_answer

from .addresses import grpc_target, socket_gone, socket_path
from .pipe_connection import ChannelCalls, channel_socket
from .process_stream import PIPES_ABOVE_BYTES, Canceled, Output, ProcessStream, grpc_calls, own_calls
from .resolutions import Resolutions

__all__ = ["SandboxBackend", "SandboxInfo", "attach", "connect"]

MiB = 1024 * 1024
DEFAULT_MAX_MESSAGE_BYTES = 32 * MiB
#: The largest request that goes on the command channel: room for the id it gets and its
#: pipe connection's key (a larger one, with a long argv or environment, goes on gRPC).
CHANNEL_REQUEST_BYTES = DATAGRAM_BYTES - 64
#: Processes run at once when the server does not say how many it runs.
DEFAULT_MAX_CONCURRENCY = 64
#: Extra time a process call may take beyond its timeout: group kill, reap and drain.
EXECUTE_GRACE_SECONDS = 30.0
#: The longest a workspace call may take, whatever the server reports.
MAX_OPERATION_SECONDS = 300.0
#: Extra time a workspace or document call may take beyond the server's own limit.
CALL_GRACE_SECONDS = 10.0
HEALTH_SECONDS = 2.0
#: A call that finds the connection lost (say, while a command starved the server of CPU and its
#: keepalives went unanswered) first waits this long for it to come back; a sandbox that is gone
#: still fails, this much later.
RECONNECT_SECONDS = 3.0
MAX_BOUNDARY_CHARS = 256

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class SandboxInfo:
    """What the server reports about itself: its boundary, version, limits and roots."""

    boundary: str
    server_version: str
    limits: Mapping[str, int | float]
    roots: tuple[Root, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "boundary": self.boundary,
            "server_version": self.server_version,
            "limits": dict(self.limits),
            "roots": [{"path": root.path, "writable": root.writable} for root in self.roots],
        }


async def connect(
    address: str,
    token: str | None = None,
    *,
    timeout: float = 5.0,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    output_pipes: bool = True,
    command_channel: bool = True,
    fingerprint: str | None = None,
) -> SandboxBackend:
    """Connect to a sandbox server at ``unix:///path`` or ``host:port``.

    Waits up to ``timeout`` seconds for the server to answer (it may still be starting), then
    returns a backend named after the server's boundary. ``token`` is sent with every call
    (required for TCP). A TCP server speaks TLS with a certificate of its own: ``fingerprint``
    (``sha256:HEX``, :attr:`DockerSandbox.fingerprint <protolink.sandbox.DockerSandbox.fingerprint>`,
    as ``protolink-sandbox up --tcp`` prints it) is required there, and a server presenting
    another certificate is refused (CertificateMismatchError). Raises SandboxNotReachedError
    (a SandboxUnavailableError) naming the address when no server answers in time.
    ``output_pipes=False`` keeps every process's output on the Execute stream, ``command_channel=False``
    every process on gRPC (see :func:`attach`).
    """
    options = channel_options(max_message_bytes)
    local = socket_path(address) is not None
    if local:
        channel = grpc.aio.insecure_channel(grpc_target(address), options=options)
    elif fingerprint is None:
        raise ValueError(f"{address} is a TCP address: connect over TLS with the server's certificate "
                         f"fingerprint (fingerprint='sha256:...', as `protolink-sandbox up --tcp` prints it)")
    else:
        channel = await _pinned_when_up(address, fingerprint, options, timeout)
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    try:
        return await attach(channel, metadata, timeout=timeout, max_message_bytes=max_message_bytes, owns_channel=True,
                            address=address if local else None, output_pipes=output_pipes,
                            command_channel=command_channel)
    except SandboxNotReachedError:
        await channel.close()
        missing = ": its socket does not exist" if socket_gone(address) else ""
        raise SandboxNotReachedError(f"no sandbox server answered at {address} within {timeout:g} s{missing}") from None
    except BaseException:
        await channel.close()
        raise


async def _pinned_when_up(address: str, fingerprint: str, options: Sequence[tuple[str, Any]],
                          timeout: float) -> grpc.aio.Channel:
    """A channel pinned to ``fingerprint`` (:func:`.tls.pinned_channel`), asked again until the
    server at ``address`` answers with TLS (it may still be starting) or ``timeout`` passes."""
    from .tls import pinned_channel

    deadline = time.monotonic() + timeout
    while True:
        try:
            return await pinned_channel(grpc_target(address), fingerprint, options=options,
                                        connect_seconds=max(deadline - time.monotonic(), 0.1))
        except SandboxNotReachedError:
            if time.monotonic() >= deadline:
                raise
        await asyncio.sleep(0.05)


async def attach(
    channel: grpc.aio.Channel,
    metadata: Sequence[tuple[str, str]] = (),
    *,
    timeout: float = 5.0,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    owns_channel: bool = False,
    info: sandbox_pb2.InfoResponse | None = None,
    address: str | None = None,
    output_pipes: bool = True,
    command_channel: bool = True,
    command_socket: str | None = None,
) -> SandboxBackend:
    """A backend over an open ``channel`` whose every call carries ``metadata`` (a sandbox
    service's channel, say), once the server answers ``Info`` within ``timeout`` seconds (or
    at once with its ``info``, already at hand). Closing the backend closes the channel only
    when it ``owns_channel``. With the server's ``address`` (``unix:///path``: a TCP server
    speaks TLS, which the channel carries), processes run on connections of their own to it,
    without grpcio's receive (:func:`.process_stream.own_calls`); the server runs them on its command
    channel, where it offers one (:mod:`.pipe_connection`; unless ``command_channel`` is False), and
    may pass their output's pipes to this host there (unless ``output_pipes`` is False); without
    ``address``, on the gRPC channel, or on the command channel at ``command_socket`` (a sandbox
    service's, for its clients on this host) where it is offered. The
    processes' call is opened at once (:meth:`SandboxBackend.open_ahead`)."""
    response = info if info is not None else await _first_answer(channel, metadata, timeout)
    backend = SandboxBackend(channel, _info(response), metadata=metadata, max_message_bytes=max_message_bytes,
                             owns_channel=owns_channel, address=address, output_pipes=output_pipes,
                             command_channel=command_channel, command_socket=command_socket)
    backend.open_ahead()
    return backend


class SandboxBackend(Operations):
    """ExecutionBackend, WorkspaceBackend and DocumentBackend inside a sandbox; see the module.

    Create it with :func:`connect` (or ``DockerSandbox``); close it with :meth:`aclose` or
    ``async with``. A closed backend refuses further calls. ``info_at_connect`` is what the
    server reported when the connection was made; ``boundary`` names the sandbox in previews.
    Closing it closes ``channel`` unless ``owns_channel`` is False (a channel shared with others).
    Processes run on connections of their own to ``address`` when it is given, their output's
    pipes passed to this host where the server can and ``output_pipes`` allows, on the command
    channel (the server's, or the one at ``command_socket``) unless ``command_channel`` is False
    (see :func:`attach`).
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        info: SandboxInfo,
        *,
        metadata: Sequence[tuple[str, str]] = (),
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        owns_channel: bool = True,
        address: str | None = None,
        output_pipes: bool = True,
        command_channel: bool = True,
        command_socket: str | None = None,
    ) -> None:
        self._channel = channel
        self._owns_channel = owns_channel
        self._stub = sandbox_pb2_grpc.SandboxStub(channel)
        self._health = health_pb2_grpc.HealthStub(channel)
        self._metadata = tuple(metadata)
        self._max_request_bytes = min(max_message_bytes, int(info.limits.get("max_message_bytes", max_message_bytes)))
        self._closed = False
        self._resolutions = Resolutions()
        calls = (grpc_calls(channel, self._metadata) if address is None
                 else own_calls(address, self._metadata, max_message_bytes=max_message_bytes))
        in_flight = asyncio.Semaphore(int(info.limits.get("max_concurrency", DEFAULT_MAX_CONCURRENCY)))
        self._grpc_processes = ProcessStream(calls, in_flight=in_flight)
        local = None if not command_channel else command_socket or (address and channel_socket(address))
        #: Where the server offers a command channel, every process that fits its datagrams runs there.
        self._channel_processes = None if local is None else ProcessStream(
            ChannelCalls(local, self._metadata, calls, pipes_above=PIPES_ABOVE_BYTES if output_pipes else None),
            in_flight=in_flight)
        self.info_at_connect = info
        self.boundary = info.boundary

    async def __aenter__(self) -> SandboxBackend:
        self._check_open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection; calls in flight fail, later calls are refused."""
        if not self._closed:
            self._closed = True
            for processes in (self._channel_processes, self._grpc_processes):
                if processes is not None:
                    await processes.aclose()
            if self._owns_channel:
                await self._channel.close()

    @property
    def closed(self) -> bool:
        return self._closed

    async def info(self) -> SandboxInfo:
        """The server's boundary, version, limits and roots, asked now."""
        return _info(await self._unary(self._stub.Info, sandbox_pb2.InfoRequest(), HEALTH_SECONDS))

    async def health(self) -> bool:
        """True when the server reports SERVING (grpc.health.v1); SandboxUnavailableError if it does not answer."""
        response = await self._unary(self._health.Check, health_pb2.HealthCheckRequest(service=""), HEALTH_SECONDS)
        return response.status == health_pb2.HealthCheckResponse.SERVING

    def open_ahead(self) -> None:
        """Open the first command's connection now, on the stream commands use (the command
        channel's where the server offers one, else gRPC's): it is set up while the caller
        does something else, and ends when idle (:meth:`.process_stream.ProcessStream.open`)."""
        (self._channel_processes or self._grpc_processes).open()

    # ExecutionBackend --------------------------------------------------------------------

    async def resolve_command(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> Resolved:
        """Resolve argv[0], the file it runs and the working directory inside the sandbox, as
        its commands see them.

        An answer given before for the same argv[0], directory and ``PATH`` is reused; the
        sandbox resolves such a command again when it starts (:mod:`.resolutions`).
        """
        self._check_open()
        if (kept := self._resolutions.reuse(argv[0], cwd, env)) is not None:
            return Resolved((kept.argv[0], *argv[1:]), kept.cwd, kept.real_executable)
        request = self._request(convert.resolve_request, argv, cwd, env)
        response = await self._unary(self._stub.ResolveCommand, request, self._operation_seconds)
        resolved = checked_answer(convert.resolved_command, response, argv)
        self._resolutions.remember(argv[0], cwd, env, resolved)
        return resolved

    def _processes_for(self, request: process_pb2.ExecuteRequest) -> ProcessStream:
        """The command channel's stream, unless there is none or ``request`` does not fit its
        datagrams (a long argv or environment): then gRPC's."""
        if self._channel_processes is not None and request.ByteSize() <= CHANNEL_REQUEST_BYTES:
            return self._channel_processes
        return self._grpc_processes

    async def execute(self, spec: ProcessSpec, execution: Emitter) -> ProcessResult:
        """Run ``spec`` in the sandbox, emitting ``process.output`` events as output arrives.

        Canceling kills and reaps the process group in the sandbox, then raises
        ProcessCancelledError with the output received so far.
        """
        self._check_open()
        written = self._resolutions.written(spec)
        request = self._request(convert.execute_request, spec, written)
        started = time.monotonic()
        output = Output(spec.max_output_bytes, execution)
        text = output.collector
        deadline_seconds = spec.timeout_seconds + EXECUTE_GRACE_SECONDS
        try:
            processes = self._processes_for(request)
            facts = await self._connected(lambda: processes.run(request, output, deadline_seconds))
        except (asyncio.CancelledError, Canceled) as canceled:
            text.close()
            reaped = canceled.facts if isinstance(canceled, Canceled) else None
            partial = ProcessResult(None if reaped is None else reaped["exit_code"], text.stdout, text.stderr,
                                    truncated=output.cap.truncated or bool(reaped and reaped["truncated"]),
                                    canceled=True, duration_seconds=time.monotonic() - started)
            raise ProcessCancelledError(partial) from None
        except BaseException:
            if written is not None:
                self._resolutions.forget(spec)
            raise
        return ProcessResult(stdout=text.stdout, stderr=text.stderr,
                             **{**facts, "truncated": facts["truncated"] or output.cap.truncated})

    def resolve_now(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> None:
        """None: a sandbox resolves commands when each call is prepared (a round trip)."""
        return None

    # WorkspaceBackend and DocumentBackend: the typed methods of Operations ---------------

    async def perform(self, operation: Operation[R], **arguments: Any) -> R:
        """Perform ``operation`` in the sandbox through its row of the wire table; the answer
        is checked before it becomes a result."""
        self._check_open()
        row = WIRE_OPERATIONS[operation.name]
        arguments["roots"] = _roots(arguments["roots"])
        request = self._request(row.request, **arguments)
        seconds = (arguments["limits"].timeout_seconds + CALL_GRACE_SECONDS if operation.document
                   else self._operation_seconds)
        response = await self._unary(getattr(self._stub, operation.name), request, seconds)
        result: R = checked_answer(row.answer, response, **arguments)
        return result

    def stream_method(self, name: str) -> Callable[..., Any]:
        """The streaming RPC ``name`` of the Sandbox service (``Upload``, ``Download``) with this
        backend's credentials, for :mod:`protolink.sandbox.transfer`."""
        self._check_open()
        return functools.partial(getattr(self._stub, name), metadata=self._metadata)

    # Plumbing ----------------------------------------------------------------------------

    @property
    def _operation_seconds(self) -> float:
        reported = float(self.info_at_connect.limits.get("max_operation_seconds", MAX_OPERATION_SECONDS))
        return min(reported, MAX_OPERATION_SECONDS) + CALL_GRACE_SECONDS

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"the backend for {self.boundary} is closed")

    def _request(self, build: Any, *args: Any, **fields: Any) -> Message:
        """Build a request; ValueError when an argument cannot be sent (range, encoding, size)."""
        try:
            request = build(*args, **fields)
        except (TypeError, ValueError, OverflowError) as error:
            raise ValueError(f"cannot send this request to the sandbox: {error}") from None
        if request.ByteSize() > self._max_request_bytes:
            raise ValueError(
                f"the request is {request.ByteSize()} bytes; the sandbox accepts at most {self._max_request_bytes}"
            )
        return request

    async def _unary(self, method: Any, request: Message, timeout: float) -> Any:
        self._check_open()
        return await self._connected(
            lambda: _call(method, request, metadata=self._metadata, timeout=timeout, wait_for_ready=False))

    async def _connected(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, given RECONNECT_SECONDS for a lost connection to come back first.

        A connection can also be lost between the look at it and the call (the server closed
        it a moment ago); a call that failed for that reason was never sent, and is made once
        more when the connection is back.
        """
        if not await self._connection_up():
            return await call()
        try:
            return await call()
        except SandboxNotReachedError:
            await self._connection_up()
        return await call()

    async def _connection_up(self) -> bool:
        """True when the connection is up; otherwise False, once it is back or RECONNECT_SECONDS passed."""
        if self._channel.get_state() is grpc.ChannelConnectivity.READY:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._channel.channel_ready(), RECONNECT_SECONDS)
        return False


async def _first_answer(channel: grpc.aio.Channel, metadata: Sequence[tuple[str, str]],
                        timeout: float) -> sandbox_pb2.InfoResponse:
    """The server's Info, waiting up to ``timeout`` seconds for it to answer (it may be starting);
    SandboxNotReachedError when it does not."""
    try:
        response = await sandbox_pb2_grpc.SandboxStub(channel).Info(
            sandbox_pb2.InfoRequest(), metadata=tuple(metadata), timeout=timeout, wait_for_ready=True)
    except grpc.aio.AioRpcError as error:
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise SandboxNotReachedError(f"no sandbox server answered within {timeout:g} s") from None
        raise from_rpc_error(error) from None
    return parsed_answer(response)


async def _call(method: Any, request: Message, **options: Any) -> Any:
    try:
        response = await method(request, **options)
    except grpc.aio.AioRpcError as error:
        raise from_rpc_error(error) from None
    return parsed_answer(response)


def _info(response: sandbox_pb2.InfoResponse) -> SandboxInfo:
    boundary = response.boundary
    if not boundary.startswith("sandbox:") or len(boundary) > MAX_BOUNDARY_CHARS or not boundary.isprintable():
        raise SandboxProtocolError("the sandbox reported an invalid boundary name")
    limits = {field.name: value for field, value in response.limits.ListFields()}
    if not all(math.isfinite(value) and value > 0 for value in limits.values()):
        raise SandboxProtocolError("the sandbox reported an invalid limit")
    roots = tuple(Root(root.path, root.writable) for root in response.roots)
    return SandboxInfo(boundary, response.server_version[:MAX_BOUNDARY_CHARS], limits, roots)


def _roots(roots: Sequence[str]) -> list[str]:
    if isinstance(roots, (str, bytes)):
        raise TypeError("roots must be a list of absolute paths, not a single path")
    return list(roots)


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """The options of every channel to a sandbox server: message bounds, frames, keepalives, reconnects."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # A message arrives in fewer, larger HTTP/2 frames (16 KiB by default), each one piece
        # gRPC copies and joins: a mebibyte of output costs the client about 12% less CPU.
        ("grpc.http2.max_frame_size", 1 << 20),
        *CLIENT_KEEPALIVE_OPTIONS,
        ("grpc.enable_retries", 0),
        # A sandbox that is starting is found within tens of milliseconds, not seconds; a
        # connection attempt itself may take a second (a busy server is slow to greet).
        ("grpc.initial_reconnect_backoff_ms", 20),
        ("grpc.min_reconnect_backoff_ms", 1000),
        ("grpc.max_reconnect_backoff_ms", 500),
    ]
