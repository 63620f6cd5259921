"""What the service reports: one :class:`ServiceEvent` per request, refusal, sandbox and command.

The service hands every event to its sinks, anything with a ``record`` method
(:class:`EventSink`): an audit log, a telemetry exporter, a test's list. A sink that fails is
logged and skipped; it never fails the call that caused the event.

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

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)


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
        self.sink.record(event.kind, json.loads(json.dumps(fields, default=str)))


class Events:
    """The service's sinks, each given every event in turn."""

    def __init__(self, sinks: Iterable[EventSink] = ()) -> None:
        self.sinks = list(sinks)

    def emit(self, kind: str, tenant: str = "", sandbox: str = "", **fields: Any) -> None:
        if not self.sinks:
            return
        event = ServiceEvent(kind, tenant, sandbox, fields)
        for sink in self.sinks:
            try:
                sink.record(event)
            except Exception:
                log.exception("event sink %r failed on %s", sink, kind)
