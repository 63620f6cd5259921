"""The real sandbox server, run on this host as a subprocess, driven through SandboxBackend.

Tests run as root, so the server drops commands and workers to a uid of their own, exactly
as it does in a container. The behavioural suites also run through this server (backend
``server``); these tests cover what only the sandbox promises: identities, strays, supervised
workers, malformed requests, authentication and a dead server.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import random
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import zlib
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from protolink.errors import (
    ResourceUnchangedError,
    SandboxAuthenticationError,
    SandboxLimitError,
    SandboxUnavailableError,
)
from protolink.execution.documents import DocumentError, DocumentLimits
from protolink.execution.process_types import (
    ProcessCancelledError,
    ProcessResult,
    ProcessSpec,
)
from protolink.execution.resolve import Resolved
from protolink.revisions import ResourceRevision
from protolink.sandbox import connect, process_stream
from protolink.sandbox.placements.server import SECRET_FILES, write_secrets
from protolink.wire._pb import (
    documents_pb2,
    errors_pb2,
    process_pb2,
    sandbox_pb2,
    workspace_pb2,
)
from protolink_sandboxd.worker_pool import KEEP_AT_MOST_SHARE, resident_bytes
from tests.pdfs import pdf
from tests.sandbox_server import HOST_PYTHON, RunningServer, sandbox_server, unused_uid

pytestmark = pytest.mark.root

ENV = {"PATH": "/usr/bin:/bin"}
#: Generous bound on waiting for something the kernel does asynchronously (a kill, an exit).
SETTLE_SECONDS = 30


class Silent:
    async def emit(self, type: str, **data: Any) -> None:
        return None


@pytest.fixture(scope="module")
def roots() -> Iterator[tuple[Path, Path]]:
    base = Path(tempfile.mkdtemp(prefix="protolink-sandbox-server-test-")).resolve()
    base.chmod(0o755)  # the command user must reach the roots (pytest's own tmp dirs are private)
    writable, read_only = base / "rw", base / "ro"
    writable.mkdir()
    read_only.mkdir()
    (read_only / "readme.txt").write_text("read me\n")
    yield writable, read_only
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
async def server(roots: tuple[Path, Path]) -> AsyncIterator[RunningServer]:
    writable, read_only = roots
    uid = unused_uid()
    os.chown(writable, uid, uid)
    async with sandbox_server([(writable, True), (read_only, False)], uid=uid) as running:
        yield running


@contextlib.asynccontextmanager
async def own_server(parent: Path, name: str, args: Sequence[str] = ()) -> AsyncIterator[tuple[RunningServer, Path]]:
    """A server of its own (for tests that harm it) over a fresh writable root ``parent/name``."""
    writable = parent / name
    writable.mkdir()
    uid = unused_uid()
    os.chown(writable, uid, uid)
    async with sandbox_server([(writable, True)], uid=uid, args=args) as running:
        yield running, writable


async def sleeping(server: RunningServer, cwd: Path) -> asyncio.Future[ProcessResult]:
    """A long command, once it runs."""
    call = asyncio.ensure_future(run(server, "sleep 300", cwd, timeout=600))
    await settle(lambda: any(b"sleep" in cmdline(pid) for pid in server.processes_of_uid()), "the command to start")
    return call


async def run(server: RunningServer, script: str, cwd: Path, timeout: float = 60) -> ProcessResult:
    spec = ProcessSpec(("/bin/sh", "-c", script), str(cwd), ENV, timeout, 1 << 20)
    return await server.backend.execute(spec, Silent())


async def settle(condition, what: str) -> None:
    """Wait until ``condition()`` holds; fail after SETTLE_SECONDS (a bound, not a timing claim)."""
    for _ in range(SETTLE_SECONDS * 20):
        if condition():
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"still waiting for {what} after {SETTLE_SECONDS} s")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


async def test_a_worker_that_grew_past_its_share_of_memory_is_replaced(roots):
    """A parse that ran out of memory ends as a typed error; the worker it grew is not kept."""
    async with own_server(roots[0], "grown", args=["--worker-memory-bytes", str(300 << 20)]) as (running, writable):
        (writable / "bomb.pdf").write_bytes(bomb_pdf(70_000_000))
        with pytest.raises((DocumentError, SandboxLimitError)):
            await running.backend.read_document(str(writable / "bomb.pdf"), roots=[str(writable)],
                                                limits=DocumentLimits())
        assert [pid for pid in workers(running) if resident_bytes(pid) > (300 << 20) * KEEP_AT_MOST_SHARE] == []


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def workers(server: RunningServer) -> list[int]:
    return [pid for pid in server.processes_of_uid() if b"protolink_sandboxd.worker" in cmdline(pid)]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def slow_pdf(pages: int, operators: int = 100_000) -> bytes:
    """A small PDF whose pages each take pypdf about a second of CPU and yield no text."""
    content = b"BT /F1 12 Tf " + b"() Tj " * operators + b"ET"
    kids = b" ".join(b"%d 0 R" % (5 + i) for i in range(pages))
    page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >> /Contents 3 0 R >>"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % pages,
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        *[page] * pages,
    ]
    return pdf(objects)


async def test_info_and_health_describe_the_sandbox(server, roots):
    info = await server.backend.info()
    assert info.boundary == server.backend.boundary == "sandbox:test-host"
    assert {(root.path, root.writable) for root in info.roots} == {(str(roots[0]), True), (str(roots[1]), False)}
    assert info.limits["max_message_bytes"] > 0 and info.limits["max_concurrency"] > 0
    assert await server.backend.health()


def test_the_socket_is_owner_only(server):
    mode = os.stat(server.address.removeprefix("unix://")).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600


async def test_commands_run_as_the_command_user_with_no_extra_groups(server, roots):
    result = await run(server, "id -u; id -g; id -G; umask; touch made-here; stat -c %u made-here", roots[0])
    assert result.exit_code == 0, result
    uid = str(server.uid)
    assert result.stdout.split() == [uid, uid, uid, "0022", uid]


async def test_commands_have_the_command_uid_as_real_effective_saved_and_file_system_uid(server, roots):
    result = await run(server, "grep -E '^(Uid|Gid|Groups|NoNewPrivs):' /proc/self/status", roots[0])
    fields = {line.split(":")[0]: line.split(":")[1].split() for line in result.stdout.splitlines()}
    assert fields == {"Uid": [str(server.uid)] * 4, "Gid": [str(server.uid)] * 4, "Groups": [], "NoNewPrivs": ["1"]}


def spawner(server: RunningServer) -> int:
    """The server's spawner: the child of the server that acts as the command user and is no worker."""
    (serving,) = _children(server.process.pid)
    return next(pid for pid in _children(serving) if pid in server.processes_of_uid() and pid not in workers(server))


