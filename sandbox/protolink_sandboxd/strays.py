"""Kills processes of the command user that no running command accounts for.

Every worker and the spawner are children of the server, and every command a child of its
keeper, a child of the spawner that is a child subreaper: whatever a command's descendants
orphan is reparented to its keeper, so every process descended from a running command is
below the server, whatever its process group or session. A keeper exits as soon as its
command does, and what the command left behind is reparented above the server. A process of
the command uid that does not descend from the server is therefore a stray: left behind by a
command that has ended (a daemon, a setsid fork bomb, a background job), or started by no
command at all. Strays are killed after each command and every :data:`INTERVAL_SECONDS` while
commands run, and a sweep ends once what it killed has died. The host backend cannot do this (other processes of the user are not its own);
inside the sandbox the command uid is ours alone.

Where subreapers are refused (gVisor), orphans go to PID 1 while their command still runs.
There a sweep remembers which command (keeper) each process descended from when it was seen,
and spares a process while that keeper lives; a process first seen already orphaned may come
from any command running then, and is spared until all of those have ended (SECURITY.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import NamedTuple

from protolink.execution.groups import REAP_WAIT_SECONDS

INTERVAL_SECONDS = 0.5
#: Sweeps of /proc in one kill_strays call, at most (each signals what the previous missed).
MAX_PASSES = 100
#: How often a sweep looks again whether what it killed has died.
DEATH_POLL_SECONDS = 0.002
#: Processes started since the last look that a quick look checks one by one, at most.
NEW_PIDS_CHECKED = 8


#: Parent links followed up from one process, at most (a pid namespace holds fewer processes).
MAX_DEPTH = 1 << 16
#: How long what one look learned serves the next: far too short for the pid counter to come
#: round to a pid it has handed out (that takes pid_max forks, at least 32,768).
DESCENT_SECONDS = 0.05


class _Process(NamedTuple):
    pid: int
    ppid: int
    uids: frozenset[int]


class StraySweeper:
    """Sweeps strays of ``uid`` while commands run and once after each command.

    ``spawner`` gives the spawner's pid (None while there is none): its children are the
    commands' keepers. ``workers`` gives the pids of the server's workers; ``keepers``, those
    of the keepers of commands that have not ended for the server; ``waiting``, the keeper the
    spawner forked ahead for the next command, as far as the server knows (the spawner reports
    it as it forks it and again when it dies unused, and a start may take it; while the news of
    its death travels its pid cannot come round to another process). ``subreapers`` says
    whether keepers are subreapers here; without them sweeps remember descent
    (:class:`Origins`).
    """

    def __init__(self, uid: int, spawner: Callable[[], int | None], workers: Callable[[], Collection[int]], *,
                 keepers: Callable[[], Collection[int]] = frozenset,
                 waiting: Callable[[], int | None] = lambda: None, subreapers: bool = True) -> None:
        self._uid = uid
        self._spawner = spawner
        self._workers = workers
        self._waiting = waiting
        self._origins = None if subreapers else Origins(uid, spawner)
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
        self._descent = Descent(uid, spawner, keepers, self._pids)

    @contextlib.asynccontextmanager
    async def command(self) -> AsyncIterator[None]:
        """Hold while a command runs; on exit, its strays (and any other the look finds) are dead."""
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
        the server's own processes. Either needs no process's status. Else, with subreapers, the
        statuses of what may have changed since the last look (:class:`Descent`); without, of
        every process.
        """
        if self._queued is not None or (self._current is not None and not self._current.done()):
            return False
        if self._none_left_since_quiet():
            return True
        last, spawner = self._pids.last(), self._spawner()
        # Listed first, checked after: a helper not yet reaped when checked was that same
        # process when listed (a pid is free for reuse only once its process has been reaped).
        listed = _listed()
        helpers = _helpers(spawner, self._workers())
        if (waiting := self._waiting()) is not None and spawner is not None:
            helpers.add(waiting)
        if listed == _server_and_ancestors() | helpers:
            self._quiet = last  # read before the listing: a process started after it is checked later
            return True
        self._quiet = None
        if self._origins is None:
            return self._descent.clean(last, spawner, listed, helpers)
        return not _strays(self._uid, os.getpid(), _processes())

    def _none_left_since_quiet(self) -> bool:
        """Whether every process started since the quiet moment is gone (a process that existed
        then was the server's own), with no process started while this looked."""
        if self._quiet is None or (last := self._pids.last()) is None:
            return False
        if not 0 <= last - self._quiet <= NEW_PIDS_CHECKED:
            return False
        # A zombie, or any thread's id, is still there (but the keeper waiting for the next
        # command). A process that forked and exited while this looked handed out a pid: the
        # second reading differs.
        waiting = self._waiting()
        if any(os.path.exists(f"/proc/{pid}") for pid in range(self._quiet + 1, last + 1) if pid != waiting):
            return False
        if self._pids.last() != last:
            return False
        self._quiet = last
        return True

    async def _sweep_after(self, previous: asyncio.Future[int] | None) -> int:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        self._current, self._queued = self._queued, None
        return await asyncio.get_running_loop().run_in_executor(
            self._thread, kill_strays, self._uid, os.getpid(), self._origins)

    async def _tick(self) -> None:
        """Sweep every :data:`INTERVAL_SECONDS` until a wake finds no command running."""
        while True:
            await asyncio.sleep(INTERVAL_SECONDS)
            if not self._running:
                return
            await self.sweep()


