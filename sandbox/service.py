"""The Sandbox service: a thin adapter from RPCs to :mod:`protolink.execution`.

``Execute`` runs the command through :class:`~protolink.execution.processes.LocalProcesses`
(started as the command user by the spawner, :mod:`sandbox.launcher`, in its own session) and
streams its output; ``ResolveCommand`` is answered by the spawner too, with the command user's
permissions. Workspace and document operations run in worker processes (:mod:`sandbox.workers`)
after the requested roots are checked against the mounted ones. Requests arrive as bytes and are parsed here, so a
malformed one is answered with ``INVALID_ARGUMENT``; any failure becomes a status plus a
typed wire error (:mod:`protolink.sandbox.errors`), never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

import protolink
from protolink.execution.process import ProcessResult, ProcessSpec
from protolink.execution.processes import Leader, LocalProcesses
from protolink.sandbox import messages
from protolink.sandbox._pb import errors_pb2, process_pb2, sandbox_pb2, workspace_pb2
from protolink.sandbox.errors import ERROR_METADATA_KEY, KINDS, to_status

from .config import ServerConfig
from .launcher import CommandSpec, Launcher
from .operations import OPERATIONS
from .reaper import StrayReaper
from .workers import OperationFailed, WorkerPool

SERVICE = sandbox_pb2.DESCRIPTOR.services_by_name["Sandbox"].full_name
#: A quiet command still sends an event this often, so either side notices a dead peer.
KEEPALIVE_SECONDS = 5.0
#: Text per Output event; larger chunks are split.
OUTPUT_CHUNK_CHARS = 64 * 1024

log = logging.getLogger("sandbox")
M = TypeVar("M", bound=Message)


class CommandProcesses(LocalProcesses):
    """LocalProcesses whose commands are resolved and started by the spawner, as the command
    user; supervision (output, caps, timeouts, group kills) stays in the server."""

    def __init__(self, launcher: Launcher) -> None:
        self._launcher = launcher

    async def resolve_command(
        self, argv: Sequence[str], cwd: str, env: Mapping[str, str]
    ) -> tuple[tuple[str, ...], str]:
        return await self._launcher.resolve_command(argv, cwd, env)

    async def launch(self, spec: ProcessSpec, stdout: int, stderr: int) -> Leader:
        return await self._launcher.launch(spec, stdout, stderr)


class _Outputs:
    """The Emitter LocalProcesses writes output events to: queued as Output events, with a
    keepalive every KEEPALIVE_SECONDS until closed."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[process_pb2.ExecuteEvent | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._keepalive = self._loop.call_later(KEEPALIVE_SECONDS, self._keep_alive)

    def close(self) -> None:
        """No more keepalives."""
        self._keepalive.cancel()

    def _keep_alive(self) -> None:
        """Queue a Keepalive event, and the next one KEEPALIVE_SECONDS later."""
        self.queue.put_nowait(process_pb2.ExecuteEvent(keepalive=process_pb2.Keepalive()))
        self._keepalive = self._loop.call_later(KEEPALIVE_SECONDS, self._keep_alive)

    async def emit(self, type: str, **data: Any) -> None:
        if type != "process.output":
            return
        channel = messages.CHANNEL_NUMBERS[data["channel"]]
        text: str = data["text"]
        for start in range(0, len(text), OUTPUT_CHUNK_CHARS):
            output = process_pb2.Output(channel=channel, text=text[start : start + OUTPUT_CHUNK_CHARS])
            self.queue.put_nowait(process_pb2.ExecuteEvent(output=output))


class Activity:
    """Whether calls are running, and since when none has: background work waits for quiet."""

    def __init__(self) -> None:
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._since = time.monotonic()

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        self._running += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._running -= 1
            if not self._running:
                self._since = time.monotonic()
                self._idle.set()

    async def quiet(self, seconds: float) -> None:
        """Return once no call has run for ``seconds``."""
        while True:
            await self._idle.wait()
            remaining = self._since + seconds - time.monotonic()
            if remaining <= 0:
                return
            await asyncio.sleep(remaining)


