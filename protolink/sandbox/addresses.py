"""A sandbox server's (or the sandbox service's) address: ``unix:///path`` (a socket on this host) or
``[tcp://]host:port``.

Standard library only: the ``exec`` path, which is timed, uses it.
"""

from __future__ import annotations

import os

_UNIX = "unix://"


def socket_path(address: str) -> str | None:
    """The path of the Unix socket ``address`` names (``unix:///path``); None for TCP."""
    return address.removeprefix(_UNIX) if address.startswith(_UNIX) else None


def grpc_target(address: str) -> str:
    """``address`` as grpcio takes it: ``unix:///path`` as it is, ``host:port`` without ``tcp://``."""
    return address.removeprefix("tcp://")


def socket_gone(address: str) -> bool:
    """Whether ``address`` is a Unix socket's whose file is not there: nothing can answer at it."""
    path = socket_path(address)
    return path is not None and not os.path.exists(path)
