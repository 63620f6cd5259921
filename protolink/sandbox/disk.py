"""The disk budget of a sandbox's writable roots, enforced from the host.

A writable root is a host directory bind-mounted into the container, so its writes land on the
host file system. Nothing in Docker bounds such a mount on ext4 (``--storage-opt size`` covers
only the container layer, on XFS with project quotas; a loop-mounted image would need root on
the host and would hide the directory's own files). So the budget is enforced in two layers:

* ``RLIMIT_FSIZE`` on every process in the container (set by :class:`DockerSandbox`): no single
  file grows past the budget; the write fails inside the sandbox (``EFBIG``/``SIGXFSZ``).
* :class:`DiskWatch`: polls the file system's free space every ``poll_seconds`` (one
  ``statvfs``) and, when the space used since the last measurement could exceed what is left of
  the budget (the rises from poll to poll, summed: space freed by others does not offset them),
  or every ``walk_seconds`` anyway, measures the roots' usage exactly (a walk that
  counts allocated blocks, each inode once, without crossing into other file systems, at any
  depth with one directory descriptor at a time). When the roots have grown past the budget and
  are still growing, it calls ``stop`` (which kills the commands running in the sandbox).

Where a walk cannot measure everything (a directory it may not list, a rename racing it, more
than :data:`MAX_ENTRIES` entries), what the last complete measurement found plus the file
system's rises since then stands in for the roots' growth: every other writer on the host's file
system counts in it (while it stands in on a busy host, the watch stops the sandbox's commands
again and again), what others free does not offset it. A deep tree no longer needs it: when the
walk stopped at 256 levels, the file system's net growth since the start stood in for a tree
1,100 levels deep, and it stopped every command of a sandbox whose attack had ended for as long
as other jobs wrote to the disk, or let the attack's files land unnoticed while another job freed
space.

Residual risk, stated plainly: between two polls and during one walk, a command can write past
the budget at the disk's speed before it is stopped; the overshoot is bounded by that window
(about 0.05 s plus one walk), not by the budget. Files already written stay until removed.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

log = logging.getLogger(__name__)

#: What one directory entry costs beyond its data blocks (an inode and its name), so a flood
#: of empty files counts against the budget too.
ENTRY_COST = 256
#: Entries one measurement visits at most (its time and memory grow with them); past that it is
#: incomplete. At :data:`ENTRY_COST` each, 4,000,000 entries are a 1 GiB budget (the default).
MAX_ENTRIES = 4_000_000
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Errors of opening or measuring an entry that mean it was removed or replaced meanwhile.
_GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


class Usage(NamedTuple):
    """What a walk of the roots found: bytes allocated, and whether every entry was measured."""

    bytes: int
    complete: bool


def usage_bytes(roots: Sequence[str], *, max_entries: int | None = None) -> Usage:
    """Bytes allocated beneath ``roots``: data blocks plus :data:`ENTRY_COST` per entry.

    Any depth is measured with one directory descriptor at a time: each directory is opened
    relative to its parent's descriptor (no path ever grows long, so a tree deeper than PATH_MAX
    is measured like any other), and the walk goes back up by opening ``..`` and checking that it
    arrived at the very directory it left (its device and inode). A rename that moves a directory
    the walk stands in (or a directory it enters) elsewhere meanwhile ends the walk of that root
    there: the result is then incomplete, never wrong, and the walk never leaves the root. (A
    removal is no such race: Linux keeps a removed directory's ``..``, so the walk still goes
    back up through directories removed meanwhile and finds them empty.) It never
    crosses into another file system, and counts each inode once (hard links, and directories
    reached twice, as a root inside another root). The result is incomplete when an entry cannot be
    measured (a directory that cannot be opened or listed, an entry that cannot be stat'ed for
    another reason than its removal), on such a race, or past ``max_entries`` entries
    (:data:`MAX_ENTRIES` by default).
    """
    max_entries = MAX_ENTRIES if max_entries is None else max_entries
    total, complete, entries = 0, True, 0
    seen: set[tuple[int, int]] = set()
    for root in roots:
        try:
            fd = os.open(root, _DIRECTORY)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            device, here = info.st_dev, (info.st_dev, info.st_ino)
            if here in seen:
                continue
            seen.add(here)
            # The directories from the root down to the one open at ``fd``: each one's identity
            # and the names of its entries not yet measured.
            levels: list[tuple[tuple[int, int], Iterator[str]]] = []
            complete = _enter(levels, fd, here) and complete
            while levels:
                name = next(levels[-1][1], None)
                if name is None:
                    levels.pop()
                    if not levels:
                        break
                    try:
                        parent = _open_checked("..", fd, levels[-1][0])
                    except OSError:
                        parent = None
                    if parent is None:  # moved meanwhile: where the walk stood is lost
                        complete = False
                        break
                    os.close(fd)
                    fd = parent
                    continue
                entries += 1
                if entries > max_entries:
                    complete = False
                    break
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError as error:
                    complete = complete and error.errno in _GONE  # removed meanwhile is fine
                    continue
                if info.st_dev != device:
                    continue
                directory = stat.S_ISDIR(info.st_mode)
                identity = (info.st_dev, info.st_ino)
                if directory or info.st_nlink > 1:
                    if identity in seen:
                        continue
                    seen.add(identity)
                total += info.st_blocks * 512 + ENTRY_COST
                if not directory:
                    continue
                try:
                    child = _open_checked(name, fd, identity)
                except OSError as error:
                    # Removed or replaced meanwhile is fine; anything else (no descriptor left) is not.
                    complete = complete and error.errno in _GONE
                    continue
                if child is None:  # replaced by another directory between the stat and the open
                    complete = False
                    continue
                os.close(fd)
                fd = child
                complete = _enter(levels, fd, identity) and complete
        finally:
            os.close(fd)
        if entries > max_entries:
            break
    return Usage(total, complete)


def _open_checked(name: str, dir_fd: int, identity: tuple[int, int]) -> int | None:
    """Open the directory ``name`` relative to ``dir_fd``; None (closed) when it is not ``identity``."""
    fd = os.open(name, _DIRECTORY, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if (info.st_dev, info.st_ino) != identity:
        os.close(fd)
        return None
    return fd


def _enter(levels: list[tuple[tuple[int, int], Iterator[str]]], fd: int, identity: tuple[int, int]) -> bool:
    """Push the directory open at ``fd`` with its entries; False when it cannot be listed."""
    try:
        names = os.listdir(fd)
    except OSError:
        levels.append((identity, iter(())))
        return False
    levels.append((identity, iter(names)))
    return True


def _fs_used(path: str) -> int:
    info = os.statvfs(path)
    return (info.f_blocks - info.f_bfree) * info.f_frsize


class DiskWatch:
    """Keeps the growth of ``roots`` within ``budget_bytes``, calling ``stop`` when it is not.

    ``stop`` is blocking; it runs in a worker thread. Use as ``await watch.start()`` ...
    ``await watch.aclose()``.
    """

    def __init__(self, roots: Sequence[str], budget_bytes: int, stop: Callable[[], None], *,
                 poll_seconds: float = 0.05, walk_seconds: float = 2.0) -> None:
        if budget_bytes < 0:
            raise ValueError("disk budget must be >= 0 bytes")
        self.roots = tuple(roots)
        self.budget_bytes = budget_bytes
        self.baseline_bytes = 0
        self.exceeded = 0  # how many times commands were stopped
        self._stop = stop
        self._poll = poll_seconds
        self._walk_every = walk_seconds
        self._task: asyncio.Task[None] | None = None
        # The file system's used space as last polled, and its rises from poll to poll, summed.
        self._fs_last = 0
        self._fs_rises = 0
        # The growth the last complete measurement found, and the rises summed by then.
        self._complete = (0, 0)
        self._walk_rise = 0

    async def start(self) -> None:
        self._fs_last = await asyncio.to_thread(_fs_used, self.roots[0])
        self.baseline_bytes = (await asyncio.to_thread(usage_bytes, self.roots)).bytes
        self._task = asyncio.create_task(self._run(), name="protolink-disk-watch")

    async def _poll_fs(self) -> int:
        """Poll the file system's used space; how much it rose since the last poll."""
        fs_now = await asyncio.to_thread(_fs_used, self.roots[0])
        rise, self._fs_last = max(0, fs_now - self._fs_last), fs_now
        self._fs_rises += rise
        return rise

    async def growth_bytes(self) -> int:
        """How much the roots have grown since :meth:`start`.

        When part of the tree cannot be measured (see :func:`usage_bytes`), what the last complete
        measurement found plus the file system's rises since then (summed poll by poll) stands in
        when it is larger: the host's other writes count in it, what others free does not offset
        it (but during the one poll it is freed in).
        """
        usage = await asyncio.to_thread(usage_bytes, self.roots)
        growth = usage.bytes - self.baseline_bytes
        self._walk_rise = await self._poll_fs()  # what rose during the walk
        if usage.complete:
            self._complete = (growth, self._fs_rises)
        else:
            found, rises = self._complete
            growth = max(growth, found + self._fs_rises - rises)
        return growth

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        last_growth = 0
        last_walk = time.monotonic()
        # How much the file system's used space rose since the last measurement, summed poll by
        # poll: space another process frees (a 2 GB file truncated) does not hide the sandbox's
        # writes, except during the one poll it is freed in.
        rise = 0
        walk_every, walk_gap = self._walk_every, 0.0
        while True:
            await asyncio.sleep(self._poll)
            try:
                rise += await self._poll_fs()
                since = time.monotonic() - last_walk
                suspect = rise > self.budget_bytes - last_growth
                if since < walk_gap or not (suspect or since >= walk_every):
                    continue
                started = time.monotonic()
                growth = await self.growth_bytes()
                # The walks must not eat the machine: on large trees they are spaced out.
                took = time.monotonic() - started
                walk_every, walk_gap = max(self._walk_every, 20 * took), 4 * took
                last_walk, rise = time.monotonic(), self._walk_rise
                if growth > self.budget_bytes and growth > last_growth:
                    self.exceeded += 1
                    log.warning("sandbox writable roots grew %d bytes, past the budget of %d: stopping commands",
                                growth, self.budget_bytes)
                    await asyncio.to_thread(self._stop)
                last_growth = growth
            except asyncio.CancelledError:
                raise
            except Exception:  # a transient failure must not end the watch
                log.exception("disk watch of %s failed once", ", ".join(self.roots))