class SandboxService:
    """The RPC implementations; :meth:`handler` exposes them to a grpc.aio server.

    ``activity`` tells when calls run (the server warms its first worker in a quiet moment).
    """

    def __init__(self, config: ServerConfig, workers: WorkerPool, reaper: StrayReaper, launcher: Launcher) -> None:
        self._config = config
        self._workers = workers
        self._reaper = reaper
        self._processes = CommandProcesses(launcher)
        self.activity = Activity()

    def handler(self) -> grpc.GenericRpcHandler:
        """Every method of the Sandbox service, taking and returning raw bytes."""
        methods: dict[str, grpc.RpcMethodHandler] = {
            "Info": grpc.unary_unary_rpc_method_handler(self._guarded(self.info)),
            "Execute": grpc.unary_stream_rpc_method_handler(self._guarded_stream(self.execute)),
            "ResolveCommand": grpc.unary_unary_rpc_method_handler(self._guarded(self.resolve_command)),
        }
        for name in OPERATIONS:
            methods[name] = grpc.unary_unary_rpc_method_handler(self._guarded(functools.partial(self.perform, name)))
        return grpc.method_handlers_generic_handler(SERVICE, methods)

    async def info(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        _parse(sandbox_pb2.InfoRequest, request)
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
        message = _parse(process_pb2.ResolveCommandRequest, request)
        argv, cwd = await self._processes.resolve_command(list(message.argv), message.cwd, dict(message.env))
        return process_pb2.ResolveCommandResponse(argv=argv, cwd=cwd).SerializeToString()

    async def execute(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        message = _parse(process_pb2.ExecuteRequest, request)
        spec = CommandSpec.of(messages.process_spec(message), messages.command_as_written(message))
        messages.require(spec.max_output_bytes <= self._config.max_output_bytes,
                         f"max_output_bytes is over this sandbox's limit of {self._config.max_output_bytes}")
        outputs = _Outputs()
        async with self._reaper.command():
            run = asyncio.ensure_future(self._processes.execute(spec, outputs))
            run.add_done_callback(lambda _: outputs.queue.put_nowait(None))
            try:
                yield _event(started=process_pb2.Started())
                while (event := await outputs.queue.get()) is not None:
                    yield event.SerializeToString()
                result = run.result()
            finally:
                outputs.close()
                if not run.done():
                    run.cancel()  # the call was canceled: the group is killed and reaped
                await _settled(run)
        finished = process_pb2.Finished(
            exit_code=result.exit_code,
            truncated=result.truncated,
            timed_out=result.timed_out,
            canceled=result.canceled,
            duration_seconds=result.duration_seconds,
        )
        yield _event(finished=finished)

    async def perform(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        operation = OPERATIONS[method]
        message = _parse(operation.request, request)
        self._check_roots(message)
        seconds = self._config.operation_seconds
        if operation.document:
            limits = messages.document_limits(message.limits)  # type: ignore[attr-defined]
            seconds = min(limits.timeout_seconds, self._config.max_document_seconds)
        return await self._workers.call(method, request, seconds=seconds, what=operation.what)

    def _guarded(
        self, handler: Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]],
    ) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
        async def run(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
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
        self, handler: Callable[[bytes, grpc.aio.ServicerContext], AsyncIterator[bytes]],
    ) -> Callable[[bytes, grpc.aio.ServicerContext], AsyncIterator[bytes]]:
        async def run(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            with self.activity.call():
                try:
                    async for item in handler(request, context):
                        yield item
                except (grpc.aio.AbortError, asyncio.CancelledError):
                    raise
                except Exception as error:
                    await _abort(context, error)

        return run

    def _check_roots(self, message: Message) -> None:
        """Requested roots must be mounted roots or beneath one; writes need a writable one."""
        mounted = [root.path for root in self._config.roots]
        for root in getattr(message, "roots", ()):
            messages.require(messages.beneath(root, mounted), f"root {root!r} is not mounted in this sandbox")
        if isinstance(message, workspace_pb2.ReplaceFileRequest):
            writable = [root.path for root in self._config.roots if root.writable]
            if not messages.beneath(message.expected.resource_id, writable):
                raise PermissionError(f"{message.expected.resource_id} is in a read-only root of this sandbox")


def _parse(cls: type[M], data: bytes) -> M:
    try:
        return cls.FromString(data)
    except DecodeError:
        raise ValueError(f"malformed {cls.DESCRIPTOR.name}") from None


def _event(**event: Message) -> bytes:
    return process_pb2.ExecuteEvent(**event).SerializeToString()


async def _settled(task: asyncio.Future[Any]) -> None:
    """Wait until ``task`` is done, even when this wait is canceled meanwhile."""
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            continue
    if not task.cancelled():
        task.exception()  # retrieved: its outcome was handled or is being replaced by a cancel


async def _abort(context: grpc.aio.ServicerContext, error: BaseException) -> None:
    if isinstance(error, OperationFailed):
        code, wire = KINDS[error.error.kind][0], error.error
    else:
        code, wire = to_status(error)
    if wire.kind == errors_pb2.ERROR_KIND_INTERNAL:
        log.error("internal error", exc_info=error)
    await context.abort(code, wire.message, trailing_metadata=((ERROR_METADATA_KEY, wire.SerializeToString()),))


