"""Accepting from the event loop: a failed accept (out of descriptors) pauses instead of
spinning on a listener that stays readable, then accepts again; closing during a pause stops it."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import time
from collections.abc import Iterator

from protolink.net.accepting import PAUSE_SECONDS, Acceptor

GUARD_SECONDS = 30.0


class OutOfDescriptors:
    """An accept that fails as a process without descriptors does, ``failures`` times, then takes
    the connections."""

    def __init__(self, listener: socket.socket, failures: int) -> None:
        self.listener = listener
        self.failures = failures
        self.tries = 0
        self.failed_at: list[float] = []
        self.taken: list[socket.socket] = []

    def __call__(self) -> None:
        self.tries += 1
        if self.failures:
            self.failed_at.append(time.monotonic())
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        connection, _ = self.listener.accept()
        self.taken.append(connection)


@contextlib.contextmanager
def accepting(failures: int) -> Iterator[tuple[OutOfDescriptors, Acceptor]]:
    """A listener with a connection waiting, accepted from by an Acceptor whose first
    ``failures`` accepts fail for want of descriptors."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        listener.bind("")  # an abstract address of the kernel's choosing
        listener.listen(8)
        listener.setblocking(False)
        accept = OutOfDescriptors(listener, failures)
        acceptor = Acceptor(listener, accept, "the test listener")
        client.connect(listener.getsockname())
        try:
            yield accept, acceptor
        finally:
            acceptor.close()
            for connection in accept.taken:
                connection.close()


async def test_a_failed_accept_pauses_then_serves():
    with accepting(failures=3) as (accept, _):
        await asyncio.wait_for(until(lambda: accept.taken), GUARD_SECONDS)
        assert accept.failures == 0 and len(accept.taken) == 1
        gaps = [later - earlier for earlier, later in zip(accept.failed_at, accept.failed_at[1:])]
        assert min(gaps) >= PAUSE_SECONDS * 0.9  # a pause after each failure, not a loop on a readable listener


async def test_closed_during_a_pause_it_accepts_no_more():
    with accepting(failures=1) as (accept, acceptor):
        await asyncio.wait_for(until(lambda: accept.tries), GUARD_SECONDS)
        acceptor.close()
        await asyncio.sleep(PAUSE_SECONDS * 3)
        assert accept.tries == 1 and not accept.taken


async def until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)
