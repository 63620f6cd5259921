"""Forwarding: every ``/protolink.sandbox.v1.Sandbox/*`` call (and the health check) that names a
sandbox goes, as the bytes that came, to that sandbox's own server.

One implementation serves both hops: the service's (to the sandbox, or to the gateway of the
Swarm node it runs on) and a node gateway's (:mod:`protolink.sandbox.gateway`, to the task's
socket). Each gives :class:`Forwarder` its own ``resolve``, which finds the :class:`Target`.

A sandbox on this host gets its Execute calls over its command channel
(:mod:`.channel_hop`), the others over gRPC. A pooled sandbox waits with an Execute call already
open to it (:class:`HeldCall`, or a :class:`~.channel_hop.HeldChannel`): its owner's first
Execute call is forwarded on it, without opening a stream to the sandbox then.

Nothing is parsed on the way but what the events need: each Execute request and event (argv,
directory, exit, duration, output bytes), each ReplaceFile request and each Upload's summary (the
path written). The
other side's status and trailing metadata (the wire's typed errors) come back unchanged. A target's
calls in flight (:class:`InFlight`) end at once, with the typed error it is given, when its
sandbox is deleted or lost under them: never left to hang until their caller's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc
from google.protobuf.message import DecodeError

from protolink.errors import SandboxLostError
from protolink.wire._pb import sandbox_pb2, transfer_pb2, workspace_pb2
from protolink.wire.status import CallEnd, Status, abort_with, to_status

from ..process_stream import OPENING
from ..pipe_connection import ChannelCalls
from . import channel_hop
from .channel_hop import HeldChannel
from .events import Events
from .watched import Commands, InFlight

#: The metadata key that names the sandbox a forwarded call is for.
SANDBOX_KEY = "protolink-sandbox-id"
#: The metadata key that names, to a node's gateway, the task container a forwarded call is for.
CONTAINER_KEY = "protolink-container-id"
_SANDBOX = sandbox_pb2.DESCRIPTOR.services_by_name["Sandbox"]
#: Every forwarded method: whether it streams requests, and responses.
FORWARDED: dict[str, tuple[bool, bool]] = {
    **{f"/{_SANDBOX.full_name}/{method.name}": (method.client_streaming, method.server_streaming)
       for method in _SANDBOX.methods},
    "/grpc.health.v1.Health/Check": (False, False),
}
EXECUTE = f"/{_SANDBOX.full_name}/Execute"
REPLACE_FILE = f"/{_SANDBOX.full_name}/ReplaceFile"
UPLOAD = f"/{_SANDBOX.full_name}/Upload"
#: Metadata the sandbox's server never sees: the service's and the gateway's own.
_HELD_BACK = frozenset({"authorization", SANDBOX_KEY, CONTAINER_KEY})


class Target(Protocol):
    """Where a forwarded call goes: a sandbox's ``id``, its ``state`` (``lost`` ends the call
    with :class:`~protolink.errors.SandboxLostError`), its calls in flight and the time of the
    last one (its idle clock), the channel to it, its command channel (None: gRPC only; see
    :mod:`.channel_hop`), and the call opened to it ahead of its first Execute call
    (:class:`HeldCall`, or :class:`~.channel_hop.HeldChannel`), given out once (None when there
    is none, or it ended)."""

    id: str
    state: str
    calls: InFlight
    last_used: float

    def channel(self) -> grpc.aio.Channel: ...

    def command_channel(self) -> ChannelCalls | None: ...

    def held_call(self) -> HeldCall | HeldChannel | None: ...


#: Finds the caller's target for a call (aborting the call when there is none): its tenant id and target.
Resolve = Callable[[grpc.aio.ServicerContext, str], Awaitable[tuple[str, Target]]]


class Forwarder(grpc.GenericRpcHandler):
    """The generic handler of the forwarded methods (:data:`FORWARDED`); ``events`` hears of the
    commands and files (a gateway passes none)."""

    def __init__(self, resolve: Resolve, events: Events) -> None:
        self._resolve = resolve
        self.events = events

    async def resolve(self, context: grpc.aio.ServicerContext, method: str) -> tuple[str, Target]:
        """The call's tenant and target; a lost target ends the call with the typed loss."""
        tenant, target = await self._resolve(context, method)
        if target.state == "lost":
            await abort_with(context, to_status(lost(target)))
        return tenant, target

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        shape = FORWARDED.get(method)
        if shape is None:
            return None
        if shape == (False, False):
            return grpc.unary_unary_rpc_method_handler(self._unary(method))
        if shape == (True, False):
            return grpc.stream_unary_rpc_method_handler(self._stream_in(method))
        if shape == (False, True):
            return grpc.unary_stream_rpc_method_handler(self._stream_out(method))
        return grpc.stream_stream_rpc_method_handler(self._streams(method))

    def _unary(self, method: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            tenant, target = await self.resolve(context, method)
            response = await _one_answer(context, target, target.channel().unary_unary(method), request)
            if method == REPLACE_FILE:
                self._file_written(tenant, target, request)
            return response

        return forward

    def _stream_in(self, method: str) -> Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext], Awaitable[bytes]]:
        async def forward(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
            first = await _first(requests, context)
            tenant, target = await self.resolve(context, method)
            response = await _one_answer(context, target, target.channel().stream_unary(method),
                                         _watched(first, requests, None))
            if method == UPLOAD:
                self._uploaded(tenant, target, response)
            return response

        return forward

    def _stream_out(self, method: str) -> Callable[[bytes, grpc.aio.ServicerContext], AsyncIterator[bytes]]:
        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            _, target = await self.resolve(context, method)
            call = target.channel().unary_stream(method)(request, metadata=_passed(context),
                                                         timeout=context.time_remaining())
            async for response in _relayed_stream(context, target, call, None):
                yield response

        return forward

    def _streams(self, method: str) -> Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext], AsyncIterator[bytes]]:
        async def forward(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            first = await _first(requests, context)
            tenant, target = await self.resolve(context, method)
            watch = Commands(self.events, tenant, target.id) if method == EXECUTE else None
            try:
                async with contextlib.aclosing(self._execute(context, target, method, first, requests, watch)) as relayed:
                    async for response in relayed:
                        yield response
            finally:
                if watch is not None:
                    watch.call_ended()

        return forward

    async def _execute(self, context: grpc.aio.ServicerContext, target: Target, method: str, first: bytes,
                       requests: AsyncIterator[bytes], watch: Commands | None) -> AsyncIterator[bytes]:
        """The call's responses, forwarded on the sandbox's command channel where it can go there
        (an Execute call without metadata or deadline of its own), else on gRPC."""
        metadata, timeout = _passed(context), context.time_remaining()
        plain = watch is not None and _plain(metadata) and timeout is None
        held = target.held_call() if plain else None
        if plain and not isinstance(held, HeldCall):
            on_channel = await channel_hop.opened(target.command_channel(), held, first, watch)
            if on_channel is not None:
                try:
                    async for response in channel_hop.relayed(context, target.calls, on_channel, requests, watch):
                        yield response
                finally:
                    target.last_used = time.time()
                return
        watched = _watched(first, requests, watch)
        if isinstance(held, HeldCall):
            call = held.feed(watched)
        else:
            call = target.channel().stream_stream(method)(watched, metadata=metadata, timeout=timeout)
        async for response in _relayed_stream(context, target, call, watch):
            yield response

    def _uploaded(self, tenant: str, target: Target, response: bytes) -> None:
        try:
            summary = transfer_pb2.TransferSummary.FromString(response)
        except DecodeError:
            return
        self.events.emit("file.written", tenant, target.id, path=summary.path, bytes=summary.bytes)

    def _file_written(self, tenant: str, target: Target, request: bytes) -> None:
        try:
            parsed = workspace_pb2.ReplaceFileRequest.FromString(request)
        except DecodeError:
            return
        size = len(parsed.data) if parsed.HasField("data") else None
        self.events.emit("file.written", tenant, target.id, path=parsed.expected.resource_id, bytes=size)


class HeldCall:
    """An Execute call opened on ``channel`` before anyone asks for one, with the request that
    does nothing (:data:`~protolink.sandbox.process_stream.OPENING`); :meth:`feed` gives it the
    requests of the first client call that names its sandbox. It carries no metadata and no
    deadline: it stands only for a client call that has neither."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._requests: asyncio.Future[AsyncIterator[bytes]] = asyncio.get_running_loop().create_future()
        self.call = channel.stream_stream(EXECUTE)(self._relayed())

    def feed(self, requests: AsyncIterator[bytes]) -> Any:
        """The call, now carrying ``requests``."""
        self._requests.set_result(requests)
        return self.call

    def done(self) -> bool:
        return bool(self.call.done())

    def cancel(self) -> None:
        self.call.cancel()
        self._requests.cancel()

    async def _relayed(self) -> AsyncIterator[bytes]:
        yield OPENING.SerializeToString()
        async for request in await self._requests:
            yield request


def lost(target: Target) -> SandboxLostError:
    """What a call to ``target``, lost, ends with."""
    return SandboxLostError(f"sandbox {target.id} is lost: its container or task is gone (killed, out of memory, "
                            f"its node left); it is not recreated")


async def _first(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
    """A stream's first request, read before any refusal: a call ended while the caller's first
    message is still on its way may reach the caller as INTERNAL instead of the refusal."""
    try:
        return await anext(aiter(requests))
    except StopAsyncIteration:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call sent no request")
        raise AssertionError("unreachable") from None  # abort raises


async def _one_answer(context: grpc.aio.ServicerContext, target: Target, open_call: Any, request: Any) -> bytes:
    """The answer of a call that has one (``open_call(request)``), passed on."""
    call = open_call(request, metadata=_passed(context), timeout=context.time_remaining())
    async with _relaying(context, target, call):
        response: bytes = await call
    _pass_trailing(context, await call.trailing_metadata())
    return response


async def _relayed_stream(context: grpc.aio.ServicerContext, target: Target, call: Any,
                          watch: Commands | None) -> AsyncIterator[bytes]:
    """``call``'s answers as they come, then its status and trailing metadata, passed on."""
    async with _relaying(context, target, call):
        async for response in call:
            if watch is not None:
                watch.event(response)
            yield response
        _pass_trailing(context, await call.trailing_metadata())


@contextlib.asynccontextmanager
async def _relaying(context: grpc.aio.ServicerContext, target: Target, call: Any) -> AsyncIterator[None]:
    """While ``call`` is relayed: counted among ``target``'s calls in flight (its idle clock
    stopped); its failure passed on as the caller's status and trailing metadata, and its end by
    :meth:`InFlight.end` as that error; canceled at the end (the caller gone, say)."""
    end = CallEnd(call)
    target.calls.add(call)
    try:
        yield
    except grpc.aio.AioRpcError as error:
        await _abort_as(context, end.of(Status.raised_by(error)))
    except asyncio.CancelledError:
        await _abort_if_ended(context, target)
        raise
    finally:
        call.cancel()
        target.calls.discard(call)
        target.last_used = time.time()


async def _abort_if_ended(context: grpc.aio.ServicerContext, target: Target) -> None:
    """End the caller's call with the error ``target``'s calls in flight were ended with, when
    that is why the call was canceled; returns when this handler itself is being canceled (its
    caller went away), or the call was canceled otherwise."""
    task = asyncio.current_task()
    if target.calls.ended is not None and task is not None and not task.cancelling():
        await abort_with(context, to_status(target.calls.ended))


async def _watched(first: bytes, requests: AsyncIterator[bytes], watch: Commands | None) -> AsyncIterator[bytes]:
    if watch is not None:
        watch.request(first)
    yield first
    async for request in requests:
        if watch is not None:
            watch.request(request)
        yield request


async def _abort_as(context: grpc.aio.ServicerContext, status: Status) -> None:
    """End the caller's call as the sandbox ended it: status, details, trailing metadata (the wire's typed error)."""
    await context.abort(status.code, status.details, status.trailing_metadata)


def _plain(metadata: tuple[tuple[str, Any], ...]) -> bool:
    """Whether ``metadata`` holds nothing but what grpcio sends on every call (its user agent)."""
    return all(key == "user-agent" for key, _ in metadata)


def _passed(context: grpc.aio.ServicerContext) -> tuple[tuple[str, Any], ...]:
    return tuple((key, value) for key, value in context.invocation_metadata() or () if key not in _HELD_BACK)


def _pass_trailing(context: grpc.aio.ServicerContext, trailing: Any) -> None:
    if trailing:
        context.set_trailing_metadata(tuple(trailing))