class Descent:
    """Looks for strays that read the status only of processes that may have changed since the
    last look (where keepers are subreapers).

    A process below a keeper stays below it while that keeper lives, whatever its own parents
    do: what its tree orphans is reparented to the keeper (or to a subreaper below it). A keeper
    is the spawner's child for as long as the spawner runs. So a process the last look found
    below a keeper is still below the server if the spawner is the same and still runs, neither
    the process's pid nor its keeper's has been handed out again since (the pid counter says
    which were: pids go out in turn, and :data:`DESCENT_SECONDS` is far too short for the
    counter to come round), and the keeper is listed and among ``keepers``: those of commands
    that have not ended for the server (once a command has, its keeper is reaped, or killed and
    maybe not yet reaped, its orphans already outside). Every other process is read: new ones,
    those below keepers of ended commands, anything outside a keeper's tree. In a burst of
    commands, each end then costs a listing of /proc and a few statuses instead of every
    process's.
    """

    def __init__(self, uid: int, spawner: Callable[[], int | None], keepers: Callable[[], Collection[int]],
                 pids: _PidCounter, *, seconds: float = DESCENT_SECONDS) -> None:
        self._uid = uid
        self._spawner = spawner
        self._running = keepers
        self._pids = pids
        self._seconds = seconds
        #: From the last look: each process found below a keeper, and that keeper (a keeper's own pid).
        self._keepers: dict[int, int] = {}
        #: The last look's spawner, pid counter (read before /proc was listed) and time.
        self._last_look: tuple[int | None, int | None, float] = (None, None, -seconds)

    def clean(self, last: int | None, spawner: int | None, listed: set[int], helpers: set[int]) -> bool:
        """Whether ``listed`` (what /proc listed after the pid counter read ``last``) holds no
        process of the uid outside the server's tree; ``helpers``: the server's spawner and
        workers among them."""
        now = time.monotonic()
        then_spawner, then_last, then = self._last_look
        trusted = (spawner is not None and spawner == then_spawner and then_last is not None and last is not None
                   and spawner <= then_last <= last and now - then <= self._seconds and _running_child(spawner))
        look = _Look(self._uid, spawner, listed, helpers, self._keepers if trusted else {}, set(self._running()),
                     then_last if trusted else -1)
        try:
            return look.clean()
        finally:
            self._keepers, self._last_look = look.keepers, (spawner, last, now)


#: A process's place in one look, when not below a keeper: below the server, or outside it.
_NO_KEEPER, _OUTSIDE = -1, -2


