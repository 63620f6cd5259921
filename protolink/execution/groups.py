"""POSIX process-group cleanup shared by every runner: signal the group, grace, kill, reap.

A command starts as the leader of its own session and process group (``start_new_session``),
so its ordinary descendants share the group id and die with it. Descendants that create their
own session escape; nothing here can reach them.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable
from typing import Any

#: How long a group gets to exit after SIGTERM before SIGKILL.
TERMINATE_GRACE_SECONDS = 1.0
#: How long to wait for the kernel to report the leader dead after SIGKILL.
REAP_WAIT_SECONDS = 5.0


def signal_group(pgid: int, signum: int) -> None:
    """Send ``signum`` to process group ``pgid``; a group that is already gone is fine."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        # ESRCH: every member has exited. EPERM: the only members left changed credentials
        # (setuid programs); they are beyond this process's reach either way.
        pass


async def terminate_group(pgid: int, exited: Awaitable[object]) -> None:
    """SIGTERM the group, wait a short grace for its leader, SIGKILL the group, then reap.

    ``exited`` completes when the leader has been reaped; waiting never cancels it. Returns
    after :data:`REAP_WAIT_SECONDS` even if the kernel never reports the leader dead.
    """
    exited = asyncio.ensure_future(exited)
    signal_group(pgid, signal.SIGTERM)
    await completed_within(exited, TERMINATE_GRACE_SECONDS)
    signal_group(pgid, signal.SIGKILL)
    await completed_within(exited, REAP_WAIT_SECONDS)


async def completed_within(future: asyncio.Future[Any], seconds: float) -> bool:
    """Wait up to ``seconds`` for ``future`` without canceling it; whether it is done."""
    if not future.done():
        await asyncio.wait((future,), timeout=seconds)
    return future.done()