async def test_commands_cannot_signal_the_spawner_that_starts_them(server, roots):
    pid = spawner(server)
    # Only while it starts a command is the spawner's real uid the command user's: wait that out.
    script = (f"while grep -Eq '^Uid:[[:space:]]+{server.uid}[[:space:]]' /proc/{pid}/status; do :; done; "
              f"kill -STOP {pid}; kill -KILL {pid}")
    result = await run(server, script, roots[0])
    assert result.stderr.count("Operation not permitted") == 2, result
    assert (await run(server, "echo next", roots[0])).stdout == "next\n"


async def test_a_reused_resolution_that_went_stale_starts_nothing_and_is_asked_again(server, roots):
    """The second resolution of a name is the kept answer; when a command has meanwhile put an
    executable of that name earlier on PATH, the approved one is not run and neither is the new one."""
    writable = roots[0]
    early, late = writable / "stale-early", writable / "stale-late"
    env = {"PATH": f"{early}:{late}:/usr/bin:/bin"}
    for directory in (early, late):
        directory.mkdir()
        os.chown(directory, server.uid, server.uid)
    tool = late / "tool"
    tool.write_text(f"#!/bin/sh\necho late >> {writable}/stale-ran\n")
    tool.chmod(0o755)
    backend = server.backend
    first = await backend.resolve_command(["tool", "-v"], str(writable), env)
    assert first == Resolved((str(tool), "-v"), str(writable), str(tool))
    result = await run(server, f"printf '#!/bin/sh\\necho early >> {writable}/stale-ran\\n' > {early}/tool; "
                               f"chmod 755 {early}/tool", writable)
    assert result.exit_code == 0, result
    reused = await backend.resolve_command(["tool", "-v"], str(writable), env)
    assert reused == first
    with pytest.raises(ValueError, match="now resolves to .*stale-early/tool.*nothing was started"):
        await backend.execute(ProcessSpec(reused.argv, reused.cwd, env, 10, 1024, reused.real_executable), Silent())
    assert not (writable / "stale-ran").exists()
    fresh = await backend.resolve_command(["tool", "-v"], str(writable), env)
    assert fresh == Resolved((str(early / "tool"), "-v"), str(writable), str(early / "tool"))
    assert (await backend.execute(ProcessSpec(fresh.argv, fresh.cwd, env, 10, 1024, fresh.real_executable),
                                  Silent())).exit_code == 0
    assert (writable / "stale-ran").read_text() == "early\n"


