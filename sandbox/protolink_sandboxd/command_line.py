"""The command line a process forked without exec shows in ``/proc/PID/cmdline`` (and ``ps``).

A forked child keeps its parent's: the kernel reads it from the strings the process started
with, at the top of its stack. Writing over them is what ``setproctitle`` does; the place is
found by searching the stack, which works under gVisor too (whose ``/proc/PID/stat`` does not
say where those strings are).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence


def show_command_line(argv: Sequence[str]) -> None:
    """Make this process's command line read ``argv``, cut to the length of the one it has."""
    with open("/proc/self/cmdline", "rb") as current:
        shown = current.read()
    start, end = _stack()
    found = ctypes.string_at(start, end - start).rfind(shown)
    if not shown or found < 0:
        raise OSError(f"the command line of process {os.getpid()} is not on its stack")
    text = b"\0".join(os.fsencode(argument) for argument in argv)[:len(shown) - 1]
    ctypes.memmove(start + found, text.ljust(len(shown), b"\0"), len(shown))


def _stack() -> tuple[int, int]:
    """The first and past-the-last address of the main thread's stack."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            if line.rstrip().endswith("[stack]"):
                first, last = line.split()[0].split("-")
                return int(first, 16), int(last, 16)
    raise OSError(f"process {os.getpid()} has no [stack] mapping")
