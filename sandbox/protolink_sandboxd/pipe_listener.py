"""The pipe listener: commands' output pipes handed to the host (:mod:`protolink.wire.pipe_passing`).

A command's output read here crosses this server, gRPC and the socket, each a copy and a few
wakeups on the sandbox's CPU, which the commands share. Where the host asks for it, the read
ends of a command's pipes go to the host instead, and the host reads them as it reads its own
commands' (:class:`protolink.execution.output_pipes.OutputPipes`): the output never passes
through this process. This server keeps the supervision (start, timeout, group kill, exit) and,
once a hand-off is sent, no copy of the read ends.

The socket is created by the owner of the socket directory, as the server's own, so commands
cannot open it. A connection is greeted with its key and a pipe's read end (the proof that the
kernel passes descriptors to the host); a connection that cannot take it is closed and the host
keeps the output on gRPC. At most ``max_connections`` connections are held (more are closed at
once); a hand-off that would wait (the host does not read its connection) is not made, and that
command's output goes over gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket

from protolink.wire.pipe_passing import HANDOFF, KEY_BYTES, SOCKET_NAME

from .config import ServerConfig
from .privileges import acting_as
from .spawner_client import descriptor_rights

log = logging.getLogger("sandbox")


class PipeListener:
    """Listens on :data:`~protolink.wire.pipe_passing.SOCKET_NAME` in ``directory`` and hands
    output pipes to the connections there, by key."""

    def __init__(self, directory: str, *, command_uid: int, max_connections: int) -> None:
        self._path = os.path.join(directory, SOCKET_NAME)
        self._max_connections = max_connections
        self._connections: dict[bytes, socket.socket] = {}
        self._loop = asyncio.get_running_loop()
        self._listener = _bind(self._path, command_uid, max_connections)
        self._loop.add_reader(self._listener.fileno(), self._accept)

    @classmethod
    def beside(cls, config: ServerConfig) -> PipeListener | None:
        """The listener beside the server's Unix socket; None for a TCP server (not this host's)."""
        if config.tcp:
            return None
        return cls(os.path.dirname(config.address.removeprefix("unix://")), command_uid=config.command_uid,
                   max_connections=config.max_concurrency)

    def hand_off(self, key: bytes, request_id: int, stdout: int, stderr: int) -> bool:
        """Send the read ends ``stdout`` and ``stderr`` of request ``request_id`` on the
        connection of ``key``: True once sent (the caller then closes its copies); False when
        there is no such connection or it cannot take them now."""
        connection = self._connections.get(key)
        if connection is None:
            return False
        try:
            connection.sendmsg([HANDOFF.pack(request_id)], descriptor_rights((stdout, stderr)), socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            self._drop(key)
            return False
        return True

    def close(self) -> None:
        """Stop listening and close every connection."""
        self._loop.remove_reader(self._listener.fileno())
        self._listener.close()
        for key in list(self._connections):
            self._drop(key)

    def _accept(self) -> None:
        try:
            connection, _ = self._listener.accept()
        except (BlockingIOError, ConnectionAbortedError):
            return
        key = secrets.token_bytes(KEY_BYTES)
        if len(self._connections) >= self._max_connections or not _greet(connection, key):
            connection.close()
            return
        self._connections[key] = connection
        # The host sends nothing: readable means it closed the connection.
        self._loop.add_reader(connection.fileno(), self._drop, key)

    def _drop(self, key: bytes) -> None:
        connection = self._connections.pop(key)
        self._loop.remove_reader(connection.fileno())
        connection.close()


def _bind(path: str, command_uid: int, backlog: int) -> socket.socket:
    """The listening socket at ``path``, bound by the owner of its directory, owner-only."""
    owner = os.stat(os.path.dirname(path))
    if owner.st_uid == command_uid:
        raise SystemExit(f"the pipe socket's directory {os.path.dirname(path)} belongs to the command user")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        with acting_as(owner.st_uid, owner.st_gid):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            listener.bind(path)
            with contextlib.suppress(PermissionError):  # gVisor: see server._listen
                os.chmod(path, 0o600)
        listener.listen(backlog)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        raise
    return listener


def _greet(connection: socket.socket, key: bytes) -> bool:
    """Send ``key`` with a pipe's read end attached: False when the kernel refuses (the host
    then keeps every command's output on gRPC)."""
    read, write = os.pipe()
    try:
        connection.sendmsg([key], descriptor_rights((read,)), socket.MSG_DONTWAIT)
    except OSError as error:
        log.info("pipes: the kernel does not pass descriptors to the host (%s); output stays on gRPC", error)
        return False
    finally:
        os.close(read)
        os.close(write)
    connection.setblocking(False)
    return True

