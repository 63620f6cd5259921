"""The channel: commands cannot reach, kill, stop or replace the server; and a server that answers
with garbage, oversized or endless messages leaves the host client bounded, with typed errors.

The first tests attack the real server from inside the shared sandbox. The others put a fake
server (or no gRPC at all) behind the client's Unix socket and drive the agent's tools at it; they
need no Docker Engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import socket
import stat
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from protolink.errors import SandboxAuthenticationError, SandboxError, SandboxProtocolError, SandboxUnavailableError
from protolink.net.descriptors import receive_next
from protolink.sandbox import client, connect
from protolink.wire._pb import errors_pb2, process_pb2, sandbox_pb2, workspace_pb2
from protolink.wire.pipe_passing import DATAGRAM_BYTES, FAILURE, SOCKET_NAME
from protolink.wire.status import from_wire

from .conftest import GVISOR, HANG_GUARD, NOBODY, Attacker, figure, still_serves

SERVICE = "protolink.sandbox.v1.Sandbox"

#: Applies ``sys.argv[1]`` ("kill SIGNAL" or "prlimit") to PID 1 and every sandbox helper (a
#: Python process run with ``-m``: the server, its workers, any other; and the command spawner);
#: prints name pid -> errno.
TAMPER = r"""
import json, os, resource, sys
action, me, answers = sys.argv[1].split(), os.getpid(), {}
targets = {'init 1': 1}
for pid in map(int, filter(str.isdigit, os.listdir('/proc'))):
    try:
        command = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\0')
    except OSError:
        continue
    if pid != me and command[2:3] == [b'-m']:
        targets[f'{command[3].decode()} {pid}'] = pid
    elif command[0].endswith(b'/protolink-spawner'):
        targets[f'spawner {pid}'] = pid
for name, pid in targets.items():
    try:
        if action[0] == 'kill':
            os.kill(pid, int(action[1]))
        else:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (0, 0))
        answers[name] = 0
    except OSError as error:
        answers[name] = error.errno
print(json.dumps(answers))
"""


async def tamper(attacker: Attacker, action: str) -> dict[str, int]:
    await attacker.call("list_files", path=str(attacker.ws))  # a worker exists
    answers = await attacker.probe(TAMPER, action)
    assert {name.split()[0] for name in answers} >= {"init", "protolink_sandboxd", "protolink_sandboxd.worker", "spawner"}, answers
    return answers


@pytest.mark.docker
async def test_kill_the_server_and_its_helpers(attacker):
    """A command sends SIGKILL to pid 1, the server and every helper (workers included), then to everything it may signal (kill -1).

    Every signal to them fails with EPERM (they run under other real uids; so do the command spawner and each command's keeper, the command's own included: a command takes the command user's real uid itself as it starts). kill -1 reaches none of them. The next calls are served.
    """
    assert set((await tamper(attacker, "kill 9")).values()) == {errno.EPERM}
    everything = await attacker.shell("kill -KILL -1; echo survived")  # kill(-1) spares its caller
    assert everything.stdout == "survived\n"
    await still_serves(attacker)


@pytest.mark.docker
async def test_stop_the_helpers(attacker):
    """A command sends SIGSTOP to the server and every helper, which would freeze every later file and document call.

    Refused with EPERM (workers have a real uid of their own); the next file calls are served at once.
    """
    assert set((await tamper(attacker, "kill 19")).values()) == {errno.EPERM}
    for _ in range(3):
        await attacker.call("list_files", path=str(attacker.ws))
    await still_serves(attacker)


@pytest.mark.docker
async def test_limit_the_helpers(attacker):
    """A command lowers the resource limits of the server and every helper process (prlimit: no open files).

    Refused with EPERM: none of them has the command user as real and saved uid.
    """
    assert set((await tamper(attacker, "prlimit")).values()) == {errno.EPERM}
    await still_serves(attacker)


#: Tries to renice (to 19), pin to one CPU, stop (SIGSTOP) and limit (prlimit: no open files)
#: pid 1 and every sandbox process but itself; undoes what succeeded and prints, per target,
#: [role, pid, {attack: errno}, (nice, CPUs) before, (nice, CPUs) right after the attacks].
HINDER = r"""
import json, os, resource, signal
def role(pid):
    if pid == 1:
        return 'init'
    command = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\0')
    if command[0].endswith(b'/protolink-spawner'):  # the spawner, or a command's keeper (its child)
        parent = int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1])
        return 'keeper' if role(parent) == 'spawner' else 'spawner'
    if command[2:3] != [b'-m'] or not command[3].startswith(b'protolink_sandboxd'):
        return None
    return 'server' if command[3] == b'protolink_sandboxd' else command[3].decode().removeprefix('protolink_sandboxd.')
