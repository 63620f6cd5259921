"""This process's open descriptors and TCP sockets, for tests that check a call leaves none behind.

The test process is shared with fixtures that outlive a test and run threads of their own. A
sandbox with writable roots (the behavioural suites' sandbox backend; the attack corpus's shared
sandbox, alive until the session ends) measures its disk budget by walking them on a worker
thread every two seconds, holding a directory descriptor per level while it walks. On a loaded
machine a walk takes longer and more often spans the two counts of a test. No call under test
keeps a directory open, so directories are left out of the count.
"""

from __future__ import annotations

import gc
import os
import stat
from pathlib import Path


def open_descriptors() -> int:
    """Descriptors this process holds other than directories, once objects already unreachable
    have closed theirs."""
    gc.collect()
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += not stat.S_ISDIR(os.stat(f"/proc/self/fd/{name}").st_mode)
        except OSError:
            pass  # closed meanwhile, as the listing's own descriptor is
    return count


def descriptor_targets() -> dict[int, str]:
    """What each descriptor of this process is (``pipe:[inode]``, ``socket:[inode]``, a path),
    once objects already unreachable (an earlier test's) have closed theirs."""
    gc.collect()
    targets = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            targets[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass  # closed meanwhile, as the listing's own descriptor is
    return targets


def open_tcp_sockets(remote_port: int | None = None) -> int:
    """This process's TCP sockets, or those connected to ``remote_port``: the client's ends of a
    test server's connections (the server's own ends have that port as their local one)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if remote_port is None or int(fields[2].rsplit(":", 1)[1], 16) == remote_port:
                inodes.add(fields[9])
    return sum(target.startswith("socket:[") and target[8:-1] in inodes for target in descriptor_targets().values())
