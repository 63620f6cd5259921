"""The server's Unix socket connections get a send buffer large enough for an output event."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from protolink_sandboxd.send_buffers import SEND_BUFFER_BYTES, enlarge_send_buffers


def _send_buffer(connection: socket.socket) -> int:
    return connection.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for opened_socket in opened:
        opened_socket.close()


def _listen_and_accept(address: str, opened: list[socket.socket]) -> tuple[socket.socket, socket.socket, socket.socket]:
    """A listener bound to ``address``, a client connected to it and the connection it accepted."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    opened.append(listener)
    listener.bind(address)
    listener.listen()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    opened.append(client)
    client.connect(address)
    accepted, _ = listener.accept()
    opened.append(accepted)
    return listener, client, accepted


def test_connections_accepted_on_the_servers_path_get_the_larger_buffer(tmp_path: Path, sockets: list[socket.socket]):
    path = str(tmp_path / "sandbox.sock")
    # gRPC binds unix:///PATH as "///PATH": the connections' own address is written so.
    listener, client, accepted = _listen_and_accept("//" + path, sockets)
    _, other_client, other_accepted = _listen_and_accept(str(tmp_path / "other.sock"), sockets)
    default = _send_buffer(other_accepted)
    wmem_max = int(Path("/proc/sys/net/core/wmem_max").read_text())

    enlarge_send_buffers(path)

    assert _send_buffer(accepted) == 2 * min(SEND_BUFFER_BYTES, wmem_max) > default  # Linux counts twice
    assert _send_buffer(listener) == _send_buffer(client) == default
    assert _send_buffer(other_accepted) == _send_buffer(other_client) == default
    accepted.sendall(b"still usable")
    assert client.recv(64) == b"still usable"