class _Look:
    """One look of :class:`Descent`. A ``known`` process whose pid and keeper's pid are at most
    ``unchanged_up_to`` and whose keeper is listed and ``running`` is taken as below that keeper."""

    def __init__(self, uid: int, spawner: int | None, listed: set[int], helpers: set[int], known: Mapping[int, int],
                 running: set[int], unchanged_up_to: int) -> None:
        self._uid = uid
        self._spawner = spawner
        self._listed = listed
        self._helpers = helpers
        self._known = known
        self._running = running
        self._unchanged_up_to = unchanged_up_to
        self._root = os.getpid()
        self._places: dict[int, int] = {}
        #: What this look found below each keeper, for the next one.
        self.keepers: dict[int, int] = {}

    def clean(self) -> bool:
        for pid in self._listed - _server_and_ancestors() - self._helpers:
            if (keeper := self._kept(pid)) is not None:
                self.keepers[pid] = keeper
                continue
            process = _read(pid)
            if process is not None and self._uid in process.uids and self._place(process) == _OUTSIDE:
                return False
        return True

    def _kept(self, pid: int) -> int | None:
        keeper = self._known.get(pid)
        if (keeper is None or max(pid, keeper) > self._unchanged_up_to or keeper not in self._running
                or keeper not in self._listed):
            return None
        return keeper

    def _place(self, process: _Process) -> int:
        """Where ``process`` is, following its parents (read afresh) up to what this look knows."""
        chain = [process.pid]
        place = _OUTSIDE
        while len(chain) < MAX_DEPTH:
            if process.ppid == self._spawner:
                place = process.pid  # a keeper
                break
            parent = process.ppid
            if parent == self._root or parent in self._helpers:
                place = _NO_KEEPER
                break
            if parent in self._places:
                place = self._places[parent]
                break
            if (keeper := self._kept(parent)) is not None:
                place = keeper
                break
            if parent == 0 or (ancestor := _read(parent)) is None:
                break  # the top of the namespace, or a parent that exited while this looked
            chain.append(parent)
            process = ancestor
        for pid in chain:
            self._places[pid] = place
            if place >= 0:
                self.keepers[pid] = place
        return place


class Origins:
    """Where subreapers are refused: the keepers each process of ``uid`` may descend from.

    A process seen below a keeper descends from that keeper, also once it is orphaned to
    PID 1. A process first seen outside the server's tree may come from any keeper alive then.
    It is spared while one of its keepers lives. Pids are sequential where this is used
    (gVisor), so a pid names one process for as long as it is remembered.
    """

    def __init__(self, uid: int, spawner: Callable[[], int | None]) -> None:
        self._uid = uid
        self._spawner = spawner
        self._seen: dict[int, frozenset[int]] = {}
        self._keepers: frozenset[int] = frozenset()

    def update(self, processes: Mapping[int, _Process]) -> None:
        """Take one look at /proc into account."""
        spawner = self._spawner()
        self._keepers = frozenset(p.pid for p in processes.values() if spawner is not None and p.ppid == spawner)
        keeper_of = _Ancestry(processes, self._keepers)
        seen = {}
        for process in processes.values():
            if self._uid not in process.uids:
                continue
            keeper = keeper_of(process.pid)
            if keeper is not None:
                seen[process.pid] = frozenset((keeper,))
            else:
                seen[process.pid] = self._seen.get(process.pid, self._keepers)
        self._seen = seen

    def spares(self, pid: int) -> bool:
        """Whether a keeper ``pid`` may descend from still lives."""
        return not self._seen.get(pid, frozenset()).isdisjoint(self._keepers)


class _Ancestry:
    """In one look at /proc: the first of ``tops`` found going up from a process (None: none)."""

    def __init__(self, processes: Mapping[int, _Process], tops: Collection[int]) -> None:
        self._processes = processes
        self._found: dict[int, int | None] = {top: top for top in tops}

    def __call__(self, pid: int) -> int | None:
        chain = []
        found: int | None = None
        while len(chain) < MAX_DEPTH:
            if pid in self._found:
                found = self._found[pid]
                break
            process = self._processes.get(pid)
            if process is None or process.ppid == 0:
                break  # the top of the namespace, or a parent that exited while /proc was read
            chain.append(pid)
            pid = process.ppid
        for member in chain:
            self._found[member] = found
        return found


def kill_strays(uid: int, root: int | None, origins: Origins | None = None) -> int:
    """SIGKILL every process of ``uid`` that does not descend from ``root`` (and that
    ``origins``, where given, does not spare).

    With no ``root`` (at shutdown), every process of ``uid`` dies. Strays may fork while
    they are being killed (a fork bomb that calls setsid), so passes repeat until one finds no
    stray it has not signalled yet. Then it waits, for :data:`REAP_WAIT_SECONDS` at most, until
    what it signalled has died: a killed process still runs until the CPU gets to it (at nice 19
    on a busy machine, a while), and the next command must not find it. Returns how many were
    signalled.
    """
    signalled: set[int] = set()
    for _ in range(MAX_PASSES):
        processes = _processes()
        if origins is not None:
            origins.update(processes)
        strays = [p for p in _strays(uid, root, processes)
                  if p.pid not in signalled and (origins is None or not origins.spares(p.pid))]
        if not strays:
            break
        outside: set[int] = set()
        signalled.update(p.pid for p in strays if _kill_if_still(p.pid, uid, root, outside))
    _await_deaths(signalled, uid)
    return len(signalled)


