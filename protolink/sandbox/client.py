"""SandboxBackend: the execution, workspace and document backend that runs inside a sandbox.

It implements :class:`~protolink.execution.ExecutionBackend`,
:class:`~protolink.execution.workspace.WorkspaceBackend` and
:class:`~protolink.execution.documents.DocumentBackend` by calling the sandbox server over
gRPC, so every tool that accepts ``backend=`` runs there unchanged. Everything the server
sends is untrusted: message sizes are bounded, output is capped at the spec's
``max_output_bytes`` whatever the server claims, and answers are checked before results are
built. A dead, unreachable or silent sandbox raises :class:`SandboxUnavailableError` instead
of hanging: unary calls have deadlines; processes run on one Execute call
(:mod:`.process_stream`) with keepalives and deadlines of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protolink.errors import SandboxError, SandboxNotReachedError, SandboxProtocolError
from protolink.execution.documents import (
    DocumentExtraction,
    DocumentLimits,
    DocumentSearchResult,
    check_search,
)
from protolink.execution.fsread import TextChunk
from protolink.execution.fssearch import Listing, SearchResult
from protolink.execution.process import (
    Emitter,
    ProcessCancelledError,
    ProcessResult,
    ProcessSpec,
)
from protolink.execution.resolve import Resolved
from protolink.revisions import ResourceRevision, ResourceSnapshot
from protolink.wire import convert
from protolink.wire._pb import (
    documents_pb2,
    sandbox_pb2,
    sandbox_pb2_grpc,
    workspace_pb2,
)
from protolink.wire.roots import Root
from protolink.wire.status import checked_answer, from_rpc_error, parsed_answer

from .process_stream import Output, ProcessStream
from .resolutions import Resolutions

__all__ = ["SandboxBackend", "SandboxInfo", "connect"]

MiB = 1024 * 1024
DEFAULT_MAX_MESSAGE_BYTES = 32 * MiB
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
) -> SandboxBackend:
    """Connect to a sandbox server at ``unix:///path`` or ``host:port``.

    Waits up to ``timeout`` seconds for the server to answer (it may still be starting), then
    returns a backend named after the server's boundary. ``token`` is sent with every call
    (required for TCP). Raises SandboxUnavailableError when no server answers in time.
    """
    channel = grpc.aio.insecure_channel(address.removeprefix("tcp://"), options=_channel_options(max_message_bytes))
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    try:
        response = await _call(
            sandbox_pb2_grpc.SandboxStub(channel).Info, sandbox_pb2.InfoRequest(),
            metadata=metadata, timeout=timeout, wait_for_ready=True,
        )
        info = _info(response)
    except BaseException:
        await channel.close()
        raise
    return SandboxBackend(channel, info, metadata=metadata, max_message_bytes=max_message_bytes)


class SandboxBackend:
    """ExecutionBackend, WorkspaceBackend and DocumentBackend inside a sandbox; see the module.

    Create it with :func:`connect` (or ``DockerSandbox``); close it with :meth:`aclose` or
    ``async with``. A closed backend refuses further calls. ``info_at_connect`` is what the
    server reported when the connection was made; ``boundary`` names the sandbox in previews.
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        info: SandboxInfo,
        *,
        metadata: Sequence[tuple[str, str]] = (),
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._channel = channel
        self._stub = sandbox_pb2_grpc.SandboxStub(channel)
        self._health = health_pb2_grpc.HealthStub(channel)
        self._metadata = tuple(metadata)
        self._max_request_bytes = min(max_message_bytes, int(info.limits.get("max_message_bytes", max_message_bytes)))
        self._closed = False
        self._resolutions = Resolutions()
        self._processes = ProcessStream(self._stub, self._metadata, max_in_flight=int(
            info.limits.get("max_concurrency", DEFAULT_MAX_CONCURRENCY)))
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
            await self._processes.aclose()
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

    async def execute(self, spec: ProcessSpec, execution: Emitter) -> ProcessResult:
        """Run ``spec`` in the sandbox, emitting ``process.output`` events as output arrives.

        Canceling kills and reaps the process group in the sandbox, then raises
        ProcessCancelledError with the output received so far.
        """
        self._check_open()
        written = self._resolutions.written(spec)
        request = self._request(convert.execute_request, spec, written)
        started = time.monotonic()
        output = Output(spec.max_output_bytes)
        deadline_seconds = spec.timeout_seconds + EXECUTE_GRACE_SECONDS
        try:
            facts = await self._connected(lambda: self._processes.run(request, output, execution, deadline_seconds))
        except asyncio.CancelledError:
            partial = ProcessResult(None, output.stdout, output.stderr, truncated=output.truncated, canceled=True,
                                    duration_seconds=time.monotonic() - started)
            raise ProcessCancelledError(partial) from None
        except BaseException:
            if written is not None:
                self._resolutions.forget(spec)
            raise
        return ProcessResult(stdout=output.stdout, stderr=output.stderr,
                             **{**facts, "truncated": facts["truncated"] or output.truncated})

    # WorkspaceBackend --------------------------------------------------------------------

    async def read_text(self, path: str, *, roots: Sequence[str], offset: int, max_chars: int,
                        max_file_bytes: int) -> TextChunk:
        roots = _roots(roots)
        request = self._request(workspace_pb2.ReadTextRequest, path=path, roots=roots, offset=offset,
                                max_chars=max_chars, max_file_bytes=max_file_bytes)
        response = await self._unary(self._stub.ReadText, request, self._operation_seconds)
        return checked_answer(convert.text_chunk, response, roots=roots, max_chars=max_chars)

    async def list_files(self, path: str, *, roots: Sequence[str], pattern: str, recursive: bool,
                         max_results: int) -> Listing:
        roots = _roots(roots)
        request = self._request(workspace_pb2.ListFilesRequest, path=path, roots=roots, pattern=pattern,
                                recursive=recursive, max_results=max_results)
        response = await self._unary(self._stub.ListFiles, request, self._operation_seconds)
        return checked_answer(convert.listing, response, roots=roots, max_results=max_results)

    async def search_files(self, path: str, *, roots: Sequence[str], query: str, pattern: str,
                           case_sensitive: bool, max_results: int, max_file_bytes: int) -> SearchResult:
        roots = _roots(roots)
        request = self._request(workspace_pb2.SearchFilesRequest, path=path, roots=roots, query=query,
                                pattern=pattern, case_sensitive=case_sensitive, max_results=max_results,
                                max_file_bytes=max_file_bytes)
        response = await self._unary(self._stub.SearchFiles, request, self._operation_seconds)
        return checked_answer(convert.search_result, response, roots=roots, max_results=max_results)

    async def snapshot_file(self, path: str, *, roots: Sequence[str], max_file_bytes: int) -> ResourceSnapshot:
        roots = _roots(roots)
        request = self._request(workspace_pb2.SnapshotFileRequest, path=path, roots=roots,
                                max_file_bytes=max_file_bytes)
        response = await self._unary(self._stub.SnapshotFile, request, self._operation_seconds)
        return checked_answer(convert.snapshot, response, roots=roots, max_file_bytes=max_file_bytes)

    async def replace_file(self, expected: ResourceRevision, data: bytes | None, mode: int | None, *,
                           roots: Sequence[str]) -> ResourceRevision:
        roots = _roots(roots)
        request = self._request(convert.replace_request, expected, data, mode, roots)
        response = await self._unary(self._stub.ReplaceFile, request, self._operation_seconds)
        written = checked_answer(convert.revision, response.revision)
        if written.resource_id != expected.resource_id:
            raise SandboxProtocolError("the sandbox reported a write to another file")
        return written

    # DocumentBackend ---------------------------------------------------------------------

    async def read_document(self, path: str, *, roots: Sequence[str], limits: DocumentLimits) -> DocumentExtraction:
        roots = _roots(roots)
        request = self._request(documents_pb2.ReadDocumentRequest, path=path, roots=roots,
                                limits=convert.limits_message(limits))
        response = await self._unary(self._stub.ReadDocument, request, limits.timeout_seconds + CALL_GRACE_SECONDS)
        return checked_answer(convert.extraction, response, roots=roots, limits=limits)

    async def search_document(self, path: str, query: str, *, roots: Sequence[str], limits: DocumentLimits,
                              max_results: int) -> DocumentSearchResult:
        check_search(query, max_results)
        roots = _roots(roots)
        request = self._request(documents_pb2.SearchDocumentRequest, path=path, query=query, roots=roots,
                                limits=convert.limits_message(limits), max_results=max_results)
        response = await self._unary(self._stub.SearchDocument, request, limits.timeout_seconds + CALL_GRACE_SECONDS)
        return checked_answer(convert.document_search, response, roots=roots, query=query, limits=limits,
                             max_results=max_results)

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


def _channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # While calls are in flight, a peer that stops answering pings (a frozen or vanished
        # sandbox) fails them within seconds instead of at their deadlines.
        ("grpc.keepalive_time_ms", 2_000),
        ("grpc.keepalive_timeout_ms", 2_000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.ping_timeout_ms", 2_000),
        ("grpc.enable_retries", 0),
        # A sandbox that is starting is found within tens of milliseconds, not seconds; a
        # connection attempt itself may take a second (a busy server is slow to greet).
        ("grpc.initial_reconnect_backoff_ms", 20),
        ("grpc.min_reconnect_backoff_ms", 1000),
        ("grpc.max_reconnect_backoff_ms", 500),
    ]
