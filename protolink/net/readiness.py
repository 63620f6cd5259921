"""Waiting, from the running event loop, until descriptors are ready."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence


async def ready(*, read: Sequence[int] = (), write: Sequence[int] = ()) -> None:
    """Wait until any of ``read`` is readable or any of ``write`` is writable (an error or a
    hang-up on one wakes it too, as epoll reports them)."""
    loop = asyncio.get_running_loop()
    woken = loop.create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    try:
        for fd in read:
            loop.add_reader(fd, wake)
        for fd in write:
            loop.add_writer(fd, wake)
        await woken
    finally:
        for fd in read:
            loop.remove_reader(fd)
        for fd in write:
            loop.remove_writer(fd)
