"""The service's hop to a sandbox on this host over its command channel
(:mod:`protolink.wire.pipe_passing`) instead of gRPC: a forwarded Execute call's requests go to
the sandbox as datagrams, and its events come back as the bytes the caller's call answers with,
not serialized again.

The channel is :class:`~protolink.sandbox.pipe_connection.ChannelCall`'s, which checks
everything the sandbox sends (bounded, whole datagrams of a known kind; its failure as a typed
wire error). The service asks for no output pipes (it could not pass them to a remote caller):
a request that names a connection for them has that cleared, and a hand-off that comes anyway
fails the call. A sandbox whose server does not offer the channel (gVisor's kernel, an older
image) is forwarded on gRPC, as a first request the channel cannot carry (over
:data:`~protolink.wire.pipe_passing.DATAGRAM_BYTES`) is.

A pooled sandbox waits with a connection already open, authorized and given the request that
does nothing (:class:`HeldChannel`), as :class:`~.forward.HeldCall` does on gRPC. That request
(:data:`~protolink.sandbox.process_stream.OPENING`, a client's opening of its call) is not sent
again on a connection open already: the sandbox would only parse it, while the first command
runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError

from protolink.errors import SandboxProtocolError
from protolink.execution.output_pipes import PIECE_BYTES
from protolink.wire._pb import process_pb2
from protolink.wire.output_events import output_event_head, read_output_event
from protolink.wire.pipe_passing import DATAGRAM_BYTES
from protolink.wire.status import abort_with, to_status

from ..pipe_connection import ChannelCall, ChannelCalls, PassedPipes, Unsent
from ..process_stream import OPENING
from .watched import Commands, InFlight


class HeldChannel:
    """A command channel connection to a pooled sandbox, greeted, authorized and sent
    :data:`~protolink.sandbox.process_stream.OPENING` before anyone claims it. While it waits
    its pongs are read (so a sandbox gone silent ends it, and they do not pile up); :meth:`take`
    gives it to the first Execute call its owner makes."""

    def __init__(self, call: ChannelCall) -> None:
        self.call = call
        self._waiting = asyncio.ensure_future(anext(call))  # an event is not due: this ends with the call
        self._waiting.add_done_callback(lambda waited: waited.cancelled() or waited.exception())  # the end is taken

    @classmethod
    async def open(cls, calls: ChannelCalls) -> HeldChannel | None:
        """A held connection from ``calls``; None when the sandbox does not offer the channel."""
        call = await opened_ahead(calls)
        return None if call is None else cls(call)

    def done(self) -> bool:
        return self._waiting.done() or self.call.done()

    async def take(self) -> ChannelCall | None:
        """The connection, its waiting read stopped; None when it has ended meanwhile."""
        if not self._waiting.done():
            self._waiting.cancel()
            await asyncio.wait([self._waiting])
        if not self._waiting.cancelled() or self.call.done():
            self.call.cancel()
            return None
        return self.call

    def cancel(self) -> None:
        self._waiting.cancel()
        self.call.cancel()


async def opened_ahead(calls: ChannelCalls) -> ChannelCall | None:
    """A call of ``calls``, greeted and sent :data:`~protolink.sandbox.process_stream.OPENING`
    (a client's opening of its call); None when the sandbox does not offer the channel."""
    call = calls()
    if call is None:
        return None
    try:
        await call.write(process_pb2.ExecuteRequest(id=OPENING.id, cancel=OPENING.cancel))
    except Unsent:
        call.cancel()
        return None
    return call


async def opened(calls: ChannelCalls | None, held: HeldChannel | None, first: bytes,
                 watch: Commands) -> ChannelCall | None:
    """A channel call to the target with ``first`` sent on it (and followed by ``watch``):
    ``held``'s, or a new one of ``calls``; None when the call goes on gRPC (no channel offered,
    a request it cannot carry)."""
    # one that does not parse goes on gRPC too: the sandbox refuses it there, as it always has
    request = _request(first) if calls is not None and len(first) <= DATAGRAM_BYTES else None
    if request is None:
        if held is not None:
            held.cancel()
        return None
    call = await held.take() if held is not None else None
    if call is not None and request == OPENING:
        return call  # it was sent ahead
    for _ in range(2):
        call = call or calls()
        if call is None:
            return None
        try:
            await call.write(request)
        except Unsent:
            call.cancel()
            call = None  # the held connection had closed: once more on a new one
        else:
            watch.started(request)  # before its events can be read: this call's reader starts later
            return call
    return None


async def relayed(context: grpc.aio.ServicerContext, in_flight: InFlight, call: ChannelCall,
                  requests: AsyncIterator[bytes], watch: Commands) -> AsyncIterator[bytes]:
    """The events of ``call`` (its first request sent; counted ``in_flight`` to its target) as
    they come, while the caller's further ``requests`` are sent on it. It ends as a gRPC Execute
    call does: with the sandbox's typed failure, with the error ``in_flight`` was ended with, or
    once the caller's requests have ended and no process runs."""
    writer = _Writer(call, watch)
    writing = asyncio.ensure_future(writer.send(requests))
    in_flight.add(call)
    try:
        async for item in _joined(call):
            if isinstance(item, PassedPipes):
                item.close()
                raise SandboxProtocolError("the sandbox passed output pipes the service did not ask for")
            watch.event(item)
            yield item
            if writer.ended and not watch.running:
                return
    except Exception as error:
        if writer.ended and not watch.running and writer.failure is None:
            return
        ended = in_flight.ended
        await abort_with(context, to_status(writer.failure or ended or error))
    finally:
        writing.cancel()
        call.cancel()
        in_flight.discard(call)


async def _joined(call: ChannelCall) -> AsyncIterator[bytes | PassedPipes]:
    """The items of ``call``, with the output events of one process's stream that have arrived
    by the time one is taken joined into one event of up to :data:`PIECE_BYTES`, as large as a
    sandbox's own gRPC events: a slow caller gets fewer, larger messages (the channel's
    datagrams hold at most :data:`DATAGRAM_BYTES`), and nothing waits for more."""
    later: bytes | PassedPipes | None = None
    while True:
        if later is None:
            try:
                item = await anext(call)
            except StopAsyncIteration:
                return
        else:
            item, later = later, None
        output = read_output_event(item) if isinstance(item, bytes) else None
        if output is None:
            yield item
            continue
        pieces, size, failure = [output.data], len(output.data), None
        try:
            while (later := call.arrived()) is not None:
                following = read_output_event(later) if isinstance(later, bytes) else None
                if (following is None or following[:2] != output[:2]
                        or size + len(following.data) > PIECE_BYTES):
                    break
                pieces.append(following.data)
                size += len(following.data)
                later = None
        except Exception as error:  # noqa: BLE001 (raised once the output before it has gone on)
            failure = error
        yield item if len(pieces) == 1 else b"".join((output_event_head(output.id, output.channel, size), *pieces))
        if failure is not None:
            raise failure


class _Writer:
    """Sends the caller's requests on a channel call; ``ended`` once they have ended,
    ``failure`` when one could not be sent (the call is then canceled)."""

    def __init__(self, call: ChannelCall, watch: Commands) -> None:
        self._call = call
        self._watch = watch
        self.ended = False
        self.failure: Exception | None = None

    async def send(self, requests: AsyncIterator[bytes]) -> None:
        try:
            async for data in requests:
                if (request := _request(data)) is None:
                    self._fail(ValueError("an Execute request that does not parse"))
                    return
                if request == OPENING:
                    continue  # the call is open already: the sandbox would do nothing with it
                self._watch.started(request)
                await self._call.write(request)
        except ValueError as error:  # over DATAGRAM_BYTES: a SandboxBackend sends those on a call of their own
            self._fail(ValueError(f"{error}: send it on an Execute call of its own"))
            return
        except Unsent:
            return  # the call has ended: its reader says why
        except Exception:  # noqa: BLE001 (the caller's stream failed: its call is ending, and this one with it)
            return
        self.ended = True
        if not self._watch.running:
            self._call.cancel()  # nothing runs and nothing more comes: the call ends

    def _fail(self, error: Exception) -> None:
        self.failure = error
        self._call.cancel()


def _request(data: bytes) -> process_pb2.ExecuteRequest | None:
    """The request of ``data``, without a pipe connection (the service takes no pipes); None
    when it does not parse."""
    try:
        request = process_pb2.ExecuteRequest.FromString(data)
    except DecodeError:
        return None
    request.ClearField("pipe_connection")
    return request
