"""Tasks that own what they are handed: a connection, a call, a descriptor."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def owning_task(coroutine: Coroutine[Any, Any, T], release: Callable[[], object]) -> asyncio.Task[T]:
    """A task running ``coroutine``, which owns what ``release`` releases and releases it itself.

    A task canceled before its first step never runs its coroutine, nor the coroutine's own
    ``finally``: that task calls ``release`` once it is done instead (a connection handed to it
    is closed, not left open until the collector finds it). Once the coroutine has run,
    ``release`` is never called: what it does with what it owns is its own (it may hand it on)."""
    started = False

    async def run() -> T:
        nonlocal started
        started = True
        return await coroutine

    def settle(_: asyncio.Task[T]) -> None:
        if not started:
            coroutine.close()  # never awaited: no warning that it was not
            release()

    task = asyncio.ensure_future(run())
    task.add_done_callback(settle)
    return task
