"""The server's first process: it reaps every orphan and forwards stop signals to the server.

Commands may leave orphans behind (double forks, daemons). They are reparented to PID 1, or
to this process when it is not PID 1 (it becomes a child subreaper), and reaped here. The
server itself, a child of this process, therefore never waits for processes it did not start,
so asyncio's child watchers never lose an exit status to a foreign ``wait``.

A process whose parent is PID 1 (the image's tini) needs no reaper of its own: orphans go to
that parent, which reaps them, and it passes stop signals on. There the server runs in this
process, and the sandbox is a Python process (some 6 MB) smaller.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable

from .privileges import become_subreaper, die_with_parent, make_non_dumpable

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run_under_reaper(serve: Callable[[], int]) -> int:
    """Run ``serve`` in a child process; reap orphans here until it exits; return its code.
    Under an init that reaps (this process's parent is PID 1), run it here instead."""
    make_non_dumpable()
    if os.getppid() == 1:
        _stop_on_signals()
        return _exit_code(serve)
    if os.getpid() != 1:
        try:
            become_subreaper()
        except OSError:  # gVisor has no subreapers: orphans go to PID 1 (tini), which reaps them
            pass
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        _stop_on_signals()
        die_with_parent(parent)
        os._exit(_exit_code(serve))
    for signum in _FORWARDED:
        signal.signal(signum, lambda received, frame: _forward(child, received))
    while True:
        pid, status = os.wait()
        if pid == child:
            return os.waitstatus_to_exitcode(status)


def _stop_on_signals() -> None:
    """The stop signals end the server at once, as the kernel's default action does."""
    for signum in _FORWARDED:
        signal.signal(signum, signal.SIG_DFL)


def _exit_code(serve: Callable[[], int]) -> int:
    """Run ``serve``; its exit code, with a failure reported on stderr (the child never returns)."""
    try:
        return serve()
    except SystemExit as stop:
        if isinstance(stop.code, int):
            return stop.code
        print(f"sandbox: {stop.code}", file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    return 1


def _forward(child: int, signum: int) -> None:
    try:
        os.kill(child, signum)
    except ProcessLookupError:
        pass
