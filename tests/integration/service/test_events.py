"""The service's events, as a sink receives them: requests, refusals, sandboxes, commands, files."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid

import pytest

from protolink.errors import SandboxAuthenticationError, SandboxNotFoundError
from protolink.sandbox.service.client import connect
from protolink.sandbox.service.config import ServiceConfig
from protolink.sandbox.service.daemon import serve
from protolink.sandbox.service.audit import verify
from protolink.sandbox.service.events import Flattened, ServiceEvent
from protolink.sandbox.service.files import ServiceFiles
from protolink.sandbox.service.process import remove_everything
from protolink.sandbox.service.telemetry import SpanSink
from protolink.sandbox.service.watched import CALL_ENDED
from tests.conftest import TEST_NAME_PREFIX

pytestmark = pytest.mark.docker


class Collected:
    """A sink that keeps every event."""

    def __init__(self) -> None:
        self.events: list[ServiceEvent] = []

    def record(self, event: ServiceEvent) -> None:
        self.events.append(event)

    def of(self, kind: str) -> list[ServiceEvent]:
        return [event for event in self.events if event.kind == kind]


@contextlib.asynccontextmanager
async def serving(image: str, sink: Collected, docker_client, *more_sinks, pool: int | None = None):
    name = f"{TEST_NAME_PREFIX}svc-{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()
    task = asyncio.ensure_future(serve(name, ServiceConfig.load(None, image=image, pool=pool),
                                       sinks=[sink, *more_sinks], stop=stop))
    files = ServiceFiles.of(name)
    try:
        while not files.pid.exists():
            assert not task.done(), task.exception()
            await asyncio.sleep(0.02)
        yield files
    finally:
        stop.set()
        await task
        remove_everything(name, docker_client)


async def test_a_sink_gets_every_request_sandbox_command_and_file(runtime, sandbox_image, docker_client, run):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    sink = Collected()
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    async with serving(sandbox_image, sink, docker_client, Flattened(SpanSink(provider))) as files:
        with pytest.raises(SandboxAuthenticationError):
            await connect(files.address, "wrong", timeout=30.0)
        client = await connect(files.address, files.default_token.read_text(), timeout=30.0)
        async with await client.create(workspace=True) as sandbox:
            workspace = sandbox.status.workspace
            result = await run(sandbox.backend, ["/bin/sh", "-c", "printf 12345; exit 3"], cwd=workspace)
            assert result.exit_code == 3
            absent = await sandbox.backend.snapshot_file(f"{workspace}/made.txt", roots=[workspace],
                                                         max_file_bytes=1000)
            await sandbox.backend.replace_file(absent.revision, b"abc", None, roots=[workspace])
        await client.aclose()
    refused = sink.of("refused")[0]
    assert (refused.tenant, refused.fields["code"]) == ("", "UNAUTHENTICATED")
    created, removed = sink.of("sandbox.created")[0], sink.of("sandbox.removed")[0]
    assert created.sandbox == removed.sandbox == sandbox.id and removed.fields["reason"] == "deleted"
    tenant = created.tenant
    assert {"Create", "/protolink.sandbox.v1.Sandbox/Execute", "Delete"} <= {
        event.fields["method"] for event in sink.of("request") if event.tenant == tenant}
    started, ended = sink.of("command.started")[0], sink.of("command.ended")[0]
    assert started.fields["argv"] == ["/bin/sh", "-c", "printf 12345; exit 3"] and started.fields["cwd"] == workspace
    assert (ended.fields["exit_code"], ended.fields["output_bytes"], ended.tenant, ended.sandbox) == (
        3, 5, tenant, sandbox.id)
    assert ended.fields["duration_seconds"] > 0
    written = sink.of("file.written")[0]
    assert (written.fields["path"], written.fields["bytes"]) == (f"{workspace}/made.txt", 3)

    # the audit log holds the same events, chained, and verifies
    report = verify(files.audit)
    assert report.intact and report.count == len(sink.events), report.problems
    records = [json.loads(line) for line in files.audit.read_text().splitlines()]
    assert [record["kind"] for record in records] == [event.kind for event in sink.events]
    ended_record = next(record for record in records if record["kind"] == "command.ended")
    assert ended_record["fields"]["exit_code"] == 3 and ended_record["fields"]["sandbox"] == sandbox.id

    # and the span sink made a span of the command, with its attributes
    command_span = next(span for span in spans.get_finished_spans() if span.name == "command")
    assert command_span.attributes["protolink.exit_code"] == 3
    assert command_span.attributes["protolink.sandbox"] == sandbox.id
    assert [span.attributes["protolink.sandbox"] for span in spans.get_finished_spans()
            if span.name == "sandbox.created"] == [sandbox.id]


async def test_the_commands_of_a_pooled_sandbox_are_its_owners_and_reported(runtime, sandbox_image, docker_client,
                                                                               run):
    """A pool member waits with an Execute call opened to it; its owner's first call goes on that
    one, the next on a new one: both run their commands, reported as the owner's."""
    sink = Collected()
    async with serving(sandbox_image, sink, docker_client, pool=1) as files:
        client = await connect(files.address, files.default_token.read_text(), timeout=30.0)
        deadline = asyncio.get_running_loop().time() + 120  # a hang guard
        while (await client.pool_ready()).get("default") != 1:
            assert asyncio.get_running_loop().time() < deadline, "no pooled sandbox after 120 s"
            await asyncio.sleep(0.1)
        sandbox = await client.create()
        assert sandbox.status.pooled
        first = await run(sandbox.backend, ["/bin/sh", "-c", "printf held; exit 4"])
        await sandbox.backend.aclose()  # its call ends; the next backend opens a new one
        again = await client.open(sandbox.id)
        second = await run(again.backend, ["/bin/echo", "again"])
        await again.delete()
        await client.aclose()
    assert (first.stdout, first.exit_code, second.stdout, second.exit_code) == ("held", 4, "again\n", 0)
    tenant = sink.of("sandbox.created")[0].tenant
    assert [(event.tenant, event.sandbox, event.fields["argv"][-1]) for event in sink.of("command.started")] == [
        (tenant, sandbox.id, "printf held; exit 4"), (tenant, sandbox.id, "again")]
    assert [(event.fields["exit_code"], event.fields["output_bytes"]) for event in sink.of("command.ended")] == [
        (4, 4), (0, 6)]