def _await_deaths(pids: Collection[int], uid: int) -> None:
    """Wait until none of ``pids`` is a live process of ``uid`` (a zombie is dead; a pid handed
    out again to a process of another user is not waited for), or :data:`REAP_WAIT_SECONDS` have
    passed."""
    deadline = time.monotonic() + REAP_WAIT_SECONDS
    alive = list(pids)
    while alive:
        alive = [pid for pid in alive if (process := _read(pid)) is not None and uid in process.uids]
        if not alive or time.monotonic() >= deadline:
            return
        time.sleep(DEATH_POLL_SECONDS)


def _strays(uid: int, root: int | None, processes: Mapping[int, _Process]) -> list[_Process]:
    """The processes of ``uid`` that do not descend from ``root`` in this look at /proc."""
    below = _Ancestry(processes, () if root is None else (root,))
    return [p for p in processes.values() if uid in p.uids and below(p.pid) is None]


def _listed() -> set[int]:
    """The pids /proc lists."""
    return {int(name) for name in os.listdir("/proc") if name.isdigit()}


def _server_and_ancestors() -> set[int]:
    """This server and its ancestors (the container's init processes)."""
    return {1, os.getppid(), os.getpid()} - {0}  # no parent in this pid namespace: 0


def _helpers(spawner: int | None, workers: Collection[int]) -> set[int]:
    """The spawner and workers that are still this server's unreaped children."""
    return {pid for pid in [spawner, *workers] if pid is not None and _unreaped_child(pid)}


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


def _running_child(pid: int) -> bool:
    """``pid`` is a child of this process that has not exited."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except OSError:
        return False


def _unreaped_child(pid: int) -> bool:
    """``pid`` is a child of this process that has not been reaped (running, or a zombie)."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except OSError:
        return False  # not our child, or no longer: the pid may belong to anyone now
    return True


def _kill_if_still(pid: int, uid: int, root: int | None, outside: set[int]) -> int:
    """SIGKILL ``pid`` if, read afresh, it is still a process of ``uid`` outside ``root``'s tree.

    ``outside`` holds pids found outside in this pass: a process never moves into the tree
    (orphans are reparented upwards, and nothing below the server adopts from outside), so
    they stay outside."""
    # The pidfd pins the process: if the pid was reused meanwhile, /proc now describes the
    # new process and the check below applies to the process the signal would reach.
    # gVisor has no pidfds (ENOSYS): there the check and the kill are two calls, and only a
    # pid reused between them could be missed or hit (gVisor hands pids out in sequence).
    pidfd: int | None = None
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as error:
        if error.errno != errno.ENOSYS:
            return 0
    try:
        current = _read(pid)
        if current is None or uid not in current.uids or (root is not None and not _outside(current, root, outside)):
            return 0
        if pidfd is None:
            os.kill(pid, signal.SIGKILL)
        else:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return 1
    except ProcessLookupError:
        return 0
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _outside(process: _Process, root: int, outside: set[int]) -> bool:
    """Whether ``process`` does not descend from ``root``, following its parents afresh.

    An ancestor that exits meanwhile has handed its children to a subreaper or PID 1 before it
    could be reaped, so the walk starts again from ``process``; after a few such restarts the
    answer is False (spared until the next pass)."""
    for _ in range(3):
        chain = [process.pid]
        parent = process.ppid
        while len(chain) < MAX_DEPTH:
            if parent == root:
                return False
            if parent == 0 or parent in outside:
                outside.update(chain)
                return True
            ancestor = _read(parent)
            if ancestor is None:
                break
            chain.append(parent)
            parent = ancestor.ppid
        else:
            return False
        fresh = _read(process.pid)
        if fresh is None:
            return False
        process = fresh
    return False


def _processes() -> dict[int, _Process]:
    """One look at /proc: every process that could be read, by pid."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (process := _read(int(entry.name))) is not None:
            found[process.pid] = process
    return found


def _read(pid: int) -> _Process | None:
    """Uids and parent from /proc/PID/status (one read); None once the process is gone or a zombie."""
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
    state, ppid, uids = (_field(status, name) for name in (b"State", b"PPid", b"Uid"))
    if not (ppid and uids) or state[:1] == [b"Z"]:
        return None  # a zombie is dead already
    return _Process(pid, int(ppid[0]), frozenset(map(int, uids)))


def _field(status: bytes, name: bytes) -> list[bytes]:
    start = status.find(b"\n" + name + b":")
    if start < 0:
        return []
    start += len(name) + 2
    return status[start : status.find(b"\n", start)].split()
