"""Process attributes the server and its workers set on themselves (Linux prctl, credentials)."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import resource
import signal
from collections.abc import Iterator, Sequence

_PR_SET_PDEATHSIG = 1
_PR_GET_PDEATHSIG = 2
_PR_SET_DUMPABLE = 4
_PR_SET_KEEPCAPS = 8
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_CAP_SETUID = 7
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
NOBODY = 65534

_libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}): {os.strerror(errno)}")


#: The OOM killer's preferences (``oom_score_adj``, 0 .. 1000 first) for the helpers (workers,
#: the spawner) and for commands: when the sandbox runs out of memory, commands go first, then
#: helpers, and the server (0) last. A process may lower its own preference back to the
#: container's floor (0): raising that floor takes CAP_SYS_RESOURCE, which the engines this was
#: built on cannot grant.
OOM_HELPER, OOM_COMMAND = 500, 1000
OOM_SCORE_ADJ = "/proc/self/oom_score_adj"


def set_oom_score_adj(score: int, *, fd: int | None = None) -> None:
    """Set this process's ``oom_score_adj`` (children inherit it); ``fd``, when given, is
    :data:`OOM_SCORE_ADJ` kept open for writing, so that setting it is a single write."""
    if fd is not None:
        os.write(fd, b"%d" % score)
        return
    with open(OOM_SCORE_ADJ, "w") as adjust:
        adjust.write(str(score))


def helper_arguments(prog: str, argv: list[str] | None, *extra: str, text: Sequence[str] = ()) -> argparse.Namespace:
    """The command line of a helper the server starts (worker, spawner): the identity it acts
    as, the server it dies with, the integer options named in ``extra`` and the text options
    named in ``text``."""
    parser = argparse.ArgumentParser(prog=prog)
    for option in ("--uid", "--gid", "--server", *extra):
        parser.add_argument(option, type=int, required=True)
    for option in text:
        parser.add_argument(option, required=True)
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


def subreapers_work() -> bool:
    """Whether processes may become child subreapers here (gVisor refuses). Call it while this
    process has no children: it is a subreaper for a moment."""
    try:
        become_subreaper()
    except OSError:
        return False
    _prctl(_PR_SET_CHILD_SUBREAPER, 0)
    return True


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


def drop_to_shielded(uid: int, gid: int) -> None:
    """Act on files as ``uid``/``gid`` for good, out of reach of ``uid``'s processes.

    The real, effective and saved uids become :func:`shielding_uid` and only the file-system
    uid is ``uid`` (every gid is ``gid``; no supplementary groups): the kernel checks file
    permissions, and sets the owner of new files, with the file-system ids, while signals,
    ``setpriority``, ``sched_setaffinity``, ``prlimit`` and ``ptrace`` by ``uid`` need ``uid``
    among the target's real, effective or saved uids. A file-system uid outside those takes
    CAP_SETUID, kept through the uid change (KEEPCAPS) and dropped with every other capability
    right after. fsuid and capabilities belong to the calling thread: call this while the
    process has one thread. Where the kernel keeps no file-system uid (gVisor's ``setfsuid``
    fails), the effective uid becomes ``uid`` instead: the spawner's weaker shield (``spawner.c``).
    Changing ids clears the parent-death signal and makes the process non-dumpable.
    """
    _check_single_threaded()
    shield = shielding_uid(uid)
    _prctl(_PR_SET_KEEPCAPS, 1)
    try:
        _assume_ids(gid, shield, shield)
        _set_capabilities(1 << _CAP_SETUID)
        has_fsuid = _set_fsuid(uid)
        if not has_fsuid:
            os.setresuid(-1, uid, -1)
        _set_capabilities(0)
    finally:
        _prctl(_PR_SET_KEEPCAPS, 0)
    _check_credentials((shield, shield if has_fsuid else uid, shield, uid), gid)


def _assume_ids(gid: int, real_uid: int, effective_uid: int) -> None:
    """No supplementary groups, every gid ``gid``, real and saved uid ``real_uid``, effective
    (and so file-system) uid ``effective_uid``."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(real_uid, effective_uid, real_uid)


def _set_capabilities(effective_and_permitted: int) -> None:
    """This thread's effective and permitted capabilities become exactly the given mask; none inheritable."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)(_CapData(effective_and_permitted, effective_and_permitted, 0), _CapData(0, 0, 0))
    if _libc.capset(ctypes.byref(header), data) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"capset: {os.strerror(errno)}")


def _set_fsuid(uid: int) -> bool:
    """Make ``uid`` this thread's file-system uid (CAP_SETUID needed); whether the kernel keeps
    one (gVisor's does not)."""
    _libc.setfsuid(ctypes.c_uint(uid))
    return _libc.setfsuid(ctypes.c_uint(0xFFFFFFFF)) == uid  # an invalid id changes nothing, answers the current one


def _check_single_threaded() -> None:
    if _status()["Threads"] != ["1"]:
        raise RuntimeError("credentials of one thread only would change: the process has several")


def _check_credentials(uids: tuple[int, int, int, int], gid: int) -> None:
    """Real, effective, saved and file-system uids are ``uids``, every gid is ``gid``, no
    supplementary group, no capability but the bounding set, one thread: or PermissionError."""
    status = _status()
    found = (tuple(map(int, status["Uid"])), tuple(map(int, status["Gid"])), status.get("Groups", []),
             [int(status[name][0], 16) for name in ("CapInh", "CapPrm", "CapEff", "CapAmb") if name in status],
             status["Threads"])
    if found != (uids, (gid,) * 4, [], [0] * len(found[3]), ["1"]):
        raise PermissionError(f"could not drop to uids {uids} gid {gid}: {found}")


def _status() -> dict[str, list[str]]:
    """The fields of /proc/self/status (the main thread's), each split on white space."""
    with open("/proc/self/status") as status:
        return {name: value.split() for name, _, value in (line.partition(":") for line in status)}


@contextlib.contextmanager
def acting_as(uid: int, gid: int) -> Iterator[None]:
    """Create files as ``uid``/``gid`` for a moment: only the effective (and file system) ids
    change, so the saved uid 0 brings the capabilities back afterwards, which is checked.

    Changing the effective uid clears the parent-death signal; it is set again.
    """
    capabilities = _status()["CapEff"]
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
        if _status()["CapEff"] != capabilities:
            raise PermissionError("the capabilities did not come back after acting as another user")


def limit(kind: int, value: int) -> None:
    """Set both the soft and the hard limit of ``kind`` (one of resource.RLIMIT_*)."""
    resource.setrlimit(kind, (value, value))
