"""Optional OpenTelemetry export: a sink of the service's events that turns each ended call or
command into a span (the ``telemetry`` extra: ``pip install 'protolink[telemetry]'``).

An event becomes a span when its fields carry ``duration_seconds``; the span starts at its
``started`` field (Unix seconds, or ISO 8601 with a zone) or, without one, ``duration_seconds``
before the event is recorded. Its name is the event's kind without a trailing ``.ended``
(``command.ended`` -> ``command``); every other field becomes an attribute ``protolink.<field>``
(a list of strings, or of numbers, as it is; anything nested as its JSON); an ``error`` field
marks the span failed. Other events are not spans, and are ignored.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .audit import JSON, canonical

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

START_FIELD = "started"
DURATION_FIELD = "duration_seconds"
ATTRIBUTE_PREFIX = "protolink."
_SCALARS = (bool, int, float, str)


def _trace() -> Any:
    """The ``opentelemetry.trace`` module; ImportError naming the extra when it is missing."""
    try:
        from opentelemetry import trace
    except ImportError:
        raise ImportError("span export needs the telemetry extra: pip install 'protolink[telemetry]'") from None
    return trace


class SpanSink:
    """Records spans through ``tracer_provider`` (default: OpenTelemetry's global provider,
    which the application or ``opentelemetry-instrument`` configures). Safe from any thread;
    a span's parent is the span current where :meth:`record` is called, if any."""

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self._trace = _trace()
        provider = tracer_provider or self._trace.get_tracer_provider()
        self._tracer = provider.get_tracer("protolink.sandbox.service")

    def record(self, kind: str, fields: Mapping[str, JSON]) -> None:
        """Export the event as a span when it has a duration (see the module)."""
        duration = fields.get(DURATION_FIELD)
        if isinstance(duration, bool) or not isinstance(duration, (int, float)) or duration < 0:
            return
        length = round(duration * 1e9)
        started = _nanoseconds(fields.get(START_FIELD))
        start = time.time_ns() - length if started is None else started
        attributes = {ATTRIBUTE_PREFIX + name: _attribute(value) for name, value in fields.items()
                      if name not in (START_FIELD, DURATION_FIELD) and value is not None}
        span_kind = self._trace.SpanKind.SERVER if kind == "request" else self._trace.SpanKind.INTERNAL
        span = self._tracer.start_span(kind.removesuffix(".ended"), kind=span_kind, start_time=start,
                                       attributes=attributes)
        if fields.get("error") is not None:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(fields["error"])))
        span.end(end_time=start + length)


def _nanoseconds(value: JSON) -> int | None:
    """``value`` (Unix seconds, or ISO 8601 with a zone) in nanoseconds since the epoch, to the
    microsecond (a float of seconds holds no finer); None when it is neither."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return round(value * 1e6) * 1000
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return None
        if moment.tzinfo is not None:
            return round(moment.timestamp() * 1e6) * 1000
    return None


def _attribute(value: JSON) -> Any:
    """``value`` as an OpenTelemetry attribute: a scalar or a list of one scalar type as it is,
    anything else as its JSON."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (list, tuple)) and value:
        kinds = {type(item) for item in value}
        if len(kinds) == 1 and kinds <= set(_SCALARS):
            return list(value)
    return canonical(value).decode()
