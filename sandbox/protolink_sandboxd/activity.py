"""Whether calls are running, and since when none has (background work waits for quiet)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator


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
