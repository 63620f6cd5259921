"""Typed runtime events, correlated by run, task and action, with redaction at the boundary."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

Redactor = Callable[[dict[str, Any]], dict[str, Any]]
EventSink = Callable[["Event"], None | Awaitable[None]]

#: Event types the runtime itself emits; tools add their own (``process.output``, ...).
ACTION_EVENTS = (
    "action.requested",
    "action.approval_requested",
    "action.approved",
    "action.denied",
    "action.started",
    "action.completed",
    "action.failed",
    "action.canceled",
)


@dataclass(frozen=True)
class Event:
    """One thing that happened, with the ids that correlate it."""

    type: str
    data: Mapping[str, Any]
    run_id: str | None = None
    task_id: str | None = None
    action_id: str | None = None
    sequence: int = 0
    timestamp: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "data": dict(self.data),
            "run_id": self.run_id,
            "task_id": self.task_id,
            "action_id": self.action_id,
            "sequence": self.sequence,
            "timestamp": self.timestamp,
        }


class Subscription:
    """An async iterator over events published after it was opened."""

    def __init__(self, bus: EventBus, maxsize: int) -> None:
        self._bus = bus
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize)
        self._closed = False
        self.dropped = 0

    def _offer(self, event: Event) -> None:
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1

    def close(self) -> None:
        """Stop receiving; iteration ends after the events already queued."""
        if self in self._bus._subscriptions:
            self._bus._subscriptions.remove(self)
            self._closed = True
            if self._queue.empty():
                self._queue.put_nowait(None)  # wakes a reader waiting for an event

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        event = await self._queue.get()
        if event is None:
            raise StopAsyncIteration
        return event

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class EventBus:
    """Publishes events to sinks and subscriptions, redacting each event once before it leaves."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        self.redactor = redactor
        self._sinks: list[EventSink] = []
        self._subscriptions: list[Subscription] = []
        self._sequence = itertools.count(1)

    def add_sink(self, sink: EventSink) -> Callable[[], None]:
        """Deliver every event to ``sink`` (sync or async); returns a function that removes it.
        A sink that raises is logged and skipped: an observer cannot fail the call it observes
        (a tool whose ``action.completed`` failed would look undone, and be run again)."""
        self._sinks.append(sink)
        return lambda: self._sinks.remove(sink) if sink in self._sinks else None

    def subscribe(self, *, maxsize: int = 10_000) -> Subscription:
        """Open a subscription; events beyond ``maxsize`` unread are counted in ``dropped``."""
        subscription = Subscription(self, maxsize)
        self._subscriptions.append(subscription)
        return subscription

    def redact(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Apply the redaction hook to a payload about to leave the runtime."""
        return self.redactor(payload) if self.redactor else payload

    async def publish(
        self,
        type: str,
        data: Mapping[str, Any],
        *,
        run_id: str | None = None,
        task_id: str | None = None,
        action_id: str | None = None,
    ) -> Event:
        sequence = next(self._sequence)
        event = Event(type, self.redact(dict(data)), run_id, task_id, action_id, sequence)
        for subscription in list(self._subscriptions):
            subscription._offer(event)
        for sink in list(self._sinks):
            try:
                outcome = sink(event)
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception:  # noqa: BLE001 (an observer's failure is its own)
                log.exception("event sink %r failed on %s", sink, type)
        return event
