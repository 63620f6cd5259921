"""A task that owns the connection it is handed, on real sockets: canceled before it ran, it
closes that connection."""

from __future__ import annotations

import asyncio
import socket

from protolink.net.tasks import owning_task


async def serve(sock: socket.socket, served: list[socket.socket]) -> None:
    served.append(sock)
    try:
        await asyncio.sleep(3600)
    finally:
        sock.close()


async def test_a_task_canceled_before_it_ran_closes_its_connection() -> None:
    ours, peer = socket.socketpair()
    served: list[socket.socket] = []
    peer.setblocking(False)
    with peer:
        task = owning_task(serve(ours, served), ours.close)
        task.cancel()  # in the turn it was made: its coroutine never runs
        await asyncio.gather(task, return_exceptions=True)
        assert served == [] and task.cancelled()
        assert peer.recv(1) == b""  # the peer sees the end now, not when the collector finds the socket