def attempt(call):
    try:
        call()
        return 0
    except OSError as error:
        return error.errno
def state(pid):
    return os.getpriority(os.PRIO_PROCESS, pid), sorted(os.sched_getaffinity(pid))
found = []
for pid in map(int, filter(str.isdigit, os.listdir('/proc'))):
    try:
        name = role(pid) if pid != os.getpid() else None
    except (OSError, IndexError):
        continue
    if name is None:
        continue
    before = state(pid)
    answers = {'renice': attempt(lambda: os.setpriority(os.PRIO_PROCESS, pid, 19)),
               'affinity': attempt(lambda: os.sched_setaffinity(pid, before[1][:1])),
               'signal': attempt(lambda: os.kill(pid, signal.SIGSTOP)),
               'prlimit': attempt(lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, (0, 0)))}
    after = state(pid)
    if answers['signal'] == 0:
        os.kill(pid, signal.SIGCONT)
    if answers['affinity'] == 0:
        os.sched_setaffinity(pid, before[1])
    found.append([name, pid, answers, before, after])
print(json.dumps(found))
"""


@pytest.mark.docker
def host_scheduling(container: Any) -> dict[int, tuple[int, frozenset[int]]]:
    """Nice value and CPUs of every host thread of the container's processes."""
    found = {}
    for pid, *_ in container.top(ps_args="-eo pid")["Processes"]:
        with contextlib.suppress(OSError):
            for tid in map(int, os.listdir(f"/proc/{pid}/task")):
                with contextlib.suppress(OSError):
                    found[tid] = (os.getpriority(os.PRIO_PROCESS, tid), frozenset(os.sched_getaffinity(tid)))
    return found


async def test_slow_down_the_helpers(attacker, sandbox):
    """A command tries to renice (to 19), pin to one CPU (sched_setaffinity), stop (SIGSTOP) and prlimit every server-side process it sees in /proc: pid 1, the server, each file and document worker, the command spawner and the commands' keepers.

    Every attempt on pid 1, the server and the workers fails with EPERM and changes nothing: a worker's real, effective and saved uids are its own, only its file-system uid is the command user's (files it creates still belong to the command user). The spawner and the keepers keep the command user as effective uid (to start commands with vfork): stopping and prlimit are refused; renicing them to nice 19 (never back: RLIMIT_NICE is 0) and pinning them to one CPU succeed and slow their own work (a residual risk), but every command still starts at nice 19 with every CPU (the spawner takes every CPU back before it starts one, as does a keeper forked ahead before it starts its command). The next calls are served. Under gVisor (this runsc: no file-system uid, so workers keep the command uid as effective uid) renice and pinning of every helper succeed: the Sentry records them, the host's threads that run the sandbox keep their priority and CPUs. Stopping and prlimit stay refused.
    """
    await attacker.call("list_files", path=str(attacker.ws))  # a worker exists
    host_before = host_scheduling(sandbox._container)
    targets = await attacker.probe(HINDER)
    assert {name for name, *_ in targets} >= {"init", "server", "worker", "spawner", "keeper"}, targets
    refused = dict.fromkeys(("renice", "affinity", "signal", "prlimit"), errno.EPERM)
    for name, pid, answers, before, after in targets:
        if GVISOR:
            # The Sentry checks no permission on renice and pinning (see the docstring).
            assert (answers["signal"], answers["prlimit"]) == (errno.EPERM, errno.EPERM), (name, pid, answers)
        elif name in ("spawner", "keeper"):
            assert answers == {**refused, "renice": 0, "affinity": 0}, (name, pid, answers)
            assert after[0] == 19 and len(after[1]) == 1, (name, pid, before, after)
        else:
            assert (answers, after) == (refused, before), (name, pid, answers, before, after)
    if GVISOR:  # what the Sentry recorded did not reach the host's threads
        host_after = host_scheduling(sandbox._container)
        both = host_before.keys() & host_after.keys()
        assert both and {tid: host_after[tid] for tid in both} == {tid: host_before[tid] for tid in both}
    # A command leaves the spawner pinned to one CPU and at nice 19; the next command still gets
    # every CPU and nice 19, no more, no less.
    spawner = next(pid for name, pid, *_ in targets if name == "spawner")
    every_cpu = next(before[1] for name, pid, _, before, _ in targets if pid == spawner)
    pin = f"import os\nos.sched_setaffinity({spawner}, [{every_cpu[0]}])\nprint(len(os.sched_getaffinity({spawner})))"
    assert (await attacker.python(pin)).stdout == "1\n"
    scheduling = "import json, os\nprint(json.dumps([os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0))]))"
    assert await attacker.probe(scheduling) == [19, every_cpu]
    secret = attacker.ws / "private.txt"
    secret.write_text("only the command user\n")
    secret.chmod(0o600)
    os.chown(secret, NOBODY, NOBODY)
    assert (await attacker.call("read_file", path=str(secret)))["content"] == "only the command user\n"
    await attacker.call("create_file", path=str(attacker.ws / "made-by-a-worker.txt"), content="made\n")
    made = (attacker.ws / "made-by-a-worker.txt").stat()
    assert (made.st_uid, made.st_gid) == (NOBODY, NOBODY)
    await still_serves(attacker)


