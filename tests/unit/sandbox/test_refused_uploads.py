"""An upload the sandbox refuses while its data is still going out fails with the sandbox's own
typed error, on the direct path and through the service's forwarding; and a forwarded call whose
sandbox ends under it (deleted, lost) ends at once with the error it is given.

The sandboxes are real gRPC servers in threads (:mod:`.threaded_server`) that speak the Sandbox
service's methods as bytes: one refuses every upload once it has taken
:data:`REFUSED_AFTER_BYTES`, the other takes every call and never answers. The service's
:class:`~protolink.sandbox.service.forward.Forwarder` runs in a thread of its own before them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from protolink.errors import SandboxLostError, SandboxNotFoundError, TransferLimitError
from protolink.execution.process_types import NO_EVENTS, ProcessSpec
from protolink.sandbox.client import SandboxBackend, attach
from protolink.sandbox.service.events import Events
from protolink.sandbox.service.forward import SANDBOX_KEY, Forwarder, HeldCall, InFlight
from protolink.sandbox.transfer import download, upload
from protolink.wire._pb import sandbox_pb2, transfer_pb2
from protolink.wire.status import abort_with, to_status

from .threaded_server import ServerThread, threaded_server

ROOT = "/work"
INFO = sandbox_pb2.InfoResponse(boundary="sandbox:test", roots=[sandbox_pb2.Root(path=ROOT, writable=True)])
#: How much of an upload the refusing sandbox takes before it refuses; the uploads are far larger.
REFUSED_AFTER_BYTES = 2 << 20
UPLOAD_BYTES = 48 << 20
#: What the refusing sandbox refuses an upload with, by its destination's name.
REFUSALS: dict[str, Exception] = {
    "too-large": TransferLimitError("the upload exceeds the sandbox's 2 MiB"),
    "disk-full": OSError(errno.ENOSPC, "No space left on device"),
    "gone": FileNotFoundError(errno.ENOENT, "No such file or directory"),
}
#: A hang guard, never a measure.
HANG_GUARD = 60.0


async def refuse_midway(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
    """Take an upload's start and :data:`REFUSED_AFTER_BYTES` of its data, then refuse it."""
    taken, refusal = 0, None
    async for request in requests:
        chunk = transfer_pb2.UploadChunk.FromString(request)
        if chunk.HasField("start"):
            refusal = REFUSALS[Path(chunk.start.destination).name]
        taken += len(chunk.data)
        if taken >= REFUSED_AFTER_BYTES:
            await abort_with(context, to_status(refusal))
    raise AssertionError("the upload ended before it was refused")


