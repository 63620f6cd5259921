"""Deadlines that do not take a held-up event loop for a late answer.

When a blocking step of the loop's caller holds it up past a deadline, the answer that came in
time and the deadline's expiry are seen in the same turn of the loop: the answer's readiness
callback only wakes the task that would take it, and the deadline's callback, in that turn,
cancels the task before it runs. :func:`timeout` gives a deadline noticed that late
:data:`LATE_SECONDS` more, so what came meanwhile is read first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

#: A deadline noticed this much after it passed says that the loop was held up (a blocking step
#: of its caller's), not that the other side was late: its answer may wait unread.
LATE_SECONDS = 0.5


class Deadline:
    """The deadline :func:`timeout` keeps: :meth:`reschedule` and :meth:`expired` as
    :class:`asyncio.Timeout`'s."""

    def __init__(self, expiry: asyncio.Timeout, when: float | None) -> None:
        self._expiry = expiry  # entered without a deadline: set only once one is noticed
        self._loop = asyncio.get_running_loop()
        self._noticing: asyncio.TimerHandle | None = None
        self.reschedule(when)

    def reschedule(self, when: float | None) -> None:
        """Expire at the loop's time ``when`` (None: never)."""
        self.forget()
        self._expiry.reschedule(None)  # a late deadline's extra time, if one was noticed
        if when is not None:
            self._noticing = self._loop.call_at(when, self._due, when)

    def expired(self) -> bool:
        return self._expiry.expired()

    def forget(self) -> None:
        """Stop noticing the deadline (the block it bounds is over)."""
        if self._noticing is not None:
            self._noticing.cancel()
            self._noticing = None

    def _due(self, when: float) -> None:
        self._noticing = None
        now = self._loop.time()
        self._expiry.reschedule(now + LATE_SECONDS if now - when >= LATE_SECONDS else now)


@contextlib.asynccontextmanager
async def timeout(seconds: float) -> AsyncIterator[Deadline]:
    """:func:`asyncio.timeout` of ``seconds``, but one noticed LATE_SECONDS or more after it
    passed expires LATE_SECONDS later (see the module)."""
    async with asyncio.timeout(None) as expiry:
        deadline = Deadline(expiry, asyncio.get_running_loop().time() + seconds)
        try:
            yield deadline
        finally:
            deadline.forget()
