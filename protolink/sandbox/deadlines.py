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


@contextlib.asynccontextmanager
async def timeout(seconds: float) -> AsyncIterator[asyncio.Timeout]:
    """:func:`asyncio.timeout` of ``seconds``, but one noticed LATE_SECONDS or more after it
    passed expires LATE_SECONDS later (see the module)."""
    loop = asyncio.get_running_loop()
    when = loop.time() + seconds
    async with asyncio.timeout(None) as deadline:

        def due() -> None:
            now = loop.time()
            deadline.reschedule(now + LATE_SECONDS if now - when >= LATE_SECONDS else now)

        noticing = loop.call_at(when, due)
        try:
            yield deadline
        finally:
            noticing.cancel()
