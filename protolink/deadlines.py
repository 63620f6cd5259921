"""Deadlines that do not take a held-up event loop for a late answer.

When a blocking step of the loop's caller holds it up past a deadline, the answer that came in
time and the deadline's expiry are seen in the same turn of the loop: the answer's readiness
callback only wakes the task that would take it, and the deadline's callback, in that turn,
cancels the task before it runs. :class:`timeout` gives a deadline noticed that late
:data:`LATE_SECONDS` more, so what came meanwhile is read first. Standard library only: every
layer may use it.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Self

#: A deadline noticed this much after it passed says that the loop was held up (a blocking step
#: of its caller's), not that the other side was late: its answer may wait unread.
LATE_SECONDS = 0.5


class timeout:
    """:func:`asyncio.timeout` of ``seconds``, but one noticed LATE_SECONDS or more after it
    passed expires LATE_SECONDS later (see the module). Entered, it is the deadline:
    :meth:`reschedule` and :meth:`expired` as :class:`asyncio.Timeout`'s."""

    __slots__ = ("_seconds", "_expiry", "_loop", "_noticing")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._expiry = asyncio.Timeout(None)  # set only once the deadline is noticed
        self._noticing: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> Self:
        await self._expiry.__aenter__()
        self._loop = asyncio.get_running_loop()
        self.reschedule(self._loop.time() + self._seconds)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> bool | None:
        self.forget()
        return await self._expiry.__aexit__(kind, error, traceback)

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
