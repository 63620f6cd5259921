"""Accepting a listener's connections from the event loop, without spinning when the process is
out of descriptors."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

log = logging.getLogger(__name__)

#: How long connections wait in the backlog after an accept failed for want of descriptors.
PAUSE_SECONDS = 0.1
#: The most connections taken in one go, so that a flood of them cannot hold the loop.
MAX_AT_ONCE = 64


class Acceptor:
    """Calls ``accept`` whenever ``listener`` is readable, from the running loop, until
    :meth:`close`. ``accept`` takes one waiting connection and raises BlockingIOError when none
    is left. Any other OSError (out of descriptors, or of memory) is logged, naming ``what``, and
    the connections wait in the backlog :data:`PAUSE_SECONDS`: the listener stays readable, so
    trying again at once would spin."""

    def __init__(self, listener: socket.socket, accept: Callable[[], None], what: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd = listener.fileno()
        self._accept = accept
        self._what = what
        self._resume: asyncio.TimerHandle | None = None
        self._closed = False
        self._loop.add_reader(self._fd, self._ready)

    def close(self) -> None:
        """Accept no more (the caller closes the listener)."""
        if self._closed:
            return
        self._closed = True
        if self._resume is not None:
            self._resume.cancel()
        else:
            self._loop.remove_reader(self._fd)

    def _ready(self) -> None:
        for _ in range(MAX_AT_ONCE):
            try:
                self._accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # it left before it was taken
                continue
            except OSError as error:
                log.warning("%s cannot accept a connection now: %s", self._what, error)
                self._loop.remove_reader(self._fd)
                self._resume = self._loop.call_later(PAUSE_SECONDS, self._reopen)
                return

    def _reopen(self) -> None:
        self._resume = None
        self._loop.add_reader(self._fd, self._ready)