@pytest.mark.parametrize("pool", [None, 1], ids=["on its own call", "on the call held for a pooled sandbox"])
async def test_a_command_its_deleted_sandbox_ends_is_reported_ended(runtime, sandbox_image, docker_client, run,
                                                                      pool):
    """The audit trail has an end for every command it saw start: one that its sandbox's removal
    kills mid-run ends with its call."""
    sink = Collected()
    async with serving(sandbox_image, sink, docker_client, pool=pool) as files:
        client = await connect(files.address, files.default_token.read_text(), timeout=30.0)
        deadline = asyncio.get_running_loop().time() + 120  # a hang guard
        while pool and (await client.pool_ready()).get("default") != pool:
            assert asyncio.get_running_loop().time() < deadline, "no pooled sandbox after 120 s"
            await asyncio.sleep(0.1)
        sandbox = await client.create()
        command = asyncio.ensure_future(run(sandbox.backend, ["/bin/sleep", "600"], timeout=600))
        while not sink.of("command.started"):
            assert asyncio.get_running_loop().time() < deadline and not command.done(), "the command did not start"
            await asyncio.sleep(0.02)
        await client.delete(sandbox.id)
        with pytest.raises(SandboxNotFoundError):
            await asyncio.wait_for(command, 120)
        await sandbox.backend.aclose()
        await client.aclose()
        while not sink.of("command.ended"):
            assert asyncio.get_running_loop().time() < deadline, "no command.ended"
            await asyncio.sleep(0.02)
    [ended] = sink.of("command.ended")
    assert (ended.sandbox, ended.fields["argv"], ended.fields["exit_code"]) == (sandbox.id, ["/bin/sleep", "600"], None)
    assert ended.fields["error"] == CALL_ENDED
