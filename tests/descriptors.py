"""This process's open descriptors, for tests that check a call leaves none behind.

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
