"""A real grpc.aio server on an event loop of its own, in a thread.

The client's loop can then be held (``time.sleep``) while the server ends a call: the client's
next write goes out on a stream its gRPC core has already closed, the case in which grpcio
(grpc/grpc#36066) sets INTERNAL "Internal error from Core" as a call's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc

#: A hang guard, never a measure: how long the server may take to start, or to stop.
STOP_SECONDS = 30.0


@dataclass(frozen=True)
class ServerThread:
    """A running server's ``address``, and the ``loop`` its handlers run on."""

    address: str
    loop: asyncio.AbstractEventLoop

    def call_soon(self, function: Callable[[], object]) -> None:
        """Run ``function()`` on the server's loop, as its handlers do."""
        self.loop.call_soon_threadsafe(function)


@contextlib.contextmanager
def threaded_server(*handlers: grpc.GenericRpcHandler) -> Iterator[ServerThread]:
    """A server of ``handlers`` on loopback, running on its own loop in a thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(handlers)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(STOP_SECONDS)
    try:
        yield ServerThread(f"127.0.0.1:{port}", loop)
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(STOP_SECONDS)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(STOP_SECONDS)
        loop.close()
