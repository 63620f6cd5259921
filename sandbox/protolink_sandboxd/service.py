"""The Sandbox service: a thin adapter from RPCs to :mod:`protolink.execution`.

``Execute`` calls run processes (:mod:`protolink_sandboxd.execute`); ``Upload`` and ``Download`` run
in a transfer process each (:mod:`protolink_sandboxd.transfers`); ``ResolveCommand`` is answered by
the spawner (:mod:`protolink_sandboxd.spawner_client`), with the command user's permissions. Workspace and
document operations run in worker processes (:mod:`protolink_sandboxd.worker_pool`) after the requested roots
are checked against the mounted ones. Requests arrive as bytes and are parsed here, so a
malformed one is answered with ``INVALID_ARGUMENT``; any failure becomes a status plus a typed
wire error (:mod:`protolink.wire.status`), never a traceback.

Every RPC of the contract that this service does not implement itself is an operation; the
operations' table loads at the first one, in this process, before any worker is forked (a forked
worker finds it loaded). A cold sandbox's first command waits for the server's start, which
needs neither the table nor the document extractors that it loads.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import Message

import protolink
from protolink.errors import ResourceUnchangedError
from protolink.wire import convert
from protolink.wire._pb import errors_pb2, process_pb2, sandbox_pb2, transfer_pb2, workspace_pb2
from protolink.wire.status import KINDS, abort_with, to_status
from protolink.wire.trust import ca_environment

from . import frames
from .activity import Activity
from .config import ServerConfig
from .execute import ProcessCall, Runner
from .pipe_listener import PipeListener
from .send_buffers import LARGE_EVENT_BYTES, enlarge_send_buffers
from .spawner_client import SpawnerClient
from .strays import StraySweeper
from .worker_pool import OperationFailed, WorkerPool, operations

if TYPE_CHECKING:
    from .transfers import Transfer, TransferProcesses

CONTRACT = sandbox_pb2.DESCRIPTOR.services_by_name["Sandbox"]
SERVICE = CONTRACT.full_name

log = logging.getLogger("sandbox")


class SandboxService:
    """The RPC implementations; :meth:`handler` exposes them to a grpc.aio server.

    ``activity`` tells when calls run (the server retires idle workers in a quiet moment);
    ``pipes`` hands commands' output pipes to local clients that ask (:mod:`.pipe_listener`).
    """

    def __init__(self, config: ServerConfig, workers: WorkerPool, sweeper: StraySweeper, spawner: SpawnerClient,
                 pipes: PipeListener | None = None) -> None:
        self._config = config
        self._workers = workers
        self.activity = Activity()
        self._runner = Runner(spawner, sweeper, self.activity, max_concurrency=config.max_concurrency,
                              max_output_bytes=config.max_output_bytes, environment=_command_environment(config),
                              pipes=pipes)

    @functools.cached_property
    def _transfers(self) -> TransferProcesses:
        """The upload and download processes, made at the first transfer (their module is no
        part of the server's start, which a cold sandbox's first command waits for)."""
        from .transfers import TransferProcesses

        config = self._config
        return TransferProcesses(
            uid=config.command_uid, gid=config.command_gid, memory_bytes=config.worker_memory_bytes,
            max_processes=config.max_workers, max_message_bytes=config.max_message_bytes,
            cpu_seconds=config.operation_seconds)

    def handler(self) -> grpc.GenericRpcHandler:
        """Every method of the Sandbox service, taking and returning raw bytes."""
        methods: dict[str, grpc.RpcMethodHandler] = {
            "Info": grpc.unary_unary_rpc_method_handler(self._guarded(self.info)),
            "Execute": grpc.stream_stream_rpc_method_handler(self._guarded_stream(self.execute)),
            "ResolveCommand": grpc.unary_unary_rpc_method_handler(self._guarded(self.resolve_command)),
            "Upload": grpc.stream_unary_rpc_method_handler(self._guarded(self.upload)),
            "Download": grpc.unary_stream_rpc_method_handler(self._guarded_stream(self.download)),
        }
        for name in (method.name for method in CONTRACT.methods if method.name not in methods):
            methods[name] = grpc.unary_unary_rpc_method_handler(self._guarded(functools.partial(self.perform, name)))
        return grpc.method_handlers_generic_handler(SERVICE, methods)

    async def info(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        convert.parse(sandbox_pb2.InfoRequest, request)
        config = self._config
        response = sandbox_pb2.InfoResponse(
            boundary=config.boundary,
            server_version=protolink.__version__,
            limits=sandbox_pb2.Limits(
                max_message_bytes=config.max_message_bytes,
                max_concurrency=config.max_concurrency,
                max_document_seconds=config.max_document_seconds,
                max_document_memory_bytes=config.worker_memory_bytes,
                max_output_bytes=config.max_output_bytes,
                max_operation_seconds=config.operation_seconds,
            ),
            roots=[sandbox_pb2.Root(path=root.path, writable=root.writable) for root in config.roots],
        )
        return response.SerializeToString()

    async def resolve_command(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        message = convert.parse(process_pb2.ResolveCommandRequest, request)
        resolved = await self._runner.launcher.resolve_command(list(message.argv), message.cwd, dict(message.env))
        return convert.resolve_response(resolved).SerializeToString()

    async def execute(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """The call's events; before its first large one, the send buffers of the server's Unix
        socket connections are enlarged (:mod:`protolink_sandboxd.send_buffers`; TCP sizes its own)."""
        enlarge = not self._config.tcp
        async for event in self.process_call().events(requests):
            if enlarge and len(event) >= LARGE_EVENT_BYTES:
                enlarge = False
                enlarge_send_buffers(self._config.socket_path)
            yield event

    def process_call(self) -> ProcessCall:
        """A new Execute call, served on gRPC (:meth:`execute`) or the command channel."""
        return ProcessCall(self._runner)

    async def perform(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        row = operations()[method]
        message = convert.parse(row.request_type, request)
        self._check_roots(message)
        seconds = self._config.operation_seconds
        if (limits := row.limits(message)) is not None:
            seconds = min(limits.timeout_seconds, self._config.max_document_seconds)
        return await self._workers.call(method, request, seconds=seconds, what=row.operation.what)

    async def upload(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        messages = aiter(requests)
        first = await anext(messages, b"")
        start = convert.parse(transfer_pb2.UploadChunk, first)
        convert.require(start.HasField("start"), "an upload starts with its destination")
        self._check_roots(start.start)
        async with self._transfers.start("Upload", first) as transfer:
            # The process's answer is awaited while the client's messages are passed on: one
            # that ends early (refused the data, or was killed) ends the call without waiting
            # for a client that sends nothing more.
            answer = asyncio.ensure_future(transfer.receive())
            feeding = asyncio.ensure_future(_feed(messages, transfer))
            try:
                await asyncio.wait((answer, feeding), return_when=asyncio.FIRST_COMPLETED)
                if feeding.done() and not answer.done():
                    feeding.result()  # the client's stream failed: the call ends with its error
                return (await answer)[1]
            finally:
                for task in (feeding, answer):
                    task.cancel()
                await asyncio.gather(feeding, answer, return_exceptions=True)

    async def download(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self._check_roots(convert.parse(transfer_pb2.DownloadRequest, request))
        async with self._transfers.start("Download", request) as transfer:
            while True:
                status, chunk = await transfer.receive()
                yield chunk
                if status != frames.DATA:
                    return

    def _guarded(
        self, handler: Callable[[Any, grpc.aio.ServicerContext], Awaitable[bytes]],
    ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[bytes]]:
        async def run(request: Any, context: grpc.aio.ServicerContext) -> bytes:
            with self.activity.call():
                try:
                    return await handler(request, context)
                except (grpc.aio.AbortError, asyncio.CancelledError):
                    raise
                except Exception as error:
                    await _abort(context, error)
                    raise  # unreachable: abort raises

        return run

    def _guarded_stream(
        self, handler: Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[bytes]],
    ) -> Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[bytes]]:
        """A streaming ``handler`` whose failure ends its call with a status and a typed wire error."""

        async def run(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            try:
                async for item in handler(requests, context):
                    yield item
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise
            except Exception as error:
                await _abort(context, error)

        return run

    def _check_roots(self, message: Message) -> None:
        """Requested roots must be mounted roots or beneath one; writes need a writable one. A file
        replacement refused here has written nothing: unchanged, as on a read-only file system."""
        mounted = [root.path for root in self._config.roots]
        for root in getattr(message, "roots", ()):
            convert.require(convert.beneath(root, mounted), f"root {root!r} is not mounted in this sandbox")
        written = (message.expected.resource_id if isinstance(message, workspace_pb2.ReplaceFileRequest)
                   else message.destination if isinstance(message, transfer_pb2.UploadStart) else None)
        writable = [root.path for root in self._config.roots if root.writable]
        if written is None or convert.beneath(written, writable):
            return
        if isinstance(message, workspace_pb2.ReplaceFileRequest):
            raise ResourceUnchangedError.of(written, OSError(errno.EROFS, "it is in a read-only root of this sandbox"))
        raise PermissionError(f"{written} is in a read-only root of this sandbox")


def _command_environment(config: ServerConfig) -> dict[str, str]:
    """The variables every command gets: with egress the proxy's (without, the relay's module
    is not loaded), with a CA file the trust variables naming it."""
    environment: dict[str, str] = {}
    if config.egress_port:
        from .egress_relay import proxy_environment

        environment |= proxy_environment(config.egress_port)
    if config.ca_file is not None:
        environment |= ca_environment(config.ca_file)
    return environment


async def _abort(context: grpc.aio.ServicerContext, error: BaseException) -> None:
    status = (KINDS[error.error.kind][0], error.error) if isinstance(error, OperationFailed) else to_status(error)
    if status[1].kind == errors_pb2.ERROR_KIND_INTERNAL:
        log.error("internal error", exc_info=error)
    await abort_with(context, status)


async def _feed(messages: AsyncIterator[bytes], transfer: Transfer) -> None:
    """Pass an upload's messages on to its process, then the end of the stream."""
    async for message in messages:
        if message and not await transfer.send(message):
            return  # it has answered already
    await transfer.send(b"")  # the stream ended: after the upload's end, or instead of it
