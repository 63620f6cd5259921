"""A sandbox server's address: ``unix:///path`` (a socket on this host) or ``[tcp://]host:port``.

Standard library only: the ``exec`` path, which is timed, uses it.
"""

from __future__ import annotations

import os


def socket_gone(address: str) -> bool:
    """Whether ``address`` is a Unix socket's whose file is not there: nothing can answer at it."""
    return address.startswith("unix://") and not os.path.exists(address.removeprefix("unix://"))
