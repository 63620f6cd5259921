"""What a container uses, read from its cgroups on the host (v1 or v2).

The container's first process names its cgroups in ``/proc/PID/cgroup``; the files beneath
``/sys/fs/cgroup`` say what the whole container holds now (``pids.current``) and the most its
memory reached (``memory.max_usage_in_bytes`` on v1, ``memory.peak`` on v2). Under gVisor the
cgroup holds the runtime's own processes: memory is the sandbox's, pids are the runtime's threads.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: How often :class:`PidsPeak` looks at the number of tasks.
PIDS_INTERVAL_SECONDS = 0.25


def cgroup_dir(pid: int, controller: str) -> Path:
    """The cgroup directory of ``pid`` that holds ``controller``'s files; LookupError when it
    has none."""
    with open(f"/proc/{pid}/cgroup") as cgroups:
        for line in cgroups:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controller in controllers.split(","):
                return CGROUP_ROOT / controllers / path.lstrip("/")
            if controllers == "" and (CGROUP_ROOT / "cgroup.controllers").exists():
                return CGROUP_ROOT / path.lstrip("/")
    raise LookupError(f"process {pid} has no {controller} cgroup")


def pids_in(pid: int) -> list[int]:
    """Host pids of every process in ``pid``'s pids cgroup."""
    with open(cgroup_dir(pid, "pids") / "cgroup.procs") as procs:
        return [int(item) for item in procs.read().split()]


def tasks_now(pid: int) -> int | None:
    """The number of tasks in ``pid``'s pids cgroup; None when it cannot be read."""
    try:
        return int((cgroup_dir(pid, "pids") / "pids.current").read_text())
    except (OSError, LookupError, ValueError):
        return None


def memory_peak(pid: int) -> int | None:
    """The most memory ``pid``'s memory cgroup has held, in bytes; None when unknown."""
    try:
        directory = cgroup_dir(pid, "memory")
    except (OSError, LookupError):
        return None
    for name in ("memory.peak", "memory.max_usage_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            return int((directory / name).read_text())
    return None


class PidsPeak:
    """The most tasks a container's pids cgroup held while :meth:`watch` ran (sampled)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak: int | None = None

    def look(self) -> None:
        now = tasks_now(self.pid)
        if now is not None:
            self.peak = now if self.peak is None else max(self.peak, now)

    async def watch(self) -> None:
        """Look every :data:`PIDS_INTERVAL_SECONDS` until canceled."""
        while True:
            self.look()
            await asyncio.sleep(PIDS_INTERVAL_SECONDS)