async def test_a_spawner_that_dies_is_replaced_and_the_next_command_runs(roots):
    async with own_server(roots[0], "respawn") as (running, writable):
        first = spawner(running)
        os.kill(first, signal.SIGKILL)
        await settle(lambda: not Path(f"/proc/{first}").exists(), f"the spawner {first} to be reaped")
        result = await run(running, "id -u; echo next", writable)
        assert result.stdout == f"{running.uid}\nnext\n"
        assert spawner(running) != first


def test_the_server_refuses_to_run_commands_as_root(tmp_path):
    refused = subprocess.run(
        [sys.executable, "-m", "protolink_sandboxd", "--listen", f"unix://{tmp_path / 's.sock'}", "--command-uid", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert refused.returncode != 0 and "uid or gid 0" in refused.stderr


async def test_a_daemon_that_leaves_its_group_dies_with_its_command(server, roots):
    pidfile = roots[0] / "daemon.pid"
    script = (
        f"{HOST_PYTHON} -c \"import os\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        open('{pidfile}', 'w').write(str(os.getpid()))\n"
        "        fd = os.open('/dev/null', os.O_RDWR)\n"
        "        [os.dup2(fd, n) for n in (0, 1, 2)]\n"
        "        os.execv('/bin/sleep', ['sleep', '300'])\n"
        "    os._exit(0)\n"
        "os.wait()\"; "
        f"while [ ! -s {pidfile} ]; do sleep 0.01; done"
    )
    result = await run(server, script, roots[0])
    assert result.exit_code == 0, result
    daemon = int(pidfile.read_text())
    # Killed by the server, then reaped by its init (no zombie is left either).
    await settle(lambda: not Path(f"/proc/{daemon}").exists(), f"the daemon {daemon} to be killed and reaped")


async def test_canceling_a_call_kills_its_process_group_in_the_sandbox(server, roots):
    pidfile = roots[0] / "sleeper.pid"
    task = asyncio.ensure_future(run(server, f"sleep 300 & echo $! > {pidfile}; wait", roots[0], timeout=600))
    await settle(lambda: pidfile.exists() and pidfile.read_text().strip(), "the command to start")
    sleeper = int(pidfile.read_text())
    task.cancel()
    with pytest.raises(ProcessCancelledError) as canceled:
        await task
    assert canceled.value.result.canceled
    await settle(lambda: not alive(sleeper), f"the group's sleeper {sleeper} to be killed")


async def test_canceling_one_process_leaves_the_others_on_the_stream_running(server, roots):
    """Processes of one backend share one Execute call: canceling one kills only its group."""
    first, second = roots[0] / "first.pid", roots[0] / "second.pid"
    canceled = asyncio.ensure_future(run(server, f"sleep 300 & echo $! > {first}; wait", roots[0], timeout=600))
    kept = asyncio.ensure_future(run(server, f"sleep 300 & echo $! > {second}; wait; echo survived", roots[0],
                                     timeout=600))
    await settle(lambda: all(path.exists() and path.read_text().strip() for path in (first, second)),
                 "both commands to start")
    canceled.cancel()
    with pytest.raises(ProcessCancelledError):
        await canceled
    await settle(lambda: not alive(int(first.read_text())), "the canceled command's sleeper to be killed")
    survivor = int(second.read_text())
    assert alive(survivor) and not kept.done()
    os.kill(survivor, signal.SIGKILL)
    assert (await kept).stdout == "survived\n"


async def test_an_idle_process_call_ends_so_the_host_process_may_fork(server, roots, monkeypatch):
    """While an Execute call is open, gRPC's fork handlers crash a child forked by subprocess with
    user= (SIGSEGV); once no process has run for IDLE_CALL_SECONDS the call is gone."""
    monkeypatch.setattr(process_stream, "IDLE_CALL_SECONDS", 0.1)
    assert (await run(server, "true", roots[0])).exit_code == 0
    await asyncio.sleep(0.5)
    assert subprocess.run(["/bin/true"], user=server.uid, timeout=60).returncode == 0
    assert (await run(server, "echo again", roots[0])).stdout == "again\n"


async def test_a_document_past_its_wall_time_is_stopped_and_the_next_call_works(server, roots):
    slow = roots[0] / "slow.pdf"
    slow.write_bytes(slow_pdf(pages=200))
    with pytest.raises(TimeoutError, match="worker was stopped"):
        await server.backend.read_document(str(slow), roots=[str(roots[0])], limits=DocumentLimits(timeout_seconds=1))
    ok = roots[0] / "ok.txt"
    ok.write_text("fine\n")
    extraction = await server.backend.read_document(str(ok), roots=[str(roots[0])], limits=DocumentLimits())
    assert extraction.sections[0].text == "fine\n"


async def test_a_worker_killed_mid_call_is_a_typed_error_and_is_replaced(server, roots):
    slow = roots[0] / "slower.pdf"
    slow.write_bytes(slow_pdf(pages=200))
    call = asyncio.ensure_future(
        server.backend.read_document(str(slow), roots=[str(roots[0])], limits=DocumentLimits(timeout_seconds=600)))
    busy: list[int] = []

    def a_worker_is_parsing() -> bool:
        busy[:] = [pid for pid in workers(server) if cpu_seconds(pid) > 1.0]
        return bool(busy)

    await settle(a_worker_is_parsing, "a worker to parse the document")
    os.kill(busy[0], signal.SIGKILL)
    with pytest.raises(SandboxLimitError, match="killed by signal 9"):
        await call
    listing = await server.backend.list_files(str(roots[0]), roots=[str(roots[0])], pattern="*.pdf",
                                              recursive=False, max_results=10)
    assert {entry.path for entry in listing.items} >= {str(slow)}


async def test_commands_cannot_read_the_workers_memory_or_environment(server, roots):
    await server.backend.list_files(str(roots[0]), roots=[str(roots[0])], pattern="*", recursive=False,
                                    max_results=1)
    worker = workers(server)[0]
    result = await run(server, f"cat /proc/{worker}/environ; cat /proc/{worker}/mem", roots[0])
    assert result.exit_code != 0
    assert result.stderr.count("Permission denied") == 2, result


async def test_a_server_holds_no_worker_until_a_file_call_forks_one(roots):
    """A sandbox that only ran commands holds no worker; a file call forks one from the server."""
    async with own_server(roots[0], "forked") as (running, writable):
        assert (await run(running, "true", writable)).exit_code == 0
        assert workers(running) == []
        await running.backend.list_files(str(writable), roots=[str(writable)], pattern="*", recursive=False,
                                         max_results=1)
        assert len(workers(running)) == 1


async def execute_raw(channel: grpc.aio.Channel, *requests: bytes, timeout: float = 30) -> list[process_pb2.ExecuteEvent]:
    """Send ``requests`` on one Execute call, half-close it, and return every event it answers."""
    call = channel.stream_stream("/protolink.sandbox.v1.Sandbox/Execute")(timeout=timeout)
    for request in requests:
        await call.write(request)
    await call.done_writing()
    return [process_pb2.ExecuteEvent.FromString(event) async for event in call]


@pytest.mark.parametrize("method, payload", [
    ("Execute", b"\xff\xff\xff garbage"),
    ("ReadText", b"\x0a\x05/ws/\xff"),  # path field holding invalid UTF-8
    ("ReplaceFile", b"\x12"),  # a truncated field
    ("ReadDocument", b""),  # empty: no limits at all
])
async def test_malformed_requests_are_invalid_argument_and_the_server_lives_on(server, method, payload):
    async with grpc.aio.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            if method == "Execute":
                await execute_raw(channel, payload)
            else:
                await channel.unary_unary(f"/protolink.sandbox.v1.Sandbox/{method}")(payload, timeout=30)
    assert failed.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "Traceback" not in (failed.value.details() or "")
    assert await server.backend.health()


async def test_an_invalid_process_request_gets_an_error_event_and_its_call_goes_on(server, roots):
    """One call: a request with no argv, then a valid one; the first is refused, the second runs."""
    invalid = process_pb2.ExecuteRequest(id=1)
    valid = process_pb2.ExecuteRequest(id=2, argv=["/bin/echo", "ok"], cwd=str(roots[0]), env=ENV,
                                       timeout_seconds=30, max_output_bytes=1024)
    async with grpc.aio.insecure_channel(server.address) as channel:
        events = await execute_raw(channel, invalid.SerializeToString(), valid.SerializeToString())
    (refusal,) = [event for event in events if event.id == 1]
    assert refusal.error.kind == errors_pb2.ERROR_KIND_INVALID_ARGUMENT and "argv" in refusal.error.message
    kinds = [event.WhichOneof("event") for event in events if event.id == 2]
    assert kinds[-2:] == ["output", "finished"] and kinds[:-2] in ([], ["started"])


async def test_a_process_that_says_nothing_for_a_while_is_reported_started(server, roots):
    """``started`` comes first, and only for a process with nothing else to send soon after it
    starts: a silent sleeper gets one; a short command's output and finished say that it ran."""
    sleeper = process_pb2.ExecuteRequest(id=1, argv=["/bin/sleep", "3"], cwd=str(roots[0]), env=ENV,
                                         timeout_seconds=30, max_output_bytes=1024)
    async with grpc.aio.insecure_channel(server.address) as channel:
        events = await execute_raw(channel, sleeper.SerializeToString())
    assert [event.WhichOneof("event") for event in events] == ["started", "finished"]


async def test_one_call_asking_for_more_than_twice_the_concurrency_gets_limit_errors(roots):
    """--max-concurrency 2: on a raw call two run, two wait for a slot, the fifth and sixth are
    refused at once; a SandboxBackend never asks for more than it may."""
    async with own_server(roots[0], "crowded", ["--max-concurrency", "2"]) as (running, writable):
        # Each holds its slot for 2 s: the six requests, written at once, all arrive while the first two run.
        requests = [process_pb2.ExecuteRequest(id=number, argv=["/bin/sleep", "2"], cwd=str(writable), env=ENV,
                                               timeout_seconds=30, max_output_bytes=1024).SerializeToString()
                    for number in range(1, 7)]
        async with grpc.aio.insecure_channel(running.address) as channel:
            events = await execute_raw(channel, *requests)
        # SandboxBackend keeps to the limit Info reports: ten processes at once all run, two at a time.
        results = await asyncio.gather(*(run(running, "sleep 0.2", writable) for _ in range(10)))
    refused = {event.id for event in events if event.WhichOneof("event") == "error"}
    finished = {event.id for event in events if event.WhichOneof("event") == "finished"}
    assert refused == {5, 6} and finished == {1, 2, 3, 4}
    assert all(event.error.kind == errors_pb2.ERROR_KIND_LIMIT_EXCEEDED for event in events if event.id in refused)
    assert [result.exit_code for result in results] == [0] * 10


async def test_a_request_id_already_running_fails_the_call_and_kills_its_processes(server, roots):
    sleeper = process_pb2.ExecuteRequest(id=7, argv=["/bin/sleep", "300"], cwd=str(roots[0]), env=ENV,
                                         timeout_seconds=600, max_output_bytes=1024).SerializeToString()
    async with grpc.aio.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await execute_raw(channel, sleeper, sleeper)
    assert failed.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "already running" in failed.value.details()
    await settle(lambda: not any(b"sleep" in cmdline(pid) for pid in server.processes_of_uid()), "the sleeper to die")


async def test_unmounted_roots_and_writes_to_read_only_roots_are_refused(server, roots):
    with pytest.raises(ValueError, match="not mounted"):
        await server.backend.read_text("/etc/hostname", roots=["/etc"], offset=0, max_chars=10, max_file_bytes=100)
    read_only = roots[1]
    chunk = await server.backend.read_text(str(read_only / "readme.txt"), roots=[str(read_only)], offset=0,
                                           max_chars=100, max_file_bytes=100)
    assert chunk.content == "read me\n"
    absent = ResourceRevision(str(read_only / "new.txt"), False, parent_identity=(0, 0))
    with pytest.raises(ResourceUnchangedError, match="read-only") as refused:  # nothing written, as on the host
        await server.backend.replace_file(absent, b"x", None, roots=[str(read_only)])
    assert refused.value.errno == errno.EROFS
    assert not (read_only / "new.txt").exists()


async def test_many_concurrent_commands_all_complete(server, roots):
    results = await asyncio.gather(*(run(server, f"echo {index}", roots[0]) for index in range(64)))
    assert [result.stdout for result in results] == [f"{index}\n" for index in range(64)]


async def test_a_consumer_that_stops_taking_output_holds_the_command_back_not_the_server(server, roots):
    """While the consumer of a command's events takes nothing, the command waits to write and
    the server holds a bounded window of its output, not the 128 MiB it has to write; once the
    consumer takes it again, every byte arrives, in order."""
    size = 128 << 20
    taking = asyncio.Event()

    class Stalled:
        async def emit(self, type: str, **data: Any) -> None:
            await taking.wait()

    (serving,) = _children(server.process.pid)
    before = rss_bytes(serving)
    spec = ProcessSpec(("/usr/bin/head", "-c", str(size), "/dev/zero"), str(roots[0]), ENV, 120, size)
    call = asyncio.ensure_future(server.backend.execute(spec, Stalled()))
    await settle(lambda: any(b"head" in cmdline(pid) for pid in server.processes_of_uid()), "the command to start")
    (command,) = [pid for pid in server.processes_of_uid() if b"head" in cmdline(pid)]
    written: list[int] = []

    def held_back_or_buffered() -> bool:
        written.append(written_bytes(command))
        return rss_bytes(serving) - before > 48 << 20 or written[-3:] == [written[-1]] * 3 and written[-1] > 0

    await settle(held_back_or_buffered, "the command to be held back")
    assert rss_bytes(serving) - before <= 48 << 20
    assert alive(command) and written[-1] < size
    taking.set()
    result = await call
    assert result.exit_code == 0 and not result.truncated and result.stdout == "\0" * size


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) * 1024


def written_bytes(pid: int) -> int:
    """Bytes ``pid`` has written so far (0 once it is gone)."""
    try:
        io = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return 0
    return int(next(line for line in io.splitlines() if line.startswith("wchar:")).split()[1])


async def test_a_burst_of_file_operations_is_served_by_the_workers(server, roots):
    for index in range(20):
        (roots[0] / f"burst-{index}.txt").write_text(f"{index}\n")
    chunks = await asyncio.gather(*(
        server.backend.read_text(str(roots[0] / f"burst-{index % 20}.txt"), roots=[str(roots[0])], offset=0,
                                 max_chars=10, max_file_bytes=100)
        for index in range(200)))
    assert [chunk.content for chunk in chunks] == [f"{index % 20}\n" for index in range(200)]
    assert len(workers(server)) <= 8  # the server's default max_workers


async def test_a_request_over_the_message_limit_is_refused_before_it_is_sent(server, roots):
    absent = ResourceRevision(str(roots[0] / "huge.bin"), False, parent_identity=(0, 0))
    with pytest.raises(ValueError, match="accepts at most"):
        await server.backend.replace_file(absent, b"\0" * (64 << 20), None, roots=[str(roots[0])])
    assert not (roots[0] / "huge.bin").exists()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_tcp_serves_tls_requires_the_token_and_the_secret_files_are_consumed(tmp_path):
    token = secrets.token_urlsafe(24)
    fingerprint = write_secrets(tmp_path, token, "test sandbox")  # as DockerSandbox and kube-manifest make them
    port = _free_port()
    async with sandbox_server([], listen=f"tcp://127.0.0.1:{port}", token=token, fingerprint=fingerprint,
                              args=[part for flag, name in SECRET_FILES.items()
                                    for part in (flag, str(tmp_path / name))]) as running:
        assert not any((tmp_path / name).exists() for name in SECRET_FILES.values())
        assert await running.backend.health()
        # The spawner of a server with a token is started afresh, never forked with the token in memory.
        spec = ProcessSpec(("/bin/echo", "served"), "/", ENV, 60, 1000)
        assert (await running.backend.execute(spec, Silent())).stdout == "served\n"
        for wrong in (None, token + "x"):
            with pytest.raises(SandboxAuthenticationError):
                await connect(f"127.0.0.1:{port}", token=wrong, timeout=30, fingerprint=fingerprint)


async def test_a_dead_server_is_a_typed_error_not_a_hang(roots):
    async with own_server(roots[0], "dying") as (running, writable):
        call = await sleeping(running, writable)
        running.process.kill()  # the reaping init; the server dies with it
        with pytest.raises(SandboxUnavailableError):
            await call
        with pytest.raises(SandboxUnavailableError):
            await running.backend.list_files(str(writable), roots=[str(writable)], pattern="*", recursive=False,
                                             max_results=1)


def _valid_requests(root: str) -> dict[str, Message]:
    limits = documents_pb2.DocumentLimits(max_file_bytes=1000, max_output_chars=100, max_sections=5,
                                          max_archive_bytes=1000, timeout_seconds=5)
    return {
        "Info": sandbox_pb2.InfoRequest(),
        "Execute": process_pb2.ExecuteRequest(argv=["/bin/true"], cwd=root, timeout_seconds=5, max_output_bytes=100),
        "ResolveCommand": process_pb2.ResolveCommandRequest(argv=["true"], cwd=root, env={"PATH": "/bin"}),
        "ReadText": workspace_pb2.ReadTextRequest(path=f"{root}/fuzz.txt", roots=[root], max_chars=10,
                                                  max_file_bytes=100),
        "ListFiles": workspace_pb2.ListFilesRequest(path=root, roots=[root], pattern="*", max_results=5),
        "SearchFiles": workspace_pb2.SearchFilesRequest(path=root, roots=[root], query="x", pattern="*",
                                                        max_results=5, max_file_bytes=100),
        "SnapshotFile": workspace_pb2.SnapshotFileRequest(path=f"{root}/fuzz.txt", roots=[root], max_file_bytes=100),
        "ReplaceFile": workspace_pb2.ReplaceFileRequest(
            expected=workspace_pb2.Revision(resource_id=f"{root}/fuzz-new.txt", exists=False,
                                            parent_identity=workspace_pb2.Identity(device=1, inode=2)),
            data=b"x", roots=[root]),
        "ReadDocument": documents_pb2.ReadDocumentRequest(path=f"{root}/fuzz.txt", roots=[root], limits=limits),
        "SearchDocument": documents_pb2.SearchDocumentRequest(path=f"{root}/fuzz.txt", query="x", roots=[root],
                                                              limits=limits, max_results=5),
    }


def _mutated(rng: random.Random, payload: bytes) -> bytes:
    data = bytearray(payload)
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        if choice < 0.4 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif choice < 0.6:
            data.insert(rng.randint(0, len(data)), rng.randrange(256))
        elif choice < 0.8 and data:
            del data[rng.randint(0, len(data) - 1):]
        else:
            data = bytearray(rng.randbytes(rng.randint(0, 64)))
    return bytes(data)


async def test_random_and_mutated_requests_get_typed_answers_and_the_server_lives_on(server, roots):
    root = str(roots[0])
    (roots[0] / "fuzz.txt").write_text("x marks the spot\n")
    rng = random.Random(20261130)
    requests = _valid_requests(root)
    faults = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE}
    async with grpc.aio.insecure_channel(server.address) as channel:
        for _ in range(400):
            method = rng.choice(sorted(requests))
            payload = _mutated(rng, requests[method].SerializeToString())
            path = f"/protolink.sandbox.v1.Sandbox/{method}"
            try:
                if method == "Execute":
                    await execute_raw(channel, payload, timeout=60)
                else:
                    await channel.unary_unary(path)(payload, timeout=60)
            except grpc.aio.AioRpcError as error:
                assert error.code() not in faults, (method, payload, error)
    assert await server.backend.health()


