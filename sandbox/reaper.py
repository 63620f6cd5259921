"""Kills processes of the command user that no running command or worker accounts for.

Every worker and the spawner are children of the server, every command a child of the spawner,
and each leads its own session and process group. Any process of the command uid outside the
groups those children lead is a stray: a daemon that called setsid, double-forked or outlived
its command. Strays are killed after each command and every :data:`INTERVAL_SECONDS` while
commands run. The host backend cannot do this (other processes of the user are not its own);
inside the sandbox the command uid is ours alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable, Collection, Iterator
from typing import NamedTuple

INTERVAL_SECONDS = 0.5
#: Sweeps of /proc in one kill_strays call, at most (each signals what the previous missed).
MAX_PASSES = 100
#: Processes started since the last look that a quick look checks one by one, at most.
NEW_PIDS_CHECKED = 8


class _Process(NamedTuple):
    pid: int
    ppid: int
    pgrp: int
    uids: frozenset[int]


class StrayReaper:
    """Sweeps strays of ``uid`` while commands run and once after each command.

    ``spawner`` gives the spawner's pid (None while there is none): its children are commands.
    ``workers`` gives the pids of the server's workers.
    """

    def __init__(self, uid: int, spawner: Callable[[], int | None], workers: Callable[[], Collection[int]]) -> None:
        self._uid = uid
        self._spawner = spawner
        self._workers = workers
        self._running = 0
        self._ticker: asyncio.Task[None] | None = None
        self._current: asyncio.Future[int] | None = None
        self._queued: asyncio.Future[int] | None = None
        # A thread of its own, started now: when strays have filled the pids limit, no new
        # thread can start, and that is when sweeps matter most.
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="protolink-strays")
        self._pids = _PidCounter(lambda: self._thread.submit(threading.get_native_id).result())
        #: The last pid handed out at a moment /proc listed only the server's own processes.
        self._quiet: int | None = None

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
            if not self._idle_and_clean():
                await asyncio.shield(self.sweep())

    def sweep(self) -> asyncio.Future[int]:
        """A sweep that starts after this call (callers until it starts share it); how many it killed."""
        if self._queued is None:
            self._queued = asyncio.ensure_future(self._sweep_after(self._current))
        return self._queued

    def _idle_and_clean(self) -> bool:
        """No sweep is under way and one look at /proc, now, finds no stray (nearly always).

        Quickest: nothing but the server's own processes was left at the last look, and every
        process started since is gone (:meth:`_none_left_since_quiet`). Next: /proc lists only
        the server's own processes (:func:`_only_ours`). Either needs no process's status.
        """
        if self._queued is not None or (self._current is not None and not self._current.done()):
            return False
        if self._none_left_since_quiet():
            return True
        last = self._pids.last()
        if _only_ours(self._spawner(), self._workers()):
            self._quiet = last  # read before the listing: a process started after it is checked later
            return True
        self._quiet = None
        return not _strays(self._uid, self._parents())[1]

    def _none_left_since_quiet(self) -> bool:
        """Whether every process started since the quiet moment is gone (a process that existed
        then was the server's own), with no process started while this looked."""
        if self._quiet is None or (last := self._pids.last()) is None:
            return False
        if not 0 <= last - self._quiet <= NEW_PIDS_CHECKED:
            return False
        # A zombie, or any thread's id, is still there. A process that forked and exited while
        # this looked handed out a pid: the second reading differs.
        if any(os.path.exists(f"/proc/{pid}") for pid in range(self._quiet + 1, last + 1)):
            return False
        if self._pids.last() != last:
            return False
        self._quiet = last
        return True

    def _parents(self) -> set[int]:
        parents = {os.getpid()}
        if (spawner := self._spawner()) is not None:
            parents.add(spawner)
        return parents

    async def _sweep_after(self, previous: asyncio.Future[int] | None) -> int:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        self._current, self._queued = self._queued, None
        return await asyncio.get_running_loop().run_in_executor(self._thread, kill_strays, self._uid, self._parents())

    async def _tick(self) -> None:
        """Sweep every :data:`INTERVAL_SECONDS` until a wake finds no command running."""
        while True:
            await asyncio.sleep(INTERVAL_SECONDS)
            if not self._running:
                return
            await self.sweep()


def kill_strays(uid: int, parents: Collection[int]) -> int:
    """SIGKILL every process of ``uid`` outside the groups led by children of ``parents``.

    With no ``parents`` (at shutdown), every process of ``uid`` dies. Strays may
    fork while they are being killed (a fork bomb that calls setsid), so passes repeat until
    one finds no stray it has not signalled yet. Returns how many were signalled.
    """
    signalled: set[int] = set()
    for _ in range(MAX_PASSES):
        groups, strays = _strays(uid, parents, signalled)
        if not strays:
            break
        signalled.update(p.pid for p in strays if _kill_if_still(p, uid, groups))
    return len(signalled)


def _strays(uid: int, parents: Collection[int], known: Collection[int] = ()) -> tuple[set[int], list[_Process]]:
    """One look at /proc: the groups led by children of ``parents``, and the processes of
    ``uid`` outside them that are not ``known`` already."""
    processes = list(_processes())
    groups = {p.pid for p in processes if p.ppid in parents and p.pgrp == p.pid}
    return groups, [p for p in processes if uid in p.uids and p.pgrp not in groups and p.pid not in known]


def _only_ours(spawner: int | None, workers: Collection[int]) -> bool:
    """Whether /proc lists nothing but this server, its ancestors (the container's init
    processes) and the spawner and workers, each still this server's unreaped child.

    Listed first, checked after: a child that was not yet reaped when checked was that same
    process when listed (a pid is free for reuse only once its process has been reaped).
    """
    listed = {int(name) for name in os.listdir("/proc") if name.isdigit()}
    ours = {1, os.getppid(), os.getpid()} - {0}  # no parent in this pid namespace: 0
    ours.update(pid for pid in [spawner, *workers] if pid is not None and _unreaped_child(pid))
    return listed == ours


class _PidCounter:
    """The last pid handed out in this pid namespace: the last field of /proc/loadavg.

    Trusted only if it counts: ``start`` starts a thread or process and returns its id, which
    must be new between two readings (gVisor's reads "0" always).
    """

    def __init__(self, start: Callable[[], int]) -> None:
        try:
            self._fd: int | None = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = None
        before = self.last()
        started = start()
        after = self.last()
        if self._fd is not None and (before is None or after is None or not before < started <= after):
            os.close(self._fd)
            self._fd = None

    def last(self) -> int | None:
        """None where the kernel does not tell (then no look is quick)."""
        if self._fd is None:
            return None
        try:
            last = os.pread(self._fd, 256, 0).split()[-1]
        except (OSError, IndexError):
            return None
        return int(last) if last.isdigit() else None


def _unreaped_child(pid: int) -> bool:
    """``pid`` is a child of this process that has not been reaped (running, or a zombie)."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except OSError:
        return False  # not our child, or no longer: the pid may belong to anyone now
    return True


def _kill_if_still(candidate: _Process, uid: int, groups: set[int]) -> int:
    # The pidfd pins the process: if the pid was reused meanwhile, /proc now describes the
    # new process and the check below applies to the process the signal would reach.
    # gVisor has no pidfds (ENOSYS): there the check and the kill are two calls, and only a
    # pid reused between them could be missed or hit (gVisor hands pids out in sequence).
    pidfd: int | None = None
    try:
        pidfd = os.pidfd_open(candidate.pid)
    except OSError as error:
        if error.errno != errno.ENOSYS:
            return 0
    try:
        current = _read(candidate.pid)
        if current is None or uid not in current.uids or current.pgrp in groups:
            return 0
        if pidfd is None:
            os.kill(candidate.pid, signal.SIGKILL)
        else:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return 1
    except ProcessLookupError:
        return 0
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _processes() -> Iterator[_Process]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (process := _read(int(entry.name))) is not None:
            yield process


def _read(pid: int) -> _Process | None:
    """Uids, parent and process group from /proc/PID/status (one read).

    gVisor's status has no ``NSpgid`` line: there the group comes from ``getpgid``.
    """
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # gone
    try:
        status = os.read(fd, 8192)
    except OSError:
        return None
    finally:
        os.close(fd)
    ppid, pgrp, uids = (_field(status, name) for name in (b"PPid", b"NSpgid", b"Uid"))
    if not (ppid and uids):
        return None
    try:
        group = int(pgrp[0]) if pgrp else os.getpgid(pid)
    except ProcessLookupError:
        return None  # gone
    return _Process(pid, int(ppid[0]), group, frozenset(map(int, uids)))


def _field(status: bytes, name: bytes) -> list[bytes]:
    start = status.find(b"\n" + name + b":")
    if start < 0:
        return []
    start += len(name) + 2
    return status[start : status.find(b"\n", start)].split()
