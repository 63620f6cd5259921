"""A command's output pipes passed to the host (:mod:`protolink_sandboxd.pipe_listener`) against
the real sandbox server: the host reads them and the server keeps no copy; a descendant holding
them open, a flood and a timeout end as they do on the host backend; a backend that takes no
pipes gets the same output on the Execute stream. (A writer that never closes, from a hostile
server: tests/unit/sandbox/test_passed_pipes.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from protolink.execution.local import LocalExecutionBackend
from protolink.execution.process_types import NO_EVENTS, ProcessSpec
from protolink.sandbox import connect
from protolink.sandbox.process_stream import PIPES_ABOVE_BYTES
from tests.integration.test_sandbox_server import settle
from tests.sandbox_server import RunningServer, sandbox_server, unused_uid

pytestmark = pytest.mark.root

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
FLOOD_BYTES = 1 << 30
#: A cap above which the pipes are passed.
CAP = PIPES_ABOVE_BYTES + 1


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[tuple[RunningServer, Path]]:
    root = Path(tempfile.mkdtemp(prefix="protolink-passed-pipes-test-")).resolve()
    root.chmod(0o777)
    async with sandbox_server([(root, True)], uid=unused_uid()) as running:
        yield running, root


def pipe_inodes(pid: int | str) -> set[str]:
    """The pipes process ``pid`` holds a descriptor of (``pipe:[INODE]``)."""
    held = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if (target := os.readlink(f"/proc/{pid}/fd/{name}")).startswith("pipe:"):
                held.add(target)
    return held


async def test_the_host_reads_the_commands_pipe_and_the_server_keeps_no_copy(server):
    running, root = server
    marker = root / "writer.pid"
    spec = ProcessSpec(("/bin/sh", "-c", f"echo started; echo $$ > {marker}.tmp; mv {marker}.tmp {marker}; "
                                         f"while [ -e {marker} ]; do sleep 0.01; done; echo done"),
                       str(root), ENV, 120, CAP)
    call = asyncio.ensure_future(running.backend.execute(spec, NO_EVENTS))
    await settle(marker.exists, "the command to start")
    stdout = os.readlink(f"/proc/{int(marker.read_text())}/fd/1")
    assert stdout in pipe_inodes("self")
    assert stdout not in pipe_inodes(running.process.pid)
    marker.unlink()
    result = await call
    assert (result.exit_code, result.stdout) == (0, "started\ndone\n")


@pytest.mark.parametrize("script", [
    "seq 1 100000; printf 'é\\377\\n' >&2; head -c 100000 /dev/zero | tr '\\0' 'x'; exit 4",
    "seq 1 300000",  # past the cap
], ids=["both channels", "truncated"])
async def test_the_same_output_comes_on_the_execute_stream_without_pipes(server, script):
    """Passed pipes, the Execute stream and the host backend keep the same output. (Stdout and
    stderr share one cap in arrival order, so only one channel may reach it here: which of two
    channels' bytes arrive first at the cap is the pipes' timing, on any backend.)"""
    running, root = server
    spec = ProcessSpec(("/bin/sh", "-c", script), str(root), ENV, 120, CAP)
    async with await connect(running.address, output_pipes=False) as streaming:
        streamed = await streaming.execute(spec, NO_EVENTS)
    passed = await running.backend.execute(spec, NO_EVENTS)
    local = await LocalExecutionBackend().execute(spec, NO_EVENTS)
    for result in (passed, streamed):
        assert (result.exit_code, result.stdout, result.stderr, result.truncated) == (
            local.exit_code, local.stdout, local.stderr, local.truncated)


async def test_a_descendant_holding_the_pipe_in_its_own_session_ends_as_on_the_host_backend(server):
    running, root = server

    def spec_for(directory: Path) -> ProcessSpec:
        escape = f"setsid sh -c 'echo $$ > {directory}/escaped.pid; exec sleep 300' &"
        return ProcessSpec(("/bin/sh", "-c", f"echo before; {escape} echo after"), str(directory), ENV, 120, CAP)

    with tempfile.TemporaryDirectory() as local_directory:
        try:
            local = await LocalExecutionBackend().execute(spec_for(Path(local_directory)), NO_EVENTS)
        finally:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int((Path(local_directory) / "escaped.pid").read_text()), signal.SIGKILL)
    passed = await running.backend.execute(spec_for(root), NO_EVENTS)
    assert (passed.exit_code, passed.stdout, passed.truncated) == (local.exit_code, local.stdout, local.truncated)
    assert passed.stdout == "before\nafter\n"


async def test_a_flood_is_capped_while_read_and_the_host_holds_none_of_it(server):
    running, root = server
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident size starts again from now
    before = _resident_kib("VmRSS")
    spec = ProcessSpec(("/usr/bin/head", "-c", str(FLOOD_BYTES), "/dev/zero"), str(root), ENV, 300, CAP)
    result = await running.backend.execute(spec, NO_EVENTS)
    assert (result.exit_code, len(result.stdout), result.truncated) == (0, CAP, True)
    assert _resident_kib("VmHWM") - before < 50 * 1024


async def test_a_command_that_keeps_writing_ends_at_its_timeout(server):
    running, root = server
    spec = ProcessSpec(("/usr/bin/yes",), str(root), ENV, 1, CAP)
    result = await running.backend.execute(spec, NO_EVENTS)
    assert result.timed_out and result.truncated and len(result.stdout) == CAP


def _resident_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")
