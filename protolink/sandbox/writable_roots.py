"""Writable roots on the host: the command user must be able to write them.

A writable root must be writable by the sandbox's command user (uid 65534 by default, with its
gid and no other groups): :func:`check_writable` says so before a sandbox starts, and hands a
root over to that user only when asked. :func:`default_workspace` is the root an appliance
gets when none is given.
"""

from __future__ import annotations

import logging
import os
import shlex
import stat
from collections.abc import Iterable
from pathlib import Path

from protolink.errors import RootNotWritableError
from protolink.wire.roots import Root

from . import posix_acl

log = logging.getLogger(__name__)

#: Directories the image keeps private to its root user: a root beneath one cannot be reached
#: by the command user inside the container, whatever the host allows.
_PRIVATE_IN_IMAGE = ("/root",)


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


def default_workspace(uid: int, gid: int) -> Path:
    """The writable root of an appliance started without roots, created when missing.

    ``$XDG_DATA_HOME/protolink/workspace``; without ``XDG_DATA_HOME``,
    ``~/.local/share/protolink/workspace``, or ``/srv/protolink/workspace`` for root (the image
    keeps ``/root`` private). Created mode 0700 for the host user and the command user
    ``uid``:``gid`` only (:func:`open_to`).
    """
    path = _workspace_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
    except FileExistsError:
        return path
    open_to(path, uid, gid, "the default workspace", ", or pass --root PATH:rw")
    return path


def open_to(path: Path, uid: int, gid: int, what: str, alternative: str = "") -> None:
    """Let the command user ``uid``:``gid`` write the new directory ``path``: root hands it to
    that user; any other user grants it access through an ACL that what is created beneath
    inherits (the host user keeps access too). RootNotWritableError where neither works."""
    if os.getuid() == 0:
        os.chown(path, uid, gid)
        return
    try:
        posix_acl.grant(str(path), {uid: 7, os.getuid(): 7})
    except OSError as error:  # a file system without ACLs
        fix = f"sudo chown {uid}:{gid} {shlex.quote(str(path))}"
        raise RootNotWritableError(f"{what} {path} cannot be opened to uid {uid}, the user sandbox "
                                   f"commands run as ({error.strerror}); fix it with: {fix}{alternative}",
                                   path=str(path), uid=uid, gid=gid, fix=fix) from None


def _workspace_path() -> Path:
    data = os.environ.get("XDG_DATA_HOME", "")
    if os.path.isabs(data):
        base = Path(data)
    elif os.getuid() == 0:
        base = Path("/srv")
    else:
        base = Path.home() / ".local" / "share"
    path = base / "protolink" / "workspace"
    if any(path.is_relative_to(private) for private in _PRIVATE_IN_IMAGE):
        raise ValueError(f"the default workspace {path} would be beneath {_PRIVATE_IN_IMAGE}, which sandbox "
                         "commands cannot enter: set XDG_DATA_HOME elsewhere or pass --root PATH:rw")
    return path
