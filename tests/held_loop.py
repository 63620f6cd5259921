"""A blocking step of a caller's that holds the event loop up past a deadline, for tests of the
deadlines that must not take that for a late answer (:mod:`protolink.deadlines`)."""

from __future__ import annotations

import asyncio
import threading
import time

from protolink.deadlines import LATE_SECONDS

#: A deadline far longer than the few turns of the loop before a test holds it up.
DEADLINE_SECONDS = 1.0
#: How long the loop is held up: well past such a deadline.
HELD_SECONDS = DEADLINE_SECONDS + 2 * LATE_SECONDS


def hold_up(loop: asyncio.AbstractEventLoop) -> threading.Event:
    """Hold ``loop`` up for :data:`HELD_SECONDS` with a blocking ``time.sleep`` in a callback, at
    its next turn; the event is set once it is held (what answers meanwhile waits for it, from a
    thread of its own)."""
    held = threading.Event()

    def block() -> None:
        held.set()
        time.sleep(HELD_SECONDS)

    loop.call_soon_threadsafe(block)
    return held
