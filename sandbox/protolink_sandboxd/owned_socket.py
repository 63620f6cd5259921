"""Unix sockets created by the owner of their directory, owner-only.

The server's sockets live in the runtime directory the host mounts: a directory of the host
user's that only its owner can open. The server (uid 0 without ``CAP_DAC_OVERRIDE``) could not
create anything there when that owner is not root, and a socket the command user could open
would let a command talk to the server as the host does. So each socket is bound with the
directory owner's effective ids (:func:`~protolink_sandboxd.privileges.acting_as`) and made
owner-only; a directory that belongs to the command user is refused.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable

from .privileges import acting_as


def bind_as_directory_owner(path: str, command_uid: int, bind: Callable[[], object]) -> None:
    """Run ``bind()``, which creates the Unix socket at ``path``, as the owner of its directory,
    then make the socket owner-only. SystemExit when the directory belongs to ``command_uid``."""
    directory = os.path.dirname(path)
    owner = os.stat(directory)
    if owner.st_uid == command_uid:
        raise SystemExit(f"the socket directory {directory} belongs to the command user")
    with acting_as(owner.st_uid, owner.st_gid):
        bind()
        # gVisor: a socket on a host mount refuses chmod; the host's owner-only directory
        # around it is what keeps others out.
        with contextlib.suppress(PermissionError):
            os.chmod(path, 0o600)


def unix_listener(path: str, command_uid: int, backlog: int,
                  kind: socket.SocketKind = socket.SOCK_SEQPACKET) -> socket.socket:
    """A non-blocking Unix socket of ``kind`` listening at ``path`` (any socket left there by an
    earlier server replaced), bound by :func:`bind_as_directory_owner`."""
    listener = socket.socket(socket.AF_UNIX, kind)
    try:
        def bind() -> None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            listener.bind(path)

        bind_as_directory_owner(path, command_uid, bind)
        listener.listen(backlog)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        raise
    return listener
