"""Kills processes of the command user that no running command or worker accounts for.

Every command and every worker is a direct child of the server and leads its own session and
process group. Any process of the command uid outside the groups those children lead is a
stray: a daemon that called setsid, double-forked or outlived its command. Strays are killed
after each command and every :data:`INTERVAL_SECONDS` while commands run. The host backend
cannot do this (other processes of the user are not its own); inside the sandbox the command
uid is ours alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator
from typing import NamedTuple

INTERVAL_SECONDS = 0.5


class _Process(NamedTuple):
    pid: int
    ppid: int
    pgrp: int
    uids: frozenset[int]


class StrayReaper:
    """Sweeps strays of ``uid`` while commands run and once after each command."""

    def __init__(self, uid: int) -> None:
        self._uid = uid
        self._running = 0
        self._ticker: asyncio.Task[None] | None = None
        self._current: asyncio.Future[int] | None = None
        self._queued: asyncio.Future[int] | None = None

    @contextlib.asynccontextmanager
    async def command(self) -> AsyncIterator[None]:
        """Hold while a command runs; on exit, its strays (and any other) are dead."""
        self._running += 1
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.create_task(self._tick())
        try:
            yield
        finally:
            self._running -= 1
            await asyncio.shield(self.sweep())

    def sweep(self) -> asyncio.Future[int]:
        """A sweep that starts after this call (callers until it starts share it); how many it killed."""
        if self._queued is None:
            self._queued = asyncio.ensure_future(self._sweep_after(self._current))
        return self._queued

    async def _sweep_after(self, previous: asyncio.Future[int] | None) -> int:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        self._current, self._queued = self._queued, None
        return await asyncio.to_thread(kill_strays, self._uid, os.getpid())

    async def _tick(self) -> None:
        while self._running:
            await asyncio.sleep(INTERVAL_SECONDS)
            await self.sweep()


def kill_strays(uid: int, server: int, *, spare_children: bool = True) -> int:
    """SIGKILL every process of ``uid`` outside the groups led by ``server``'s children.

    With ``spare_children`` false (at shutdown), every process of ``uid`` dies. Returns how
    many were signalled.
    """
    processes = list(_processes())
    groups = {p.pid for p in processes if p.ppid == server and p.pgrp == p.pid} if spare_children else set()
    killed = 0
    for candidate in processes:
        if uid in candidate.uids and candidate.pgrp not in groups:
            killed += _kill_if_still(candidate, uid, groups)
    return killed


def _kill_if_still(candidate: _Process, uid: int, groups: set[int]) -> int:
    # The pidfd pins the process: if the pid was reused meanwhile, /proc now describes the
    # new process and the check below applies to the process the signal would reach.
    try:
        pidfd = os.pidfd_open(candidate.pid)
    except OSError:
        return 0
    try:
        current = _read(candidate.pid)
        if current is None or uid not in current.uids or current.pgrp in groups:
            return 0
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return 1
    except ProcessLookupError:
        return 0
    finally:
        os.close(pidfd)


def _processes() -> Iterator[_Process]:
    for name in os.listdir("/proc"):
        if name.isdigit() and (process := _read(int(name))) is not None:
            yield process


def _read(pid: int) -> _Process | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            stat = stat_file.read()
        with open(f"/proc/{pid}/status", "rb") as status_file:
            status = status_file.read()
    except OSError:
        return None  # gone, or a kernel thread we may not read
    fields = stat[stat.rindex(b")") + 2 :].split()  # the command name may hold spaces and ')'
    for line in status.splitlines():
        if line.startswith(b"Uid:"):
            uids = frozenset(int(value) for value in line.split()[1:])
            return _Process(pid, int(fields[1]), int(fields[2]), uids)
    return None