@pytest.mark.docker
async def test_kill_loop_during_launches(attacker):
    """For 5 s a command sends SIGKILL to everything it may signal (kill(-1) in a tight loop) while the agent launches 40 other commands.

    Commands of the same user may die (they share a uid by design). The spawner and the commands' keepers never hold the command user's real uid, so every launch starts its command. The server and workers survive; afterwards every call is served.
    """
    killer = asyncio.ensure_future(attacker.python(
        "import os, time\nend = time.monotonic() + 5\nwhile time.monotonic() < end:\n    try:\n"
        "        os.kill(-1, 9)\n    except OSError:\n        pass\n", timeout=30))
    await asyncio.sleep(0.5)
    outcomes = await asyncio.gather(*(attacker.run(["/bin/echo", str(index)]) for index in range(40)),
                                    return_exceptions=True)
    await killer
    figure("launches during a kill(-1) loop", ", ".join(
        f"{name} {count}" for name, count in sorted(Counter(
            type(outcome).__name__ if isinstance(outcome, BaseException) else f"exit {outcome.exit_code}"
            for outcome in outcomes).items())))
    assert not [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    await still_serves(attacker)


@pytest.mark.docker
async def test_reach_or_replace_the_server(attacker):
    """A command tries to open, unlink or shadow the server's Unix socket, to open its command channel (pipes.sock), and to overwrite the server's code.

    The socket directory is the host user's, mode 0700 (EACCES; gVisor answers EPERM for the socket's own name); the server's code belongs to root, on the read-only root file system.
    """
    code = r"""
import json, os, socket
answers = {}
def attempt(name, call):
    try:
        call()
        answers[name] = 0
    except OSError as error:
        answers[name] = error.errno
attempt('list', lambda: os.listdir('/run/protolink'))
attempt('connect', lambda: socket.socket(socket.AF_UNIX).connect('/run/protolink/sandbox.sock'))
attempt('command_channel', lambda: socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET).connect('/run/protolink/pipes.sock'))
attempt('unlink', lambda: os.unlink('/run/protolink/sandbox.sock'))
attempt('shadow', lambda: socket.socket(socket.AF_UNIX).bind('/run/protolink/other.sock'))
attempt('code', lambda: open('/opt/protolink/lib/python3.11/site-packages/protolink_sandboxd/service.py', 'a'))
attempt('sitecustomize', lambda: open('/opt/protolink/lib/python3.11/site-packages/sitecustomize.py', 'w'))
attempt('world_writable', lambda: open('/var/tmp/sitecustomize.py', 'w'))  # mode 1777, on the same root
print(json.dumps(answers))
"""
    answers = await attacker.probe(code)
    assert answers.pop("code") in (errno.EACCES, errno.EROFS)  # root's file, on a read-only file system
    # gVisor answers EPERM for a name that exists in a directory the caller cannot search
    # (EACCES for one that does not), and checks permissions before the read-only mount.
    assert answers == {"list": errno.EACCES, "connect": errno.EPERM if GVISOR else errno.EACCES,
                       "command_channel": errno.EPERM if GVISOR else errno.EACCES,
                       "unlink": errno.EACCES, "shadow": errno.EACCES,
                       "sitecustomize": errno.EACCES if GVISOR else errno.EROFS, "world_writable": errno.EROFS}
    await still_serves(attacker)


@pytest.mark.docker
async def test_the_command_channel_is_the_host_users_and_refuses_a_forged_request(sandbox, attacker):
    """A client on the host sends the command channel (pipes.sock) an Execute request as its first datagram, without the authorization, to run a command.

    Refused with a typed SandboxAuthenticationError and the connection closed; the command never runs. The socket belongs to the runtime directory's owner, mode 0600 (gVisor refuses the chmod; the directory keeps others out). Under gVisor, whose kernel passes no descriptors to the host, the server closes every connection without a greeting: no channel is offered, and the host's commands run over gRPC.
    """
    path = os.path.join(os.path.dirname(sandbox.address.removeprefix("unix://")), SOCKET_NAME)
    info = os.stat(path)
    assert info.st_uid == os.stat(os.path.dirname(path)).st_uid
    assert GVISOR or stat.S_IMODE(info.st_mode) == 0o600
    marker = attacker.ws / "forged"
    forged = process_pb2.ExecuteRequest(id=1, argv=["/usr/bin/touch", str(marker)], cwd=str(attacker.ws),
                                        timeout_seconds=10, max_output_bytes=1000)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.setblocking(False)
        async with asyncio.timeout(HANG_GUARD):
            await asyncio.get_running_loop().sock_connect(sock, path)
            greeting, fds, _ = await receive_next(sock, DATAGRAM_BYTES, 1)
            for fd in fds:
                os.close(fd)
            if not greeting:
                assert GVISOR  # its kernel passes no descriptors: no channel is offered
                assert (await attacker.run(["/bin/echo", "on gRPC"])).stdout == "on gRPC\n"  # the fallback
                return
            sock.send(forged.SerializeToString())
            refusal, _, _ = await receive_next(sock, DATAGRAM_BYTES, 0)
    assert refusal.startswith(FAILURE)
    assert isinstance(from_wire(errors_pb2.Error.FromString(refusal[len(FAILURE):])), SandboxAuthenticationError)
    assert (await attacker.run(["/bin/sh", "-c", "sleep 0.5; echo checked"])).stdout == "checked\n"
    assert not marker.exists()


@pytest.mark.docker
async def test_event_flood(attacker):
    """A command writes its output one byte per system call, alternating channels, 200,000 times.

    The server batches what it reads into capped events; the call ends with its 4 KiB of output and truncated=True.
    """
    # Each write wakes the server, whose work per byte is larger than the writer's, and a command
    # at nice 19 gets the CPU only when the server has none to do: two million writes took some 40 s
    # beside two CPU hogs, and past the call's hang guard on a loaded CI machine; 200,000 take 5-16 s.
    code = "import os\nfor i in range(100_000):\n    os.write(1, b'x')\n    os.write(2, b'y')\n"
    result = await attacker.python(code, timeout=300, max_output_bytes=4096)  # what is asserted is not speed
    assert result.exit_code == 0 and result.truncated
    assert len(result.stdout) + len(result.stderr) == 4096
    await still_serves(attacker)


# Fake servers -------------------------------------------------------------------------------


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class FakeSandbox:
    """A gRPC server speaking the Sandbox service with scripted, hostile answers."""

    def __init__(self) -> None:
        self.read_text: Callable[[], bytes] = lambda: b""
        self.execute: Callable[[int], AsyncIterator[bytes]] = self._nothing

    @staticmethod
    async def _nothing(request_id: int) -> AsyncIterator[bytes]:
        return
        yield b""  # pragma: no cover

    async def _info(self, request: bytes, context: Any) -> bytes:
        return sandbox_pb2.InfoResponse(boundary="sandbox:fake", server_version="0").SerializeToString()

    async def _resolve_command(self, request: bytes, context: Any) -> bytes:
        asked = process_pb2.ResolveCommandRequest.FromString(request)
        return process_pb2.ResolveCommandResponse(argv=asked.argv, cwd=asked.cwd,
                                                  real_executable=asked.argv[0]).SerializeToString()

    async def _read_text(self, request: bytes, context: Any) -> bytes:
        return self.read_text()

    async def _execute(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        """Answers the first process's request with :attr:`execute`'s events for its id (a cancel,
        such as the request that opens a call, starts nothing: it is not a process's)."""
        async for data in requests:
            request = process_pb2.ExecuteRequest.FromString(data)
            if request.cancel:
                continue
            async for item in self.execute(request.id):
                yield item
            return

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Info": grpc.unary_unary_rpc_method_handler(self._info),
            "ResolveCommand": grpc.unary_unary_rpc_method_handler(self._resolve_command),
            "ReadText": grpc.unary_unary_rpc_method_handler(self._read_text),
            "Execute": grpc.stream_stream_rpc_method_handler(self._execute),
        })


