"""Process attributes the server and its workers set on themselves (Linux prctl, credentials)."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import resource
import signal
from collections.abc import Iterator

_PR_SET_PDEATHSIG = 1
_PR_GET_PDEATHSIG = 2
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
NOBODY = 65534

_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}): {os.strerror(errno)}")


def helper_arguments(prog: str, argv: list[str] | None, *extra: str) -> argparse.Namespace:
    """The command line of a helper the server starts (worker, spawner): the identity it acts
    as, the server it dies with, and the integer options named in ``extra``."""
    parser = argparse.ArgumentParser(prog=prog)
    for option in ("--uid", "--gid", "--server", *extra):
        parser.add_argument(option, type=int, required=True)
    args = parser.parse_args(argv)
    if args.uid == 0 or args.gid == 0:
        parser.error("helpers never act as uid or gid 0")
    return args


def make_non_dumpable() -> None:
    """No core dumps, and processes of other users cannot ptrace us or read our memory."""
    _prctl(_PR_SET_DUMPABLE, 0)


def become_subreaper() -> None:
    """Orphaned descendants are reparented to us instead of to init."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def forbid_new_privileges() -> None:
    """This process and everything it executes can never gain privileges (setuid bits, file capabilities)."""
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)


def shielding_uid(uid: int) -> int:
    """The real and saved uid of a helper that acts as ``uid``: unprivileged, never ``uid``, owning nothing."""
    return NOBODY - 1 if uid != NOBODY - 1 else NOBODY - 2


def die_with_parent(parent: int) -> None:
    """SIGKILL when ``parent`` exits; exits at once if it is already gone."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def drop_to(uid: int, gid: int, *, real_uid: int | None = None) -> None:
    """Become ``uid``/``gid`` for good, with no supplementary groups.

    ``real_uid`` (default ``uid``) becomes the real and saved uid while ``uid`` stays the
    effective (and file system) uid: files are accessed and created as ``uid``, but processes
    of ``uid`` cannot signal this one (the kernel compares the sender's uids with the target's
    real and saved uids only). The kernel also marks the process non-dumpable on this
    credential change, and clears its parent-death signal; it stays non-dumpable because
    nothing is executed afterwards.
    """
    real_uid = uid if real_uid is None else real_uid
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(real_uid, uid, real_uid)
    if os.getresuid() != (real_uid, uid, real_uid) or os.getresgid() != (gid, gid, gid):
        raise PermissionError(f"could not drop to uid {uid} gid {gid}")


@contextlib.contextmanager
def acting_as(uid: int, gid: int) -> Iterator[None]:
    """Create files as ``uid``/``gid`` for a moment: only the effective (and file system) ids
    change, so the saved uid 0 brings the capabilities back afterwards, which is checked.

    Changing the effective uid clears the parent-death signal; it is set again.
    """
    capabilities = _effective_capabilities()
    death_signal = ctypes.c_int(0)
    if _libc.prctl(_PR_GET_PDEATHSIG, ctypes.byref(death_signal), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_GET_PDEATHSIG) failed")
    os.setresgid(-1, gid, -1)
    os.setresuid(-1, uid, -1)
    try:
        yield
    finally:
        os.setresuid(-1, 0, -1)
        os.setresgid(-1, 0, -1)
        if death_signal.value:
            _prctl(_PR_SET_PDEATHSIG, death_signal.value)
        if _effective_capabilities() != capabilities:
            raise PermissionError("the capabilities did not come back after acting as another user")


def _effective_capabilities() -> str:
    with open("/proc/self/status") as status:
        return next(line for line in status if line.startswith("CapEff:"))


def limit(kind: int, value: int) -> None:
    """Set both the soft and the hard limit of ``kind`` (one of resource.RLIMIT_*)."""
    resource.setrlimit(kind, (value, value))
