"""Send buffers of the server's Unix socket connections, enlarged so output leaves in few writes.

A Unix stream socket queues at most its send buffer (``net.core.wmem_default``, 208 KiB here)
for the peer to read; a mebibyte of output then crosses in five writes, each after the
client has read the last: five wakeups of each side and of gRPC's threads, and on one CPU
the server waiting for the client. gRPC offers Python no hook on the sockets it accepts, so
:func:`enlarge_send_buffers` finds them among the process's descriptors: Unix stream sockets
whose own address is the server's listening path (gRPC binds ``unix:///run/x`` as
``///run/x``). The HTTP/2 window still bounds what the server may send; this moves what
waits from gRPC's buffers into the kernel's.
"""

from __future__ import annotations

import contextlib
import os
import socket

#: The send buffer asked for. Linux grants up to ``net.core.wmem_max`` (its default is 208 KiB,
#: where this does nothing; 4 MiB on the hosts measured) and counts twice what it grants.
SEND_BUFFER_BYTES = 4 << 20
#: An event at least this large would not fit the usual send buffer at once.
LARGE_EVENT_BYTES = 256 * 1024


def enlarge_send_buffers(path: str) -> None:
    """Give every connection accepted on the Unix socket ``path`` a send buffer of
    SEND_BUFFER_BYTES (less where the system's limit is lower; a socket that refuses keeps its
    own). It looks at every open descriptor: about 10 us each."""
    wanted = os.path.normpath(os.fsencode(path))
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # not a socket, or closed meanwhile
            connection = socket.socket(fileno=int(name))
            try:
                if (connection.family == socket.AF_UNIX and connection.type == socket.SOCK_STREAM
                        and os.path.normpath(os.fsencode(connection.getsockname())) == wanted
                        and not connection.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                        and connection.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) < SEND_BUFFER_BYTES):
                    connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            finally:
                connection.detach()
