"""The Execute stream on the client's own connection (:mod:`protolink.sandbox.aio_call`) against the
real sandbox server: the output arrives exactly as grpcio's client receives it, and a backend closed
while a command runs has the server kill that command. (It is the path of a sandbox over TCP, or of
one without the command channel: ``command_channel=False`` here; the channel's own tests are in
test_sandbox_command_channel.py.)"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from protolink.errors import SandboxError
from protolink.execution.process_types import ProcessSpec
from protolink.sandbox import connect, process_stream
from protolink.sandbox.aio_call import AsyncCall
from tests.integration.test_sandbox_server import alive, settle
from tests.sandbox_server import RunningServer, sandbox_server, unused_uid

pytestmark = pytest.mark.root

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
#: Megabytes on both channels, text and bytes that are not UTF-8.
SCRIPT = ("seq 1 1300000; printf 'é\\377\\n' >&2; head -c 2000000 /dev/zero | tr '\\0' '\\377' >&2; "
          "echo end")
STDOUT = "".join(f"{n}\n" for n in range(1, 1_300_001)) + "end\n"
STDERR = "é\ufffd\n" + "\ufffd" * 2_000_000


class Recorder:
    def __init__(self) -> None:
        self.outputs: list[tuple[str, str]] = []

    async def emit(self, type: str, **data: Any) -> None:
        if type == "process.output":
            self.outputs.append((data["channel"], data["text"]))


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[tuple[RunningServer, Path]]:
    root = Path(tempfile.mkdtemp(prefix="protolink-own-stream-test-")).resolve()
    root.chmod(0o755)
    uid = unused_uid()
    os.chown(root, uid, uid)
    async with sandbox_server([(root, True)], uid=uid) as running:
        yield running, root


async def test_the_backend_made_by_connect_runs_processes_on_its_own_connection(server, monkeypatch):
    running, root = server
    opened: list[AsyncCall] = []
    original = AsyncCall.__init__

    def recording(self: AsyncCall, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(AsyncCall, "__init__", recording)
    async with await connect(running.address, command_channel=False) as backend:
        result = await backend.execute(ProcessSpec(("/bin/echo", "own"), str(root), ENV, 60, 1000), Recorder())
    assert result.stdout == "own\n"
    assert len(opened) == 1


async def test_output_arrives_exactly_as_grpcios_client_receives_it(server):
    running, root = server
    spec = ProcessSpec(("/bin/sh", "-c", SCRIPT), str(root), ENV, 120, 1 << 25)
    own_recorder, grpc_recorder = Recorder(), Recorder()
    async with await connect(running.address, command_channel=False) as own:
        mine = await own.execute(spec, own_recorder)
        await own._grpc_processes.aclose()
        own._grpc_processes = process_stream.ProcessStream(process_stream.grpc_calls(own._channel, ()), max_in_flight=4)
        theirs = await own.execute(spec, grpc_recorder)
    assert (mine.stdout, mine.stderr) == (STDOUT, STDERR)
    assert (mine.stdout, mine.stderr, mine.exit_code, mine.truncated) == (
        theirs.stdout, theirs.stderr, theirs.exit_code, theirs.truncated)
    for recorder in (own_recorder, grpc_recorder):
        assert "".join(text for stream, text in recorder.outputs if stream == "stdout") == mine.stdout


async def test_a_backend_closed_while_a_command_runs_has_the_server_kill_it(server):
    running, root = server
    marker = root / "sleeper.pid"
    backend = await connect(running.address, command_channel=False)
    spec = ProcessSpec(("/bin/sh", "-c", f"sleep 300 & echo $! > {marker}; wait"), str(root), ENV, 600, 1000)
    call = asyncio.ensure_future(backend.execute(spec, Recorder()))
    await settle(marker.exists, "the command to start")
    await settle(lambda: bool(marker.read_text().strip()), "the command to write its pid")
    sleeper = int(marker.read_text())
    await backend.aclose()
    with pytest.raises(SandboxError):
        await call
    await settle(lambda: not alive(sleeper), "the sleeper to be killed")