@contextlib.asynccontextmanager
async def fake_server(path: Path, fake: FakeSandbox) -> AsyncIterator[grpc.aio.Server]:
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 256 << 20)])
    server.add_generic_rpc_handlers((fake.handler(),))
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        yield server
    finally:
        await server.stop(None)


@pytest.fixture
async def faked(tmp_path: Path) -> AsyncIterator[tuple[FakeSandbox, Attacker, Path]]:
    """The agent's tools on a backend connected to a fake server at ``tmp_path/fake.sock``."""
    fake, path = FakeSandbox(), tmp_path / "fake.sock"
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    async with fake_server(path, fake):
        backend = await connect(f"unix://{path}", timeout=5)
        try:
            yield fake, Attacker(backend, ws), path
        finally:
            await backend.aclose()


def event(request_id: int, **fields: Any) -> bytes:
    return process_pb2.ExecuteEvent(id=request_id, **fields).SerializeToString()


async def test_oversized_answer(faked):
    """A server answering read_file with a 64 MiB message (twice the client's 32 MiB limit).

    SandboxProtocolError; the client refuses the message instead of buffering it into a result.
    """
    fake, attacker, _ = faked
    fake.read_text = lambda: workspace_pb2.ReadTextResponse(path=str(attacker.ws / "a.txt"),
                                                            content="x" * (64 << 20)).SerializeToString()
    with pytest.raises(SandboxProtocolError):
        await attacker.call("read_file", path=str(attacker.ws / "a.txt"))