@dataclass
class Never(grpc.GenericRpcHandler):
    """A sandbox that takes every call (each of its requests too) and never answers; ``started``
    is set once a call of ``watched`` (a method's name) has brought its ``requests``-th request."""

    watched: str = ""
    requests: int = 1
    started: threading.Event = field(default_factory=threading.Event)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        watched = handler_call_details.method.endswith(f"/{self.watched}")
        if handler_call_details.method.endswith("/Download"):
            return grpc.unary_stream_rpc_method_handler(functools.partial(self._answer_first, watched))
        if handler_call_details.method.endswith("/Upload"):
            return grpc.stream_unary_rpc_method_handler(functools.partial(self._take_all, watched))
        return grpc.stream_stream_rpc_method_handler(functools.partial(self._take_all_streaming, watched))

    async def _answer_first(self, watched: bool, request: bytes,
                            context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self._came(watched, 1)
        yield transfer_pb2.DownloadChunk(kind=transfer_pb2.TRANSFER_KIND_FILE).SerializeToString()
        await asyncio.Event().wait()

    async def _take_all(self, watched: bool, requests: AsyncIterator[bytes],
                        context: grpc.aio.ServicerContext) -> bytes:
        count = 0
        async for _ in requests:
            count += 1
            self._came(watched, count)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def _take_all_streaming(self, watched: bool, requests: AsyncIterator[bytes],
                                  context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        await self._take_all(watched, requests, context)
        yield b""

    def _came(self, watched: bool, count: int) -> None:
        if watched and count == self.requests:
            self.started.set()


class Refusing(grpc.GenericRpcHandler):
    """A sandbox that refuses every upload midway (and never answers its processes' call)."""

    def __init__(self) -> None:
        self._never = Never()

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        if handler_call_details.method.endswith("/Upload"):
            return grpc.stream_unary_rpc_method_handler(refuse_midway)
        return self._never.service(handler_call_details)


@dataclass
class Sandbox:
    """A :class:`~protolink.sandbox.service.forward.Target`: the sandbox server at ``address``."""

    address: str
    id: str = "f00d"
    state: str = "running"
    calls: InFlight = field(default_factory=InFlight)
    last_used: float = 0.0
    _channel: grpc.aio.Channel | None = None

    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.address)
        return self._channel

    def command_channel(self) -> None:
        return None

    def held_call(self) -> HeldCall | None:
        return None


@contextlib.contextmanager
def forwarding(address: str) -> Iterator[tuple[ServerThread, Sandbox]]:
    """The service's forwarding, in a thread of its own, of every call to the sandbox at ``address``."""
    target = Sandbox(address)

    async def resolve(context: grpc.aio.ServicerContext, method: str) -> tuple[str, Sandbox]:
        return "tenant", target

    with threaded_server(Forwarder(resolve, Events())) as service:
        try:
            yield service, target
        finally:
            if target._channel is not None:
                asyncio.run_coroutine_threadsafe(target._channel.close(), service.loop).result(HANG_GUARD)


@contextlib.asynccontextmanager
async def backend_at(address: str) -> AsyncIterator[SandboxBackend]:
    """A client of the sandbox (or the service) at ``address``, on a channel of its own."""
    async with grpc.aio.insecure_channel(address) as channel:
        backend = await attach(channel, ((SANDBOX_KEY, "f00d"),), info=INFO)
        try:
            yield backend
        finally:
            await backend.aclose()


@pytest.fixture(scope="module")
def refusing() -> Iterator[ServerThread]:
    with threaded_server(Refusing()) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def large_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("upload") / "large.bin"
    with path.open("wb") as file:
        file.truncate(UPLOAD_BYTES)
    return path


async def refused(backend: SandboxBackend, source: Path, name: str) -> None:
    """Upload ``source`` as ``name`` three times (grpcio sets the statuses in either order):
    each fails with :data:`REFUSALS`' error of that name, its type and its message."""
    for _ in range(3):
        with pytest.raises(Exception) as raised:
            await asyncio.wait_for(upload(backend, source, f"{ROOT}/{name}"), HANG_GUARD)
        assert (type(raised.value), str(raised.value)) == (type(REFUSALS[name]), str(REFUSALS[name]))


@pytest.mark.parametrize("name", REFUSALS)
async def test_an_upload_refused_midway_fails_with_the_sandboxs_error(refusing, large_file, name):
    async with backend_at(refusing.address) as backend:
        await refused(backend, large_file, name)


@pytest.mark.parametrize("name", REFUSALS)
async def test_an_upload_refused_midway_through_the_service_fails_with_the_sandboxs_error(refusing, large_file,
                                                                                          name):
    with forwarding(refusing.address) as (service, _):
        async with backend_at(service.address) as backend:
            await refused(backend, large_file, name)


def _uploaded(backend: SandboxBackend, tmp_path: Path) -> Awaitable[object]:
    (tmp_path / "small.txt").write_text("small\n")
    return upload(backend, tmp_path / "small.txt", f"{ROOT}/small.txt")


def _downloaded(backend: SandboxBackend, tmp_path: Path) -> Awaitable[object]:
    return download(backend, f"{ROOT}/small.txt", tmp_path / "small.txt")


def _executed(backend: SandboxBackend, tmp_path: Path) -> Awaitable[object]:
    return backend.execute(ProcessSpec(("/bin/true",), "/", {}, 30, 1024), NO_EVENTS)


#: Each forwarded call's shape: the method, its requests the sandbox takes once it is under
#: way (an Execute call's first is the one that opens it), and the operation that makes it.
CALLS: dict[str, tuple[str, int, Callable[[SandboxBackend, Path], Awaitable[object]]]] = {
    "upload": ("Upload", 2, _uploaded),
    "download": ("Download", 1, _downloaded),
    "execute": ("Execute", 2, _executed),
}
ENDINGS = [SandboxNotFoundError("sandbox f00d ended during the call (deleted)"),
           SandboxLostError("sandbox f00d was lost during the call: its container or task is gone")]


@pytest.mark.parametrize("ending", ENDINGS, ids=["deleted", "lost"])
@pytest.mark.parametrize("shape", CALLS)
async def test_a_forwarded_call_in_flight_ends_with_the_error_its_sandbox_ended_with(shape, ending, tmp_path):
    method, requests, operation = CALLS[shape]
    sandbox = Never(method, requests)
    with threaded_server(sandbox) as server, forwarding(server.address) as (service, target):
        async with backend_at(service.address) as backend:
            running = asyncio.ensure_future(operation(backend, tmp_path))
            assert await asyncio.to_thread(sandbox.started.wait, HANG_GUARD), "the call never reached the sandbox"
            service.call_soon(lambda: target.calls.end(ending))
            with pytest.raises(type(ending)) as raised:
                await asyncio.wait_for(running, HANG_GUARD)
            assert str(raised.value) == str(ending)


async def test_a_call_forwarded_after_its_sandbox_ended_ends_at_once(tmp_path):
    with threaded_server(Never()) as server, forwarding(server.address) as (service, target):
        service.call_soon(lambda: target.calls.end(ENDINGS[0]))
        async with backend_at(service.address) as backend:
            with pytest.raises(SandboxNotFoundError, match="ended during the call"):
                await asyncio.wait_for(_uploaded(backend, tmp_path), HANG_GUARD)
