"""Messages with descriptors attached (``SCM_RIGHTS``) on a Unix socket: the egress relay's
sockets and a command's output pipes, passed on to the host."""

from __future__ import annotations

import array
import socket
from collections.abc import Sequence

from .readiness import ready

_INT = array.array("i")


def rights(fds: Sequence[int]) -> list[tuple[int, int, bytes]]:
    """The ancillary data that passes ``fds`` (``SCM_RIGHTS``); none for none."""
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []


def receive(sock: socket.socket, size: int, max_fds: int) -> tuple[bytes, list[int], int]:
    """One message of at most ``size`` bytes, the descriptors attached (room for ``max_fds``; the
    kernel closes any beyond and sets ``MSG_CTRUNC``), close-on-exec, and ``recvmsg``'s flags.
    BlockingIOError when no message waits on the non-blocking ``sock``."""
    data, ancillary, flags, _ = sock.recvmsg(size, socket.CMSG_SPACE(max_fds * _INT.itemsize),
                                             socket.MSG_CMSG_CLOEXEC)
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % _INT.itemsize])
    return data, list(fds), flags


async def receive_next(sock: socket.socket, size: int, max_fds: int) -> tuple[bytes, list[int], int]:
    """:func:`receive`, once a message waits (or the socket has closed: ``b""``)."""
    while True:
        try:
            return receive(sock, size, max_fds)
        except BlockingIOError:
            await ready(read=(sock.fileno(),))


async def send_next(sock: socket.socket, parts: Sequence[bytes], fds: Sequence[int] = ()) -> None:
    """Send one message of ``parts``, ``fds`` attached, on the non-blocking ``sock``, waiting
    while its peer's side is full (back-pressure). OSError once the peer has gone."""
    while True:
        try:
            sock.sendmsg(parts, rights(fds), socket.MSG_DONTWAIT)
            return
        except BlockingIOError:
            await ready(write=(sock.fileno(),))