async def test_garbage_answer(faked):
    """A server answering read_file with bytes that are not a protobuf message, then with a valid message describing another file.

    SandboxProtocolError both times: nothing unparsed or outside the request becomes a result.
    """
    fake, attacker, _ = faked
    fake.read_text = lambda: b"\xff\xfe garbage \x00\x01" * 100
    with pytest.raises(SandboxProtocolError):
        await attacker.call("read_file", path=str(attacker.ws / "a.txt"))
    fake.read_text = lambda: workspace_pb2.ReadTextResponse(path="/etc/shadow", content="root:x").SerializeToString()
    with pytest.raises(SandboxProtocolError):
        await attacker.call("read_file", path=str(attacker.ws / "a.txt"))


async def test_garbage_event(faked):
    """A server whose command stream carries an event that is not a protobuf message.

    SandboxProtocolError for that call.
    """
    fake, attacker, _ = faked

    async def garbage(request_id: int) -> AsyncIterator[bytes]:
        yield event(request_id, started=process_pb2.Started())
        yield b"\xff\xfe not an event"

    fake.execute = garbage
    with pytest.raises(SandboxProtocolError):
        await attacker.shell("anything")


async def test_endless_output_stream(faked):
    """A server streaming about 1 GiB of output events (64 KiB each) for a command with a 64 KiB cap.

    The client keeps 64 KiB and discards the rest as it arrives: truncated=True, bounded memory.
    """
    fake, attacker, _ = faked
    async def flood(request_id: int) -> AsyncIterator[bytes]:
        chunk = event(request_id, output=process_pb2.Output(channel=process_pb2.CHANNEL_STDOUT, data=b"x" * 65536))
        yield event(request_id, started=process_pb2.Started())
        for _ in range(16384):
            yield chunk
        yield event(request_id, finished=process_pb2.Finished(exit_code=0))

    fake.execute = flood
    before = _peak_rss_mib()
    result = await attacker.shell("anything")
    assert result.truncated and len(result.stdout) == 65536
    assert _peak_rss_mib() - before < 200


