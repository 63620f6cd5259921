"""Process attributes the server and its workers set on themselves (Linux prctl, credentials)."""

from __future__ import annotations

import ctypes
import os
import resource
import signal

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
NOBODY = 65534

_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}): {os.strerror(errno)}")


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


def limit(kind: int, value: int) -> None:
    """Set both the soft and the hard limit of ``kind`` (one of resource.RLIMIT_*)."""
    resource.setrlimit(kind, (value, value))
