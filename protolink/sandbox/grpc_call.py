"""One gRPC call over HTTP/2, the protocol kept apart from the socket: :class:`CallState` holds
the frames, HPACK, flow control and every check; :class:`Call` runs it on a blocking socket (what
a one-shot command line needs, at a fraction of grpcio's start-up cost: ``protolink-sandbox exec``
is timed against ``docker exec``) and :mod:`.aio_call` on an asyncio connection.

The connection carries one stream. Everything the server sends is untrusted: a frame larger
than we allow, a frame type we do not expect (pushes included), data past the window we granted,
a message larger than ``max_message_bytes``, a compressed message or a header block that does
not decode is a :class:`~protolink.errors.SandboxProtocolError`; a closed or silent connection a
:class:`~protolink.errors.SandboxUnavailableError`. The call's status is translated by
:mod:`protolink.wire.status`, as grpcio's is; that module (and grpc) loads only when a call fails.
"""

from __future__ import annotations

import select
import socket
import struct
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Protocol

from protolink.errors import SandboxError, SandboxNotReachedError, SandboxProtocolError, SandboxUnavailableError

from . import hpack_codec
from .addresses import grpc_target, socket_path

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 2, 4, 5, 6
STREAM = 1
#: The largest frame we accept (advertised): a mebibyte of output arrives in one or two frames.
MAX_FRAME_BYTES = 1 << 20
#: What the server may send before we grant more (stream and connection alike), by default.
WINDOW_BYTES = 1 << 24
MAX_HEADER_LIST_BYTES = 64 * 1024
#: A message at least this large that arrived in several frames is handed over where they were
#: joined, not copied once more (a mebibyte of output crosses two of gRPC's frames).
LEND_BYTES = 1 << 16
#: The receive buffer's first size: it grows to hold the largest frame read (a mebibyte of output
#: is read into it, not through a new ``bytes`` for every read and a join).
RECEIVE_BYTES = 1 << 16
#: The frame size and window every HTTP/2 peer starts with.
DEFAULT_FRAME_BYTES = 16_384
DEFAULT_WINDOW_BYTES = 65_535
MAX_WINDOW_BYTES = (1 << 31) - 1
#: HTTP/2 error codes a reset stream or a GOAWAY may carry (RFC 9113, 7).
RESET_CODES = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR",
               4: "SETTINGS_TIMEOUT", 5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM",
               8: "CANCEL", 9: "COMPRESSION_ERROR", 10: "CONNECT_ERROR", 11: "ENHANCE_YOUR_CALM",
               12: "INADEQUATE_SECURITY", 13: "HTTP_1_1_REQUIRED"}
CANCEL = 8