async def test_oversized_event(faked):
    """A server sending one output event of 48 MiB (over the client's message limit) in a command's stream.

    SandboxProtocolError for that call.
    """
    fake, attacker, _ = faked

    async def huge(request_id: int) -> AsyncIterator[bytes]:
        yield event(request_id, started=process_pb2.Started())
        yield event(request_id, output=process_pb2.Output(channel=process_pb2.CHANNEL_STDOUT, data=b"x" * (48 << 20)))

    fake.execute = huge
    with pytest.raises(SandboxProtocolError):
        await attacker.shell("anything")


async def test_endless_keepalives(faked, monkeypatch):
    """A server that answers a command with keepalives forever and never a result.

    The call's deadline (its timeout plus a grace) ends it with SandboxUnavailableError; no hang.
    """
    fake, attacker, _ = faked
    monkeypatch.setattr(client, "EXECUTE_GRACE_SECONDS", 1.0)

    async def forever(request_id: int) -> AsyncIterator[bytes]:
        yield event(request_id, started=process_pb2.Started())
        while True:
            yield event(request_id, keepalive=process_pb2.Keepalive())
            await asyncio.sleep(0.05)

    fake.execute = forever
    with pytest.raises(SandboxUnavailableError):
        await attacker.run(["/bin/true"], timeout=1)


class RawServer:
    """A Unix socket that is not gRPC at all: it answers every connection with ``reply`` (or nothing)."""

    def __init__(self, reply: bytes | None) -> None:
        self.reply = reply
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            if self.reply is not None:
                writer.write(self.reply)
                await writer.drain()
            await reader.read(1 << 20)
            await asyncio.sleep(HANG_GUARD)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


#: An HTTP/2 SETTINGS frame, then a DATA frame header claiming 16 MiB on stream 1 and a trickle.
OVERSIZED_FRAME = (b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01" + b"x" * 1024)


@pytest.mark.parametrize("reply", [b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n" + os.urandom(4096),
                                   OVERSIZED_FRAME, None],
                         ids=["garbage", "oversized-frame", "silent"])
async def test_server_replaced_by_a_non_grpc_peer(tmp_path, reply):
    """The server goes away and its socket is taken over by a peer that answers garbage, an HTTP/2 frame claiming 16 MiB, or nothing.

    Calls through the tools fail with SandboxUnavailableError or SandboxProtocolError within their deadlines; nothing hangs.
    """
    path = tmp_path / "fake.sock"
    async with fake_server(path, FakeSandbox()) as server:
        backend = await connect(f"unix://{path}", timeout=5)
        await server.stop(None)
    path.unlink(missing_ok=True)
    raw = RawServer(reply)
    peer = await asyncio.start_unix_server(raw.handle, path=str(path))
    attacker = Attacker(backend, tmp_path)
    (tmp_path / "a.txt").write_text("a\n")
    try:
        with pytest.raises((SandboxUnavailableError, SandboxProtocolError)):
            await attacker.call("read_file", path=str(tmp_path / "a.txt"))
        with pytest.raises(SandboxError):
            await attacker.run(["/bin/true"], timeout=2)
        assert raw.connections > 0
    finally:
        peer.close()
        await backend.aclose()
