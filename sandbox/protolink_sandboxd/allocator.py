"""The C allocator's settings for the server process: large buffers are reused, not remapped,
and every thread shares one arena.

A command's output crosses the server in pieces of up to a mebibyte, and each piece lives in a
few short-lived buffers (the merged bytes, the event's message and its serialization, gRPC's
copy). glibc serves an allocation that large from a fresh mapping, or trims the heap once it is
freed, so every piece cost its size again in page faults and zeroed pages. Raising the mapping
and trim thresholds keeps them on the heap; the server then keeps up to :data:`TRIM_BYTES` of
freed heap for reuse, never more than its peak.
"""

from __future__ import annotations

import ctypes

#: Allocations at least this large get a mapping of their own (glibc's ceiling is 32 MiB).
MAPPING_BYTES = 8 << 20
#: Free memory at the top of the heap beyond this is given back to the system.
TRIM_BYTES = 32 << 20
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def reuse_large_buffers() -> None:
    """Raise glibc's mapping and trim thresholds for this process; nothing where the C library
    has no ``mallopt`` (another libc keeps its defaults)."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, MAPPING_BYTES)
        mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES)


def share_one_arena() -> None:
    """Make every thread of this process allocate from glibc's main arena; nothing where the C
    library has no ``mallopt``. glibc would give each of gRPC's threads an arena of its own, each
    reserving 64 MiB of address space, and a worker forked from the server inherits what the
    server reserved under its own address-space limit. Call it before threads start."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_ARENA_MAX, 1)