def open_socket(address: str, timeout: float) -> socket.socket:
    """A connected socket to ``unix:///path`` or ``[tcp://]host:port``; SandboxNotReachedError
    when nothing answers there (nothing was sent)."""
    try:
        if (path := socket_path(address)) is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(path)
            except BaseException:
                sock.close()
                raise
        else:
            host, port = host_and_port(address)
            sock = socket.create_connection((host, port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, ValueError) as error:
        raise SandboxNotReachedError(f"no sandbox answers at {address}: {error}") from None
    return sock


def host_and_port(address: str) -> tuple[str, int]:
    """The host and port of ``[tcp://]host:port`` (ValueError if there is no port)."""
    host, _, port = grpc_target(address).rpartition(":")
    return host.strip("[]"), int(port)


def authority(address: str) -> str:
    """The ``:authority`` a call to ``address`` names."""
    return "localhost" if socket_path(address) is not None else grpc_target(address)


class CallState:
    """The HTTP/2 connection of one gRPC call, without its I/O: read into :meth:`buffer`, report
    with :meth:`received`, send :attr:`outgoing` (then clear it), take the answer's messages with
    :meth:`take`; :attr:`failure` is set when the server broke the protocol or failed the
    connection (what came before it is still taken first).

    ``method`` is the call's path, such as ``/package.Service/Method``; ``metadata`` goes with its
    headers. The server may send ``window_bytes`` beyond the messages taken: a message's room is
    granted again when it is taken, so a consumer that stops taking stops the server.
    """

    def __init__(self, authority: str, method: str, metadata: Sequence[tuple[str, str]], *, max_message_bytes: int,
                 window_bytes: int = WINDOW_BYTES) -> None:
        self._max_message_bytes = max_message_bytes
        self._window_bytes = window_bytes
        self._decoder = hpack_codec.Decoder(MAX_HEADER_LIST_BYTES)
        self._headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", method.encode()),
                         (b":authority", authority.encode()), (b"content-type", b"application/grpc"),
                         (b"te", b"trailers"), *((key.encode(), value.encode()) for key, value in metadata)]
        #: Bytes to send, in order.
        self.outgoing = bytearray()
        #: Why the connection can serve no more (after the messages queued before it).
        self.failure: SandboxError | None = None
        #: Pings sent and not yet answered.
        self.unanswered_pings = 0
        self._received = bytearray(RECEIVE_BYTES)  # bytes read: those in [_start, _end) are not parsed yet
        self._start = self._end = 0
        self._unsent = bytearray()  # request bytes waiting for the server's window
        self._ending = False  # the request stream ends once they are sent
        self._send_window = self._connection_window = DEFAULT_WINDOW_BYTES
        self._peer_frame_bytes = DEFAULT_FRAME_BYTES
        self._peer_window = DEFAULT_WINDOW_BYTES  # a stream's initial window, as the server last set it
        self._receive_window = window_bytes  # what the server may still send
        self._unacknowledged = 0  # bytes taken and not yet granted again
        self._answered = False  # the answer's headers arrived
        self.ended = False  # the server ended the stream
        self._block = bytearray()  # a header block received so far
        self._continuing = False  # CONTINUATION frames still extend it
        self._block_ends_stream = False
        self._trailers: hpack_codec.Headers | None = None
        self._data = bytearray()  # received bytes of a message not yet complete
        self._data_granted = 0  # of which granted again already
        self._messages: deque[tuple[bytes | memoryview, int]] = deque()  # complete messages, and the room each takes

    # Sending -----------------------------------------------------------------------------

    def open(self) -> None:
        """Queue the connection preface, our settings and the call's headers."""
        settings = b"".join(struct.pack(">HI", key, value) for key, value in (
            (SETTINGS_ENABLE_PUSH, 0), (SETTINGS_INITIAL_WINDOW_SIZE, self._window_bytes),
            (SETTINGS_MAX_FRAME_SIZE, MAX_FRAME_BYTES), (SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST_BYTES)))
        block = hpack_codec.encode(self._headers)
        if len(block) > DEFAULT_FRAME_BYTES:
            raise ValueError(f"the call's headers take {len(block)} bytes; at most {DEFAULT_FRAME_BYTES} are sent")
        self.outgoing += PREFACE
        self.outgoing += frame(SETTINGS, 0, 0, settings)
        if self._window_bytes > DEFAULT_WINDOW_BYTES:
            self.outgoing += frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._window_bytes - DEFAULT_WINDOW_BYTES))
        self.outgoing += frame(HEADERS, END_HEADERS, STREAM, block)

    def send(self, message: bytes, *, end: bool = False) -> None:
        """Queue ``message`` (sent as the server's window allows); ``end`` ends the request stream."""
        self._unsent += struct.pack(">BI", 0, len(message))
        self._unsent += message
        self._ending = end
        self._send_unsent()

    @property
    def sending(self) -> bool:
        """Request bytes still wait for the server's window."""
        return bool(self._unsent) and not self.ended

    def cancel(self) -> None:
        """Queue the stream's reset (CANCEL): the server ends what it runs for the call."""
        if not self.ended:
            self.outgoing += frame(RST_STREAM, 0, STREAM, struct.pack(">I", CANCEL))
            self.ended = True

    def ping(self) -> None:
        """Queue a ping; :attr:`unanswered_pings` counts it until its answer arrives."""
        self.outgoing += frame(PING, 0, 0, self.unanswered_pings.to_bytes(8, "big"))
        self.unanswered_pings += 1

    def _send_unsent(self) -> None:
        while self._unsent or self._ending:
            room = min(self._send_window, self._connection_window, self._peer_frame_bytes, len(self._unsent))
            if room <= 0 and self._unsent:
                return
            last = room == len(self._unsent) and self._ending
            self.outgoing += frame(DATA, END_STREAM if last else 0, STREAM, memoryview(self._unsent)[:room])
            self._send_window -= room
            self._connection_window -= room
            del self._unsent[:room]
            if last:
                self._ending = False

    # Receiving ---------------------------------------------------------------------------

    def buffer(self) -> memoryview:
        """Free room at the end of the receive buffer to read into, then :meth:`received`."""
        wanted = 9
        if self._end - self._start >= 9:
            wanted += min(int.from_bytes(self._received[self._start:self._start + 3], "big"), MAX_FRAME_BYTES)
        if len(self._received) - self._start < wanted or self._start == self._end:
            self._make_room(wanted)
        with memoryview(self._received) as received:
            return received[self._end:]

    def received(self, count: int) -> None:
        """Parse the frames complete now that ``count`` more bytes were read into :meth:`buffer`."""
        self._end += count
        try:
            while self.failure is None and self._end - self._start >= 9:
                start = self._start
                length = int.from_bytes(self._received[start:start + 3], "big")
                if length > MAX_FRAME_BYTES:
                    raise SandboxProtocolError(f"the sandbox sent a frame of {length} bytes; at most "
                                               f"{MAX_FRAME_BYTES} are accepted")
                if self._end - start < 9 + length:
                    break
                kind, flags = self._received[start + 3], self._received[start + 4]
                stream = int.from_bytes(self._received[start + 5:start + 9], "big") & MAX_WINDOW_BYTES
                if self._continuing and kind != CONTINUATION:
                    raise SandboxProtocolError("the sandbox interrupted a header block")
                handler = self._HANDLERS.get(kind)
                if handler is None:
                    raise SandboxProtocolError(f"the sandbox sent an HTTP/2 frame of unexpected type {kind}")
                self._start = start + 9 + length
                with memoryview(self._received) as received:
                    handler(self, flags, stream, received[start + 9:self._start])
        except SandboxError as error:
            self.failure = error

    def take(self) -> bytes | memoryview | None:
        """The answer's next message (None: none is complete yet); its room is granted again."""
        if not self._messages:
            return None
        message, room = self._messages.popleft()
        self._grant(room)
        self._grant_large_start()
        return message

    def finished(self) -> Exception | None:
        """Once the answer ended and its messages were taken: why the call failed (None: it did not)."""
        if self.failure is not None:
            return self.failure
        if self._data:
            return SandboxProtocolError("the sandbox ended the call inside a message")
        return self._status_error()

    def connection_lost(self, error: SandboxError) -> None:
        """The connection ended: ``error`` unless the call had ended already."""
        if self.failure is None and not self.ended:
            self.failure = error

    def _on_data(self, flags: int, stream: int, payload: memoryview) -> None:
        if stream != STREAM or not self._answered or self.ended:
            raise SandboxProtocolError("the sandbox sent data outside its answer")
        self._receive_window -= len(payload)
        if self._receive_window < 0:
            raise SandboxProtocolError("the sandbox sent more data than its window allowed (FLOW_CONTROL_ERROR)")
        data = _unpadded(flags, payload)
        padding = len(payload) - len(data)
        if self._data:
            self._data += data
            with memoryview(self._data) as assembled:
                taken = self._split(assembled, self._data_granted, lend=self._data)
            if taken and int.from_bytes(self._data[1:5], "big") >= LEND_BYTES:
                self._data = self._data[taken:]  # the first message is lent as it lies: a new buffer
            else:
                del self._data[:taken]
            granted = self._data_granted if not taken else 0
        else:
            taken = self._split(data, 0)
            self._data += data[taken:]
            granted = 0
        self._grant(padding)
        self._data_granted = granted
        self._grant_large_start()
        if flags & END_STREAM:
            self.ended = True

    def _grant_large_start(self) -> None:
        """Grant what arrived of a message too large to wait for its room (the rest could not come
        otherwise), once every message before it has been taken: a server sending such messages
        to a consumer that takes none is held back by the window, as with any other."""
        if self._messages or len(self._data) < 5:
            return
        if 5 + int.from_bytes(self._data[1:5], "big") > self._window_bytes // 2:
            self._grant(len(self._data) - self._data_granted)
            self._data_granted = len(self._data)

    def _split(self, data: memoryview, granted: int, lend: bytearray | None = None) -> int:
        """Queue the complete messages at the start of ``data`` (``granted`` of its bytes granted
        already); how many bytes they took. A first message of at least :data:`LEND_BYTES` in
        ``data``'s own buffer ``lend`` is queued as a view of it, not copied (the caller then
        leaves that buffer to it)."""
        at = 0
        while len(data) - at >= 5:
            compressed, length = struct.unpack_from(">BI", data, at)
            if compressed:
                raise SandboxProtocolError("the sandbox sent a compressed message, which was not asked for")
            if length > self._max_message_bytes:
                raise SandboxProtocolError(f"the sandbox sent a message of {length} bytes; at most "
                                           f"{self._max_message_bytes} are accepted")
            if len(data) - at < 5 + length:
                break
            if at == 0 and lend is not None and length >= LEND_BYTES:
                message: bytes | memoryview = memoryview(lend)[5:5 + length]
            else:
                message = bytes(data[at + 5:at + 5 + length])
            self._messages.append((message, 5 + length - granted))
            granted = 0
            at += 5 + length
        return at

    def _on_headers(self, flags: int, stream: int, payload: memoryview) -> None:
        if stream != STREAM or self.ended:
            raise SandboxProtocolError("the sandbox sent headers outside its answer")
        payload = _unpadded(flags, payload)
        if flags & PRIORITY_FLAG:
            payload = payload[5:]
        self._block_ends_stream = bool(flags & END_STREAM)
        self._add_block(flags, payload)

    def _on_continuation(self, flags: int, stream: int, payload: memoryview) -> None:
        if stream != STREAM or not self._continuing:
            raise SandboxProtocolError("the sandbox sent a CONTINUATION frame out of place")
        self._add_block(flags, payload)

    def _add_block(self, flags: int, payload: memoryview) -> None:
        self._block += payload
        if len(self._block) > MAX_HEADER_LIST_BYTES:
            raise SandboxProtocolError(f"the sandbox sent more than {MAX_HEADER_LIST_BYTES} bytes of headers")
        self._continuing = not flags & END_HEADERS
        if self._continuing:
            return
        try:
            headers = self._decoder.decode(bytes(self._block))
        except hpack_codec.HeaderError as error:
            raise SandboxProtocolError(f"the sandbox sent headers that do not decode: {error}") from None
        self._block.clear()
        if not self._answered:
            fields = dict(headers)
            if fields.get(b":status") != b"200":
                raise SandboxProtocolError(f"the sandbox answered with HTTP status {_text(fields.get(b':status'))}")
            if not fields.get(b"content-type", b"").startswith(b"application/grpc"):
                raise SandboxProtocolError("the sandbox answered with a content type other than gRPC")
            self._answered = True
            if not self._block_ends_stream:
                return
        elif not self._block_ends_stream:
            raise SandboxProtocolError("the sandbox sent a second header block that does not end its answer")
        self._trailers = headers
        self.ended = True

    def _on_reset(self, flags: int, stream: int, payload: memoryview) -> None:
        if len(payload) != 4 or stream != STREAM:
            raise SandboxProtocolError("the sandbox sent a malformed RST_STREAM frame")
        code = struct.unpack(">I", payload)[0]
        if self.ended:
            return  # after its answer: the server is done with the request stream (NO_ERROR)
        if code in (7, 8):  # REFUSED_STREAM, CANCEL
            raise SandboxUnavailableError(f"the sandbox reset the call ({RESET_CODES[code]})")
        raise SandboxProtocolError(f"the sandbox reset the call ({RESET_CODES.get(code, code)})")

    def _on_settings(self, flags: int, stream: int, payload: memoryview) -> None:
        if stream or len(payload) % 6 or (flags & ACK and payload):
            raise SandboxProtocolError("the sandbox sent a malformed SETTINGS frame")
        if flags & ACK:
            return
        for key, value in struct.iter_unpack(">HI", payload):
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW_BYTES:
                    raise SandboxProtocolError("the sandbox sent an invalid window size")
                self._send_window += value - self._peer_window
                self._peer_window = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_BYTES <= value < 1 << 24:
                    raise SandboxProtocolError("the sandbox sent an invalid frame size")
                self._peer_frame_bytes = value
        self.outgoing += frame(SETTINGS, ACK, 0, b"")
        self._send_unsent()

    def _on_ping(self, flags: int, stream: int, payload: memoryview) -> None:
        if stream or len(payload) != 8:
            raise SandboxProtocolError("the sandbox sent a malformed PING frame")
        if not flags & ACK:
            self.outgoing += frame(PING, ACK, 0, payload)
        elif self.unanswered_pings:
            self.unanswered_pings -= 1

    def _on_goaway(self, flags: int, stream: int, payload: memoryview) -> None:
        if stream or len(payload) < 8:
            raise SandboxProtocolError("the sandbox sent a malformed GOAWAY frame")
        last_stream, code = struct.unpack_from(">II", payload)
        if last_stream & MAX_WINDOW_BYTES < STREAM or code:
            raise SandboxUnavailableError(f"the sandbox closed the connection ({RESET_CODES.get(code, code)})")
        # else: it finishes this call before it closes

    def _on_window_update(self, flags: int, stream: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise SandboxProtocolError("the sandbox sent a malformed WINDOW_UPDATE frame")
        increment = struct.unpack(">I", payload)[0] & MAX_WINDOW_BYTES
        if stream == 0:
            self._connection_window += increment
        elif stream == STREAM:
            self._send_window += increment
        if self._connection_window > MAX_WINDOW_BYTES or self._send_window > MAX_WINDOW_BYTES:
            raise SandboxProtocolError("the sandbox sent an invalid window size")
        self._send_unsent()

    def _on_priority(self, flags: int, stream: int, payload: memoryview) -> None:
        if len(payload) != 5:
            raise SandboxProtocolError("the sandbox sent a malformed PRIORITY frame")

    _HANDLERS = {DATA: _on_data, HEADERS: _on_headers, CONTINUATION: _on_continuation, RST_STREAM: _on_reset,
                 SETTINGS: _on_settings, PING: _on_ping, GOAWAY: _on_goaway, WINDOW_UPDATE: _on_window_update,
                 PRIORITY: _on_priority}

    def _grant(self, count: int) -> None:
        """Give the server back the room of ``count`` bytes, half a window at a time."""
        self._unacknowledged += count
        if self._unacknowledged >= self._window_bytes // 2:
            grant = struct.pack(">I", self._unacknowledged)
            self.outgoing += frame(WINDOW_UPDATE, 0, 0, grant)
            if not self.ended:
                self.outgoing += frame(WINDOW_UPDATE, 0, STREAM, grant)
            self._receive_window += self._unacknowledged
            self._unacknowledged = 0

    def _make_room(self, count: int) -> None:
        """Move the unparsed bytes to the front of the receive buffer, in a larger one when
        ``count`` bytes would not fit (no view of it may be held)."""
        unread = self._received[self._start:self._end]
        if len(self._received) < count:
            self._received = bytearray(count + RECEIVE_BYTES)
        self._received[:len(unread)] = unread
        self._start, self._end = 0, len(unread)

    def _status_error(self) -> Exception | None:
        trailers = self._trailers or []
        fields = dict(trailers)
        status = fields.get(b"grpc-status")
        if status == b"0":
            return None
        if status is None or not status.isdigit():
            return SandboxProtocolError("the sandbox ended the call without a valid status")
        from urllib.parse import unquote_to_bytes

        import grpc

        from protolink.wire.status import from_status

        code = next((code for code in grpc.StatusCode if code.value[0] == int(status)), grpc.StatusCode.UNKNOWN)
        details = unquote_to_bytes(fields.get(b"grpc-message", b"")).decode(errors="replace")
        return from_status(code, details, _metadata(trailers))


class Requests(Protocol):
    """More request messages, made from what a file descriptor holds (a command's stdin), sent
    while the answer is read."""

    #: Read when it is readable and the server's window has room for another message.
    fd: int

    def next(self) -> tuple[bytes, bool]:
        """The next message, from what :attr:`fd` holds now, and whether it is the last."""


class Call:
    """A gRPC call on the blocking socket ``sock`` (which it owns: :meth:`close` it), for one
    request message, or with more from :class:`Requests`; see :class:`CallState` for the rest."""

    def __init__(self, sock: socket.socket, authority: str, method: str, metadata: Sequence[tuple[str, str]],
                 *, max_message_bytes: int) -> None:
        self._sock = sock
        self._state = CallState(authority, method, metadata, max_message_bytes=max_message_bytes)

    def close(self) -> None:
        self._sock.close()

    def settimeout(self, seconds: float | None) -> None:
        """How long a read may wait for the server (TimeoutError past it)."""
        self._sock.settimeout(seconds)

    def send(self, message: bytes, *, end: bool = True) -> None:
        """Open the connection and the call, send ``message`` and end the request stream (unless
        not ``end``: :meth:`messages` then sends the rest)."""
        self._state.open()
        self._state.send(message, end=end)
        self._flush()
        while self._state.sending and self._state.failure is None:  # the server grants more room
            self._read()

    def messages(self, requests: Requests | None = None) -> Iterator[bytes | memoryview]:
        """The answer's messages, in order; then the call's status is checked (raises unless OK).
        Meanwhile the ``requests`` are sent, one message at a time as the server's window takes
        it (what the answer brings is read first), until the last ends the request stream."""
        state = self._state
        while True:
            while (message := state.take()) is not None:
                self._flush()
                yield message
            if state.failure is not None or state.ended:
                if (error := state.finished()) is None:
                    return
                if isinstance(error, SandboxNotReachedError):  # said by a server this call reached: not one to repeat
                    raise SandboxUnavailableError(str(error))
                raise error
            if requests is not None and not state.sending and self._input_first(requests.fd):
                message, last = requests.next()
                state.send(message, end=last)
                self._flush()
                requests = None if last else requests
            else:
                self._read()

    def _input_first(self, fd: int) -> bool:
        """Wait until the socket or ``fd`` is readable (TimeoutError past the socket's timeout):
        whether ``fd`` is and the socket is not."""
        if getattr(self._sock, "pending", lambda: 0)():  # TLS: bytes already decrypted, which poll cannot see
            return False
        poll = select.poll()
        poll.register(self._sock, select.POLLIN)
        poll.register(fd, select.POLLIN)
        timeout = self._sock.gettimeout()
        ready = dict(poll.poll(None if timeout is None else max(1, round(timeout * 1000))))
        if not ready:
            raise TimeoutError
        return self._sock.fileno() not in ready

    def _read(self) -> None:
        """Read what the socket holds (at least a byte) and act on it."""
        try:
            received = self._sock.recv_into(self._state.buffer())
        except TimeoutError:
            raise  # the caller's deadlines say what it means
        except OSError as error:
            self._state.connection_lost(SandboxUnavailableError(f"the connection to the sandbox failed: {error}"))
            return
        if not received:
            self._state.connection_lost(SandboxUnavailableError("the sandbox closed the connection"))
        self._state.received(received)
        self._flush()

    def _flush(self) -> None:
        if not self._state.outgoing:
            return
        try:
            self._sock.sendall(self._state.outgoing)
        except TimeoutError:
            raise  # the caller's deadlines say what it means
        except OSError as error:
            raise SandboxUnavailableError(f"the connection to the sandbox failed: {error}") from None
        self._state.outgoing.clear()


def frame(kind: int, flags: int, stream: int, payload: bytes | bytearray | memoryview) -> bytes:
    """One HTTP/2 frame."""
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + bytes(payload)


def _unpadded(flags: int, payload: memoryview) -> memoryview:
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise SandboxProtocolError("the sandbox sent a frame with invalid padding")
    return payload[1:len(payload) - payload[0]]


def _metadata(headers: hpack_codec.Headers) -> list[tuple[str, str | bytes]]:
    """Headers as grpcio hands metadata over: text, and the bytes of ``-bin`` keys."""
    import base64

    metadata: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        key = name.decode("latin-1")
        if key.endswith("-bin"):
            try:
                metadata.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
            except ValueError:
                continue  # a value that does not decode is no metadata: the status alone counts
        else:
            metadata.append((key, value.decode("latin-1")))
    return metadata


def _text(value: bytes | None) -> str:
    return repr(value.decode("latin-1")[:40]) if value is not None else "none"
