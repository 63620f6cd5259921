"""One gRPC call over HTTP/2 on a blocking socket: what a one-shot command line needs, at a
fraction of grpcio's start-up cost (``protolink-sandbox exec`` is timed against ``docker exec``).

The connection carries one stream. The request messages are sent at once with the connection
preface, in as few writes as flow control allows; the answer's messages are read in order.
Everything the server sends is untrusted: a frame larger than we allow, a frame type we do not
expect (pushes included), a message larger than ``max_message_bytes``, a compressed message or
a header block that does not decode is a :class:`~protolink.errors.SandboxProtocolError`; a
closed or silent connection a :class:`~protolink.errors.SandboxUnavailableError`. The call's
status is translated by :mod:`protolink.wire.status`, as grpcio's is; that module (and grpc)
loads only when a call fails.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator, Sequence

from protolink.errors import SandboxNotReachedError, SandboxProtocolError, SandboxUnavailableError

from . import hpack_codec

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 2, 4, 5, 6
STREAM = 1
#: The largest frame we accept (advertised): a mebibyte of output arrives in one or two frames.
MAX_FRAME_BYTES = 1 << 20
#: What the server may send before we grant more (stream and connection alike).
WINDOW_BYTES = 1 << 24
MAX_HEADER_LIST_BYTES = 64 * 1024
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

def open_socket(address: str, timeout: float) -> socket.socket:
    """A connected socket to ``unix:///path`` or ``[tcp://]host:port``; SandboxNotReachedError
    when nothing answers there (nothing was sent)."""
    try:
        if address.startswith("unix://"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(address.removeprefix("unix://"))
            except BaseException:
                sock.close()
                raise
        else:
            host, _, port = address.removeprefix("tcp://").rpartition(":")
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, ValueError) as error:
        raise SandboxNotReachedError(f"no sandbox answers at {address}: {error}") from None
    return sock


class Call:
    """A gRPC call on ``sock`` (which it owns: :meth:`close` it): ``method`` is its path, such as
    ``/package.Service/Method``; ``metadata`` goes with its headers."""

    def __init__(self, sock: socket.socket, authority: str, method: str, metadata: Sequence[tuple[str, str]],
                 *, max_message_bytes: int) -> None:
        self._sock = sock
        self._max_message_bytes = max_message_bytes
        self._decoder = hpack_codec.Decoder(MAX_HEADER_LIST_BYTES)
        self._headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", method.encode()),
                         (b":authority", authority.encode()), (b"content-type", b"application/grpc"),
                         (b"te", b"trailers"), *((key.encode(), value.encode()) for key, value in metadata)]
        self._received = bytearray(RECEIVE_BYTES)  # bytes read from the socket: those in [_start, _end) are unread
        self._start = self._end = 0
        self._send_window = self._connection_window = DEFAULT_WINDOW_BYTES
        self._peer_frame_bytes = DEFAULT_FRAME_BYTES
        self._peer_window = DEFAULT_WINDOW_BYTES  # a stream's initial window, as the server last set it
        self._unacknowledged = 0  # bytes received and not yet granted again
        self._answered = False  # the answer's headers arrived
        self._ended = False  # the server ended the stream
        self._block = bytearray()  # a header block received so far
        self._continuing = False  # CONTINUATION frames still extend it
        self._block_ends_stream = False
        self._trailers: hpack_codec.Headers | None = None
        self._data = bytearray()  # received bytes of messages not yet complete

    def close(self) -> None:
        self._sock.close()

    def settimeout(self, seconds: float | None) -> None:
        """How long a read may wait for the server (TimeoutError past it)."""
        self._sock.settimeout(seconds)

    def send(self, message: bytes) -> None:
        """Open the connection and the call, send ``message`` and end the request stream."""
        settings = b"".join(struct.pack(">HI", key, value) for key, value in (
            (SETTINGS_ENABLE_PUSH, 0), (SETTINGS_INITIAL_WINDOW_SIZE, WINDOW_BYTES),
            (SETTINGS_MAX_FRAME_SIZE, MAX_FRAME_BYTES), (SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST_BYTES)))
        block = hpack_codec.encode(self._headers)
        if len(block) > DEFAULT_FRAME_BYTES:
            raise ValueError(f"the call's headers take {len(block)} bytes; at most {DEFAULT_FRAME_BYTES} are sent")
        out = bytearray(PREFACE)
        out += _frame(SETTINGS, 0, 0, settings)
        out += _frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", WINDOW_BYTES - DEFAULT_WINDOW_BYTES))
        out += _frame(HEADERS, END_HEADERS, STREAM, block)
        body = memoryview(b"\0" + struct.pack(">I", len(message)) + message)
        while True:
            room = min(self._send_window, self._connection_window, self._peer_frame_bytes, len(body))
            if room > 0:
                out += _frame(DATA, END_STREAM if room == len(body) else 0, STREAM, body[:room])
                self._send_window -= room
                self._connection_window -= room
                body = body[room:]
            self._write(out)
            out.clear()
            if not body or self._ended:  # ended: the call failed early; its status tells why
                return
            self._read_frame()  # until the server grants more room

    def messages(self) -> Iterator[bytes]:
        """The answer's messages, in order; then the call's status is checked (raises unless OK)."""
        while True:
            while (message := self._next_message()) is None:
                if self._ended:
                    if self._data:
                        raise SandboxProtocolError("the sandbox ended the call inside a message")
                    self._check_status()
                    return
                self._read_frame()
            yield message

    # Receiving ---------------------------------------------------------------------------

    def _next_message(self) -> bytes | None:
        if len(self._data) < 5:
            return None
        compressed, length = struct.unpack_from(">BI", self._data)
        if compressed:
            raise SandboxProtocolError("the sandbox sent a compressed message, which was not asked for")
        if length > self._max_message_bytes:
            raise SandboxProtocolError(f"the sandbox sent a message of {length} bytes; at most "
                                       f"{self._max_message_bytes} are accepted")
        if len(self._data) < 5 + length:
            return None
        with memoryview(self._data) as data:
            message = bytes(data[5:5 + length])
        del self._data[:5 + length]
        return message

    def _read_frame(self) -> None:
        """Read one frame and act on it (its payload is a view of the receive buffer: a handler
        copies what it keeps)."""
        header = self._read(9)
        length, kind, flags = int.from_bytes(header[:3], "big"), header[3], header[4]
        stream = int.from_bytes(header[5:], "big") & MAX_WINDOW_BYTES
        if length > MAX_FRAME_BYTES:
            raise SandboxProtocolError(f"the sandbox sent a frame of {length} bytes; at most {MAX_FRAME_BYTES} "
                                       "are accepted")
        payload = self._read(length)
        if self._continuing and kind != CONTINUATION:
            raise SandboxProtocolError("the sandbox interrupted a header block")
        handler = self._HANDLERS.get(kind)
        if handler is None:
            raise SandboxProtocolError(f"the sandbox sent an HTTP/2 frame of unexpected type {kind}")
        handler(self, flags, stream, payload)

    def _on_data(self, flags: int, stream: int, payload: memoryview) -> None:
        self._grant(len(payload))
        if stream != STREAM or not self._answered or self._ended:
            raise SandboxProtocolError("the sandbox sent data outside its answer")
        self._data += _unpadded(flags, payload)  # taken apart (and checked) before the next frame is read
        if flags & END_STREAM:
            self._ended = True

    def _on_headers(self, flags: int, stream: int, payload: memoryview) -> None:
        if stream != STREAM or self._ended:
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
        self._ended = True

    def _on_reset(self, flags: int, stream: int, payload: memoryview) -> None:
        if len(payload) != 4 or stream != STREAM:
            raise SandboxProtocolError("the sandbox sent a malformed RST_STREAM frame")
        code = struct.unpack(">I", payload)[0]
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
        self._write(_frame(SETTINGS, ACK, 0, b""))

    def _on_ping(self, flags: int, stream: int, payload: memoryview) -> None:
        if stream or len(payload) != 8:
            raise SandboxProtocolError("the sandbox sent a malformed PING frame")
        if not flags & ACK:
            self._write(_frame(PING, ACK, 0, payload))

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

    def _on_priority(self, flags: int, stream: int, payload: memoryview) -> None:
        if len(payload) != 5:
            raise SandboxProtocolError("the sandbox sent a malformed PRIORITY frame")

    _HANDLERS = {DATA: _on_data, HEADERS: _on_headers, CONTINUATION: _on_continuation, RST_STREAM: _on_reset,
                 SETTINGS: _on_settings, PING: _on_ping, GOAWAY: _on_goaway, WINDOW_UPDATE: _on_window_update,
                 PRIORITY: _on_priority}

    def _grant(self, received: int) -> None:
        """Give the server back the room ``received`` bytes took, half a window at a time."""
        self._unacknowledged += received
        if self._unacknowledged >= WINDOW_BYTES // 2:
            grant = struct.pack(">I", self._unacknowledged)
            self._write(_frame(WINDOW_UPDATE, 0, 0, grant) + (b"" if self._ended else
                                                              _frame(WINDOW_UPDATE, 0, STREAM, grant)))
            self._unacknowledged = 0

    def _check_status(self) -> None:
        trailers = self._trailers or []
        fields = dict(trailers)
        status = fields.get(b"grpc-status")
        if status == b"0":
            return
        if status is None or not status.isdigit():
            raise SandboxProtocolError("the sandbox ended the call without a valid status")
        from urllib.parse import unquote_to_bytes

        import grpc

        from protolink.wire.status import from_status

        code = next((code for code in grpc.StatusCode if code.value[0] == int(status)), grpc.StatusCode.UNKNOWN)
        details = unquote_to_bytes(fields.get(b"grpc-message", b"")).decode(errors="replace")
        error = from_status(code, details, _metadata(trailers))
        if isinstance(error, SandboxNotReachedError):  # said by a server this call reached: not one to repeat
            raise SandboxUnavailableError(str(error))
        raise error

    # The socket --------------------------------------------------------------------------

    def _read(self, count: int) -> memoryview:
        """The next ``count`` bytes received: a view of the receive buffer, valid until the next
        read (which may move or overwrite what it shows)."""
        while self._end - self._start < count:
            if len(self._received) - self._start < count:
                self._make_room(count)
            try:
                with memoryview(self._received) as free:
                    received = self._sock.recv_into(free[self._end:])
            except TimeoutError:
                raise  # the caller's deadlines say what it means
            except OSError as error:
                raise SandboxUnavailableError(f"the connection to the sandbox failed: {error}") from None
            if not received:
                raise SandboxUnavailableError("the sandbox closed the connection")
            self._end += received
        with memoryview(self._received) as received_bytes:
            data = received_bytes[self._start:self._start + count]
        self._start += count
        return data

    def _make_room(self, count: int) -> None:
        """Move the unread bytes to the front of the receive buffer, in a larger one when
        ``count`` bytes would not fit (no view of it may be held: see :meth:`_read`)."""
        unread = self._received[self._start:self._end]
        if len(self._received) < count:
            self._received = bytearray(count + RECEIVE_BYTES)
        self._received[:len(unread)] = unread
        self._start, self._end = 0, len(unread)

    def _write(self, data: bytes | bytearray) -> None:
        try:
            self._sock.sendall(data)
        except TimeoutError:
            raise  # the caller's deadlines say what it means
        except OSError as error:
            raise SandboxUnavailableError(f"the connection to the sandbox failed: {error}") from None


def _frame(kind: int, flags: int, stream: int, payload: bytes | bytearray | memoryview) -> bytes:
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
