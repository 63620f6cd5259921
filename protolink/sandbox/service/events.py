"""What the service reports: one :class:`ServiceEvent` per request, refusal, sandbox and command.

The service hands every event to its sinks, anything with a ``record`` method
(:class:`EventSink`): an audit log, a telemetry exporter, a test's list. A sink that fails is
logged and skipped; it never fails the call that caused the event. The service's sinks hear of
its events off the calls' path (:class:`Events` given its event loop): every one, in order, but
:data:`DEFER_SECONDS` later, in a batch, while the call that caused them waits for its sandbox or
its answer is on its way.

Kinds and their fields:

- ``request`` (``method``), ``refused`` (``method``, ``code``, ``reason``)
- ``sandbox.created`` (``template``, ``image``, ``pooled``, ``duration_seconds``),
  ``sandbox.lost`` (``reason``; on Swarm ``node`` too: its container or task stopped behind the
  service's back, followed by ``sandbox.removed``),
  ``sandbox.removed`` (``reason``: ``deleted``, ``expired``, ``idle``, ``down``, ``lost``)
- ``command.started`` (``argv``, ``cwd``), ``command.ended`` (``argv``, ``cwd``, ``exit_code``,
  ``duration_seconds``, ``output_bytes``, ``timed_out``, ``error``)
- ``file.written`` (``path``, ``bytes``: None for a removal)
- ``egress`` (the proxy's :class:`~protolink.sandbox.egress.events.EgressEvent` as a dict, its
  ``kind`` as ``decision``)
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)
#: How long after an event the service's sinks hear of it: a call's next steps go first (its
#: request to the sandbox, its answer to the caller, both some 0.1-0.5 ms away), the sandbox's
#: answer (some 2 ms) is awaited meanwhile.
DEFER_SECONDS = 0.001
_AS_TEXT_IF_NOT_JSON = json.JSONEncoder(default=str)


@dataclass(frozen=True)
class ServiceEvent:
    """One thing the service did or refused: its ``kind``, the ``tenant`` (the token's id, see
    :class:`~.tokens.Tenant`; empty before a token is known), the ``sandbox`` id (empty for none), its ``fields`` and its ``time``
    (Unix seconds)."""

    kind: str
    tenant: str = ""
    sandbox: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class EventSink(Protocol):
    """Where events go: ``record`` is called on the service's event loop, and must not block."""

    def record(self, event: ServiceEvent) -> None: ...


class FieldSink(Protocol):
    """A sink of ``(kind, fields)``: the audit log, the OpenTelemetry span sink."""

    def record(self, kind: str, fields: Mapping[str, Any]) -> None: ...


class Flattened:
    """An :class:`EventSink` over a :class:`FieldSink`: the tenant and the sandbox join the fields,
    and every value becomes JSON (an address as its text)."""

    def __init__(self, sink: FieldSink) -> None:
        self.sink = sink

    def record(self, event: ServiceEvent) -> None:
        fields = {"tenant": event.tenant, "sandbox": event.sandbox, **event.fields}
        self.sink.record(event.kind, json.loads(_AS_TEXT_IF_NOT_JSON.encode(fields)))


class Events:
    """The service's sinks, each given every event in turn: at once, or, with ``loop``,
    :data:`DEFER_SECONDS` later on that loop (an audit record costs some 20-40 us, and 300 us or
    more on a CPU that was idle: the call that caused it goes on first). Deferred events keep
    their order; :meth:`flush` hands over what waits (call it before closing a sink)."""

    def __init__(self, sinks: Iterable[EventSink] = (), *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.sinks = list(sinks)
        self._loop = loop
        self._waiting: collections.deque[ServiceEvent] = collections.deque()
        self._flush_due = False
        self._lock = threading.Lock()  # an egress decision may come from another thread

    def emit(self, kind: str, tenant: str = "", sandbox: str = "", **fields: Any) -> None:
        if not self.sinks:
            return
        event = ServiceEvent(kind, tenant, sandbox, fields)
        if self._loop is None:
            self._hand_over(event)
            return
        with self._lock:
            self._waiting.append(event)
            if self._flush_due:
                return
            self._flush_due = True
        if _running_loop() is self._loop:
            self._loop.call_later(DEFER_SECONDS, self.flush)
        else:
            self._loop.call_soon_threadsafe(self._loop.call_later, DEFER_SECONDS, self.flush)

    def flush(self) -> None:
        """Hand every deferred event to the sinks, in the order they came."""
        with self._lock:
            self._flush_due = False
            while self._waiting:
                self._hand_over(self._waiting.popleft())

    def _hand_over(self, event: ServiceEvent) -> None:
        for sink in self.sinks:
            try:
                sink.record(event)
            except Exception:
                log.exception("event sink %r failed on %s", sink, event.kind)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
