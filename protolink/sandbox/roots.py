"""Roots: host directories mounted at the same absolute path inside a sandbox.

A writable root must be writable by the sandbox's command user (uid 65534 by default, with its
gid and no other groups): :func:`check_writable` says so before a sandbox starts, and hands a
root over to that user only when asked.
"""

from __future__ import annotations

import logging
import os
import shlex
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from . import posix_acl
from .errors import RootNotWritableError

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Root:
    """A host directory mounted at the same absolute path inside the sandbox."""

    path: str
    writable: bool = False

    @classmethod
    def parse(cls, text: str) -> Root:
        """``PATH``, ``PATH:ro`` or ``PATH:rw`` (the command line and ``PROTOLINK_SANDBOX_ROOTS``)."""
        path, _, mode = text.rpartition(":") if text.endswith((":ro", ":rw")) else (text, "", "ro")
        return cls(path, writable=mode == "rw")


def writable_by(path: str, uid: int, gid: int) -> bool:
    """True when a process of ``uid``, ``gid`` and no other groups, without capabilities, may
    create and remove entries in the directory ``path`` (owner, mode bits and POSIX ACL, as
    the kernel checks them)."""
    info = os.stat(path)
    want = posix_acl.WRITE | posix_acl.EXECUTE
    return posix_acl.permits(info, posix_acl.read(path), uid, frozenset({gid}), want)


def check_writable(roots: Iterable[Root], uid: int, gid: int, *, hand_over: bool = False) -> list[str]:
    """Refuse a writable root that ``uid``/``gid`` cannot write: RootNotWritableError, naming the
    root, the uid and the one command that fixes it. With ``hand_over``, such a root is given to
    ``uid``:``gid`` instead (its owner changes; what it holds keeps its owners); returns the
    paths handed over. Read-only roots are not looked at."""
    handed = []
    for root in roots:
        if not root.writable or writable_by(root.path, uid, gid):
            continue
        if not hand_over:
            raise _not_writable(root.path, uid, gid, "")
        info = os.stat(root.path)
        try:
            os.chown(root.path, uid, gid, follow_symlinks=False)
        except PermissionError:
            raise _not_writable(root.path, uid, gid, " and this user may not hand it over") from None
        log.warning("handed writable root %s to %d:%d (it was %d:%d)", root.path, uid, gid, info.st_uid, info.st_gid)
        if not writable_by(root.path, uid, gid):
            raise _not_writable(root.path, uid, gid, " even once handed over")
        handed.append(root.path)
    return handed


def _not_writable(path: str, uid: int, gid: int, why: str) -> RootNotWritableError:
    info = os.stat(path)
    acl = " plus an ACL" if posix_acl.read(path) is not None else ""
    fix = _fix(path, info, uid, gid)
    return RootNotWritableError(
        f"writable root {path} cannot be written by uid {uid} (gid {gid}), the user sandbox commands run as "
        f"(owner {info.st_uid}:{info.st_gid}, {stat.filemode(info.st_mode)}{acl}){why}; fix it with: {fix}"
        + ("" if why else " (or let the sandbox hand it over: --chown-writable, chown_writable=True)"),
        path=path, uid=uid, gid=gid, fix=fix)


def _fix(path: str, info: os.stat_result, uid: int, gid: int) -> str:
    """The one command that makes ``path`` writable by ``uid``: chown for root, else an ACL
    entry its owner may add, else chown through sudo."""
    quoted = shlex.quote(path)
    owner_bits = "" if info.st_mode & stat.S_IWUSR and info.st_mode & stat.S_IXUSR else f" && chmod u+wx {quoted}"
    if os.getuid() == 0:
        return f"chown {uid}:{gid} {quoted}{owner_bits}"
    if info.st_uid == os.getuid():
        return f"setfacl -m u:{uid}:rwx,d:u:{uid}:rwx {quoted}"
    return f"sudo chown {uid}:{gid} {quoted}{owner_bits.replace('chmod', 'sudo chmod')}"

