"""Spans per call: ended calls and commands become spans with their timing and fields, read
back from the OpenTelemetry SDK's in-memory exporter; other events make none."""

from __future__ import annotations

import subprocess
import sys
import time

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from protolink.sandbox.service.telemetry import SpanSink


def _sink() -> tuple[SpanSink, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return SpanSink(provider), exporter


def test_an_ended_command_is_a_span_with_its_timing_and_fields():
    sink, exporter = _sink()
    sink.record("command.ended", {"token": "alice", "sandbox": "sb-1", "argv": ["make", "test"], "cwd": "/work",
                                  "exit": 2, "bytes": 4096, "started": 1796170000.25, "duration_seconds": 1.5})
    (span,) = exporter.get_finished_spans()
    assert (span.name, span.kind, span.status.status_code) == ("command", SpanKind.INTERNAL, StatusCode.UNSET)
    assert (span.start_time, span.end_time) == (1796170000_250000000, 1796170001_750000000)
    assert dict(span.attributes) == {"protolink.token": "alice", "protolink.sandbox": "sb-1",
                                     "protolink.argv": ("make", "test"), "protolink.cwd": "/work",
                                     "protolink.exit": 2, "protolink.bytes": 4096}


def test_a_request_with_an_iso_start_and_an_error_is_a_failed_server_span():
    sink, exporter = _sink()
    sink.record("request", {"method": "CreateSandbox", "started": "2026-12-01T23:00:00.5+00:00",
                            "duration_seconds": 0.25, "error": "quota: 4 sandboxes at most"})
    (span,) = exporter.get_finished_spans()
    assert (span.name, span.kind) == ("request", SpanKind.SERVER)
    assert (span.status.status_code, span.status.description) == (StatusCode.ERROR, "quota: 4 sandboxes at most")
    assert (span.start_time, span.end_time - span.start_time) == (1796166000_500000000, 250_000_000)


def test_without_a_start_the_span_ends_when_the_event_is_recorded():
    sink, exporter = _sink()
    before = time.time_ns()
    sink.record("command.ended", {"duration_seconds": 2.0})
    after = time.time_ns()
    (span,) = exporter.get_finished_spans()
    assert span.end_time - span.start_time == 2_000_000_000
    assert before <= span.end_time <= after


def test_events_without_a_duration_are_not_spans():
    sink, exporter = _sink()
    for kind in ("sandbox.created", "command.started", "egress", "refused"):
        sink.record(kind, {"sandbox": "sb-1"})
    sink.record("command.ended", {"duration_seconds": "soon"})
    assert exporter.get_finished_spans() == ()


def test_nested_and_mixed_fields_become_json_attributes():
    sink, exporter = _sink()
    sink.record("file.written", {"duration_seconds": 0.0, "limits": {"memory_mib": 512}, "mixed": [1, "a"],
                                 "none": None, "empty": []})
    (span,) = exporter.get_finished_spans()
    assert dict(span.attributes) == {"protolink.limits": '{"memory_mib":512}', "protolink.mixed": '[1,"a"]',
                                     "protolink.empty": "[]"}


def test_without_the_sdk_the_error_names_the_extra():
    script = ("import sys\nsys.modules['opentelemetry'] = None\n"
              "from protolink.sandbox.service.telemetry import SpanSink\nSpanSink()")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "ImportError: span export needs the telemetry extra: pip install 'protolink[telemetry]'" in done.stderr
