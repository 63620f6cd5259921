"""The disk budget of a sandbox's writable roots, enforced from the host.

A writable root is a host directory bind-mounted into the container, so its writes land on the
host file system. Nothing in Docker bounds such a mount on ext4 (``--storage-opt size`` covers
only the container layer, on XFS with project quotas; a loop-mounted image would need root on
the host and would hide the directory's own files). So the budget is enforced in two layers:

* ``RLIMIT_FSIZE`` on every process in the container (set by :class:`DockerSandbox`): no single
  file grows past the budget; the write fails inside the sandbox (``EFBIG``/``SIGXFSZ``).
* :class:`DiskWatch`: polls the file system's free space every ``poll_seconds`` (one
  ``statvfs``) and, when the space used since the last measurement could exceed what is left of
  the budget, or every ``walk_seconds`` anyway, measures the roots' usage exactly (a walk that
  counts allocated blocks, each inode once, without crossing into other file systems; where a
  tree is too deep to measure, the file system's own growth stands in for it). When the roots
  have grown past the budget and are still growing, it calls ``stop`` (which kills the commands
  running in the sandbox).

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
#: Directory levels beneath a root that are measured (the walk holds one descriptor per level).
MAX_DEPTH = 256
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Usage(NamedTuple):
    """What a walk of the roots found: bytes allocated, and whether every entry was measured."""

    bytes: int
    complete: bool


def usage_bytes(roots: Sequence[str]) -> Usage:
    """Bytes allocated beneath ``roots``: data blocks plus :data:`ENTRY_COST` per entry.

    Each directory is opened relative to its parent's descriptor, so no path ever grows long (a
    tree deeper than PATH_MAX is measured like any other). The result is incomplete when a
    directory is more than :data:`MAX_DEPTH` levels down or cannot be opened or listed.
    """
    total, complete = 0, True
    seen: set[tuple[int, int]] = set()
    for root in roots:
        try:
            root_fd = os.open(root, _DIRECTORY)
        except OSError:
            continue
        device = os.fstat(root_fd).st_dev
        stack: list[tuple[int, Iterator[str]]] = []
        try:
            complete = _enter(stack, root_fd) and complete
            while stack:
                fd, names = stack[-1]
                name = next(names, None)
                if name is None:
                    os.close(stack.pop()[0])
                    continue
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue  # removed meanwhile
                if info.st_dev != device:
                    continue
                if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                    if (info.st_dev, info.st_ino) in seen:
                        continue
                    seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512 + ENTRY_COST
                if not stat.S_ISDIR(info.st_mode):
                    continue
                if len(stack) > MAX_DEPTH:
                    complete = False
                    continue
                try:
                    child = os.open(name, _DIRECTORY, dir_fd=fd)
                except OSError as error:
                    # Removed or replaced meanwhile is fine; anything else (no descriptor left) is not.
                    complete = complete and error.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)
                    continue
                complete = _enter(stack, child) and complete
        finally:
            for fd, _ in stack:
                os.close(fd)
    return Usage(total, complete)


def _enter(stack: list[tuple[int, Iterator[str]]], fd: int) -> bool:
    """Push the directory open at ``fd`` with its entries; False when it cannot be listed."""
    try:
        names = os.listdir(fd)
    except OSError:
        stack.append((fd, iter(())))
        return False
    stack.append((fd, iter(names)))
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
        self._fs_start = 0
        self.exceeded = 0  # how many times commands were stopped
        self._stop = stop
        self._poll = poll_seconds
        self._walk_every = walk_seconds
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._fs_start = await asyncio.to_thread(_fs_used, self.roots[0])
        self.baseline_bytes = (await asyncio.to_thread(usage_bytes, self.roots)).bytes
        self._task = asyncio.create_task(self._run(), name="protolink-disk-watch")

    async def growth_bytes(self) -> int:
        """How much the roots have grown since :meth:`start`.

        When part of the tree cannot be measured (see :func:`usage_bytes`), the file system's own
        growth since the start stands in as an upper bound: it includes the host's other writes.
        """
        usage = await asyncio.to_thread(usage_bytes, self.roots)
        growth = usage.bytes - self.baseline_bytes
        if not usage.complete:
            growth = max(growth, await asyncio.to_thread(_fs_used, self.roots[0]) - self._fs_start)
        return growth

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        last_growth = 0
        last_walk = time.monotonic()
        fs_mark = await asyncio.to_thread(_fs_used, self.roots[0])
        walk_every, walk_gap = self._walk_every, 0.0
        while True:
            await asyncio.sleep(self._poll)
            try:
                fs_now = await asyncio.to_thread(_fs_used, self.roots[0])
                since = time.monotonic() - last_walk
                suspect = fs_now - fs_mark > self.budget_bytes - last_growth
                if since < walk_gap or not (suspect or since >= walk_every):
                    continue
                started = time.monotonic()
                growth = await self.growth_bytes()
                # The walks must not eat the machine: on large trees they are spaced out.
                took = time.monotonic() - started
                walk_every, walk_gap = max(self._walk_every, 20 * took), 4 * took
                last_walk, fs_mark = time.monotonic(), fs_now
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
