"""Host processes that outlive the command which starts them: the sandbox service, an appliance's
egress daemon.

:func:`spawn` starts one in its own session (stdin closed, its messages in a private log) and
:func:`wait_ready` waits until it answers. Once it runs it writes a pid record (``{"pid": ...,
"owner": ...}``, the owner from :func:`~protolink.sandbox.leftovers.process_owner`);
:func:`running` reads it back and :func:`end` signals only the process it names while that
process is the one that wrote it, never one that merely reuses the pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from protolink.errors import SandboxError, SandboxUnavailableError

from .leftovers import owner_gone

T = TypeVar("T")

POLL_SECONDS = 0.02
TAIL_LINES = 20


def spawn(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` detached: its own session, stdin closed, cwd ``/``, its output in ``log``
    (0600, emptied first; a symbolic link there is refused)."""
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, cwd="/",
                                start_new_session=True)
    finally:
        os.close(log_fd)


async def wait_ready(process: subprocess.Popen[bytes], ready: Callable[[], Awaitable[T | None]], *, what: str,
                     log: Path, timeout: float, ended: type[Exception] = SandboxError,
                     late: type[Exception] = SandboxUnavailableError) -> T:
    """The first answer of ``ready()`` that is not None, asked until then. ``ended`` when
    ``process`` ends first; ``late`` when ``timeout`` seconds pass (and the process is killed).
    Both name ``what`` and end with the end of its ``log``."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise ended(f"{what} ended as it started (exit {process.returncode}):\n{tail(log)}")
        if (answer := await ready()) is not None:
            return answer
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise late(f"{what} did not answer within {timeout:g} s:\n{tail(log)}")
        await asyncio.sleep(POLL_SECONDS)


def running(pid_file: Path) -> dict[str, Any] | None:
    """The pid record in ``pid_file`` while the process that wrote it runs; None otherwise."""
    try:
        record = json.loads(pid_file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return None
    owner = record.get("owner")
    return record if isinstance(owner, str) and owner and not owner_gone(owner) else None


async def gone(record: dict[str, Any], timeout: float) -> bool:
    """Whether the process of pid ``record`` ends within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not owner_gone(record["owner"]):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL_SECONDS)
    return True


async def end(record: dict[str, Any], *, timeout: float) -> None:
    """End the process of pid ``record`` (from :func:`running`): SIGTERM, then SIGKILL when it
    still runs ``timeout`` seconds later; each only while it is the process that wrote it."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        if owner_gone(record["owner"]):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(record["pid"], signum)
        if await gone(record, timeout):
            return


def tail(log: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` of ``log``, or why it cannot be read."""
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as error:
        return f"(its log {log} cannot be read: {error})"
