"""The grpc.aio server: listening socket, authentication, health, limits and shutdown."""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from protolink.errors import SandboxAuthenticationError
from protolink.wire.keepalive import SERVER_KEEPALIVE_OPTIONS
from protolink.wire.status import abort_with, to_status

from .allocator import reuse_large_buffers, share_one_arena
from .config import ServerConfig
from .pipe_listener import PipeListener
from .owned_socket import bind_as_directory_owner
from .service import SERVICE, SandboxService
from .spawner_client import SpawnerClient
from .strays import StraySweeper, kill_strays
from .worker_pool import WorkerPool

#: How long in-flight calls may finish when the server is asked to stop.
STOP_GRACE_SECONDS = 2.0
#: Idle workers are retired once no call has run for this long (the next file call forks one
#: again, in a few milliseconds): an idle sandbox holds its server alone.
RETIRE_WORKERS_WHEN_QUIET_SECONDS = 30.0

log = logging.getLogger("sandbox")


class TokenCheck(grpc.aio.ServerInterceptor):
    """Refuses every call whose ``authorization`` metadata is not ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def allows(self, authorization: bytes) -> bool:
        """Whether ``authorization`` (the metadata's value) is ``Bearer <token>``, compared in
        constant time: the gRPC calls' check, and the command channel's."""
        return hmac.compare_digest(authorization, self._expected)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        supplied = dict(details.invocation_metadata or ()).get("authorization", "")
        supplied_bytes = supplied.encode() if isinstance(supplied, str) else bytes(supplied)
        if handler is None or self.allows(supplied_bytes):
            return handler
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(_refuse_stream)
        return grpc.unary_unary_rpc_method_handler(_refuse)


async def _refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
    await abort_with(context, to_status(SandboxAuthenticationError("missing or wrong token")))


async def _refuse_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
    await abort_with(context, to_status(SandboxAuthenticationError("missing or wrong token")))
    yield  # pragma: no cover - makes this an async generator


def server_options(config: ServerConfig) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        # Calls beyond this wait for a stream on the client side instead of failing.
        ("grpc.max_concurrent_streams", config.max_concurrency),
        *SERVER_KEEPALIVE_OPTIONS,
        ("grpc.so_reuseport", 0),
    ]


def _listen(server: grpc.aio.Server, config: ServerConfig) -> None:
    """Bind the listening socket: a Unix socket as its directory's owner, owner-only."""
    if config.tcp:
        _bind(server, config)
        return
    bind_as_directory_owner(config.socket_path, config.command_uid, lambda: _bind(server, config))


def _bind(server: grpc.aio.Server, config: ServerConfig) -> None:
    try:
        if config.tls_certificate is not None and config.tls_key is not None:
            server.add_secure_port(config.address,
                                   grpc.ssl_server_credentials([(config.tls_key, config.tls_certificate)]))
        else:
            server.add_insecure_port(config.address)
    except RuntimeError:
        raise SystemExit(f"cannot listen on {config.listen}") from None


async def _retire_workers_when_quiet(service: SandboxService, workers: WorkerPool) -> None:
    while True:
        await service.activity.quiet(RETIRE_WORKERS_WHEN_QUIET_SECONDS)
        await workers.retire_idle()
        await asyncio.sleep(RETIRE_WORKERS_WHEN_QUIET_SECONDS)


async def serve(config: ServerConfig, spawner: SpawnerClient, workers: WorkerPool, *, subreapers: bool) -> None:
    """Serve until SIGTERM or SIGINT; then stop accepting, kill every command and worker.

    ``subreapers``: whether the commands' keepers are subreapers here (see :mod:`protolink_sandboxd.strays`)."""
    os.umask(0o077)  # the socket is created owner-only; commands and workers set their own umask
    reuse_large_buffers()
    share_one_arena()  # before gRPC starts its threads
    spawner.start()
    sweeper = StraySweeper(config.command_uid, lambda: spawner.pid, lambda: workers.pids, keepers=spawner.keepers,
                           waiting=lambda: spawner.waiting_keeper, subreapers=subreapers)
    token_check = TokenCheck(config.token) if config.token else None
    server = grpc.aio.server(
        options=server_options(config),
        interceptors=[token_check] if token_check is not None else [],
        maximum_concurrent_rpcs=config.max_concurrency * 4,
    )
    pipes = PipeListener.beside(config)
    service = SandboxService(config, workers, sweeper, spawner, pipes)
    server.add_generic_rpc_handlers((service.handler(),))
    if pipes is not None:
        pipes.serve(service.process_call, token_check.allows if token_check is not None else None)
    health_service = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_service, server)
    _listen(server, config)
    relay = None
    if config.egress_port:  # listening before the server answers: the host dials in once it does
        from .egress_relay import EgressRelay  # only a sandbox with egress loads it

        relay = EgressRelay(config.egress_port, config.egress_socket, command_uid=config.command_uid)
        await relay.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await server.start()
    for name in ("", SERVICE):
        await health_service.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("serving %s on %s", config.boundary, config.listen)
    retiring = asyncio.ensure_future(_retire_workers_when_quiet(service, workers))
    try:
        await stop.wait()
    finally:
        retiring.cancel()
        await health_service.enter_graceful_shutdown()
        await server.stop(STOP_GRACE_SECONDS)
        if pipes is not None:
            await pipes.aclose()
        if relay is not None:
            await relay.aclose()
        await workers.aclose()
        await spawner.aclose()
        await asyncio.to_thread(kill_strays, config.command_uid, None)