async def test_a_frozen_server_is_a_typed_error_not_a_hang(roots):
    async with own_server(roots[0], "frozen") as (running, writable):
        call = await sleeping(running, writable)
        server = _children(running.process.pid)[0]
        os.kill(server, signal.SIGSTOP)  # alive, holding its socket open, answering nothing
        try:
            with pytest.raises(SandboxUnavailableError):
                await call
        finally:
            os.kill(server, signal.SIGCONT)


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def bomb_pdf(expanded_bytes: int) -> bytes:
    """A PDF whose one content stream inflates from a few KiB to ``expanded_bytes``."""
    content = zlib.compress(b"BT /F1 12 Tf (" + b"a" * expanded_bytes + b") Tj ET", 9)
    page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        page,
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(content) + content + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    return pdf(objects)


async def test_a_document_that_explodes_in_memory_hits_the_worker_limit_and_the_server_lives_on(roots):
    async with own_server(roots[0], "bomb", args=["--worker-memory-bytes", str(300 << 20)]) as (running, writable):
        (writable / "bomb.pdf").write_bytes(bomb_pdf(70_000_000))
        (writable / "ok.txt").write_text("ok\n")
        with pytest.raises((DocumentError, SandboxLimitError)):
            await running.backend.read_document(str(writable / "bomb.pdf"), roots=[str(writable)],
                                                limits=DocumentLimits())
        fine = await running.backend.read_document(str(writable / "ok.txt"), roots=[str(writable)],
                                                   limits=DocumentLimits())
        assert fine.sections[0].text == "ok\n"
