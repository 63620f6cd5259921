"""The local command channel as both sides speak it: Execute on a sandbox on this host, without
gRPC, and a command's output pipes passed to the host.

The host connects to :data:`SOCKET_NAME` beside the server's Unix socket (a ``SOCK_SEQPACKET``
socket: each datagram arrives whole, in order). The server greets each connection with
:data:`GREETING` and its key (:data:`KEY_BYTES` random bytes) and, attached (``SCM_RIGHTS``), the read end of a pipe of its
own: the proof that the kernel passes its descriptors to this host (gVisor's cannot); a server at its
limit of connections answers :data:`AT_LIMIT` instead. The host
then sends :data:`AUTHORIZATION` and the authorization metadata it would send on gRPC (checked
when the server has a token), then one serialized ``ExecuteRequest`` a datagram: the requests of
one Execute call, which the connection is. The server answers with datagrams that start with
their kind:

- :data:`EVENT`: one serialized ``ExecuteEvent``, as the Execute stream carries it;
- :data:`HANDOFF`: a request that named the connection's key (``pipe_connection``) has its
  process's stdout and stderr read ends attached, in that order, before its ``Finished``
  (which then says ``output_passed``);
- :data:`FAILURE`: a serialized ``protolink.wire.Error``: what ended the call, as a gRPC
  Execute call's status says it; the connection then closes;
- :data:`PONG`: the answer to the host's :data:`PING`, which it sends every
  :data:`~protolink.wire.keepalive.PING_SECONDS` while the call is open (between requests):
  either side gives up on a peer that stays silent, as gRPC's keepalives do.

Closing the connection is canceling the call: the server kills and reaps its processes. No
datagram exceeds :data:`DATAGRAM_BYTES`: a larger request goes on gRPC; the server splits a
larger output event.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
from collections.abc import Iterator, Mapping, Sequence

from protolink.net.descriptors import rights

from .output_events import MAX_HEAD_BYTES, output_event, read_output_event

log = logging.getLogger(__name__)

#: The channel's socket in the server's socket directory.
SOCKET_NAME = "pipes.sock"
#: The length of a connection's key.
KEY_BYTES = 16
#: What a greeting starts with, the key after it: this protocol and its version (a server whose
#: greeting is another, an older one that only passed pipes, is not offering it).
GREETING = b"protolink-commands/1:"
#: A server at its limit of connections answers a new one with this alone (no key, no
#: descriptor), then closes it: that call goes on gRPC, the next asks again.
AT_LIMIT = b"protolink-commands/1 at its limit"
#: The most bytes in one datagram, either way (the default send buffer of a Unix socket holds it).
DATAGRAM_BYTES = 128 * 1024
#: The host's first datagram: this, then its authorization metadata (``Bearer <token>``, or
#: nothing), then each other metadata entry of its call on a line of its own (``key:value``: the
#: sandbox a service's client names); see :func:`first_datagram`.
AUTHORIZATION = b"authorization:"
#: The kind of a datagram from the server (its first byte).
EVENT = b"e"
FAILURE = b"x"
PONG = b"p"
#: The host's keepalive (no ExecuteRequest serializes to it: field 13, wire type 7, is invalid).
PING = b"\x6f"
#: A host that sends nothing, its pings included, for this long is gone: the server ends its call
#: (as its gRPC keepalive, a ping every 20 s and 10 s for the answer, would).
HOST_SILENT_SECONDS = 30.0
#: A hand-off: its kind and the id of the request whose stdout and stderr read ends are attached.
HANDOFF = struct.Struct("!cQ")
HANDOFF_KIND = b"h"
#: Descriptors a hand-off carries: stdout's read end, then stderr's.
HANDED_FDS = 2


def first_datagram(metadata: Sequence[tuple[str, str]]) -> bytes:
    """The host's first datagram on a connection whose calls carry ``metadata``."""
    entries = dict(metadata)
    lines = [AUTHORIZATION + entries.pop("authorization", "").encode()]
    lines += [f"{key}:{value}".encode() for key, value in entries.items()]
    return b"\n".join(lines)


def read_first_datagram(first: bytes) -> Mapping[str, str] | None:
    """The metadata of a host's first datagram (``authorization`` among them); None when it is
    not one."""
    if not first.startswith(AUTHORIZATION):
        return None
    metadata: dict[str, str] = {}
    try:
        for line in first.decode().split("\n"):
            key, colon, value = line.partition(":")
            if not colon or key in metadata:
                return None
            metadata[key] = value
    except UnicodeDecodeError:
        return None
    return metadata


def accept_greeted(listener: socket.socket, *, at_limit: bool) -> tuple[socket.socket, bytes] | None:
    """Take the next connection waiting on ``listener`` and greet it: the connection, made
    non-blocking, and its key. None when ``at_limit`` (it is answered :data:`AT_LIMIT` and closed)
    or when the kernel refuses to pass the greeting's descriptor (gVisor's; it is closed).
    BlockingIOError when none waits. The greeting's pipe is made before the connection is taken:
    a process out of descriptors raises OSError and the connection waits in the backlog, rather
    than being taken and closed for want of a pipe."""
    read, write = os.pipe()
    try:
        connection, _ = listener.accept()
        if at_limit:
            with contextlib.suppress(OSError):
                connection.sendmsg([AT_LIMIT], [], socket.MSG_DONTWAIT)
            connection.close()
            return None
        key = os.urandom(KEY_BYTES)  # secrets would load random and base64 at start
        try:
            connection.sendmsg([GREETING, key], rights((read,)), socket.MSG_DONTWAIT)
        except OSError as error:
            log.info("command channel: the kernel does not pass descriptors (%s); calls stay on gRPC", error)
            connection.close()
            return None
    finally:
        os.close(read)
        os.close(write)
    connection.setblocking(False)
    return connection, key


def close_connection(connection: socket.socket) -> None:
    """Close ``connection`` after reading (and dropping) what its peer sent that was not read:
    closed with datagrams unread, the peer's next read would fail (ECONNRESET) before the
    :data:`FAILURE` sent ahead of them."""
    with contextlib.suppress(OSError):
        while connection.recv(DATAGRAM_BYTES, socket.MSG_DONTWAIT):
            pass
    connection.close()


def event_datagrams(event: bytes) -> Iterator[bytes]:
    """``event`` as the payloads of :data:`EVENT` datagrams of at most DATAGRAM_BYTES: an output
    event larger than that as several output events of its bytes in order (any other event is
    far smaller)."""
    room = DATAGRAM_BYTES - len(EVENT) - MAX_HEAD_BYTES
    output = read_output_event(event) if len(event) > room else None
    if output is None:
        yield event
        return
    for start in range(0, len(output.data), room):
        yield output_event(output.id, output.channel, output.data[start:start + room])
