"""POSIX ACLs as Linux stores them, and the kernel's rule for who may do what to a file.

An ACL is the ``system.posix_acl_access`` extended attribute (``system.posix_acl_default`` on a
directory: the ACL its new entries inherit): a version word, then entries of tag, permission
bits and uid/gid, sorted by tag and id. :func:`permits` follows the kernel's own check
(``acl_permission_check`` and ``posix_acl_permission`` in fs/namei.c and fs/posix_acl.c), for a
process without ``CAP_DAC_OVERRIDE``: the question a sandbox's command user asks of a root.
"""

from __future__ import annotations

import errno
import functools
import operator
import os
import stat
import struct
from typing import NamedTuple

ACCESS = "system.posix_acl_access"
DEFAULT = "system.posix_acl_default"
VERSION = 2
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
UNDEFINED_ID = 0xFFFFFFFF
READ, WRITE, EXECUTE = 4, 2, 1
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
#: errnos of a file system that keeps no ACLs (or no extended attributes at all).
_NO_ACLS = (errno.ENODATA, errno.EOPNOTSUPP, errno.ENOTSUP)


class Entry(NamedTuple):
    """One ACL entry: its tag, its permission bits (``READ | WRITE | EXECUTE``) and its uid or gid."""

    tag: int
    perm: int
    id: int = UNDEFINED_ID


def read(path: str, name: str = ACCESS) -> tuple[Entry, ...] | None:
    """The ACL of ``path`` (follows links), or None when it has none or its file system keeps none."""
    try:
        data = os.getxattr(path, name)
    except OSError as error:
        if error.errno in _NO_ACLS:
            return None
        raise
    if len(data) < _HEADER.size or (len(data) - _HEADER.size) % _ENTRY.size or _HEADER.unpack_from(data)[0] != VERSION:
        raise ValueError(f"{path}: unreadable {name}")
    return tuple(Entry(*fields) for fields in _ENTRY.iter_unpack(data[_HEADER.size:]))


def write(path: str, entries: tuple[Entry, ...], name: str = ACCESS) -> None:
    """Set ``path``'s ACL to ``entries`` (sorted here as the kernel requires).

    The kernel refuses (``EINVAL``) an ACL that lacks one of USER_OBJ, GROUP_OBJ and OTHER, or
    that has named entries and no MASK.
    """
    ordered = sorted(entries, key=lambda entry: (entry.tag, entry.id))
    os.setxattr(path, name, _HEADER.pack(VERSION) + b"".join(_ENTRY.pack(*entry) for entry in ordered))


def grant(path: str, users: dict[int, int], *, inherited: bool = True) -> None:
    """Give each uid in ``users`` its permission bits on ``path`` (an ACL of those entries and the
    owner's, group's and others' bits of its mode, replacing any it had); on a directory,
    ``inherited`` makes every entry created beneath it inherit the same ACL. ``OSError`` where
    the file system keeps no ACLs."""
    mode = os.stat(path).st_mode
    base = (Entry(USER_OBJ, mode >> 6 & 7), Entry(GROUP_OBJ, mode >> 3 & 7), Entry(OTHER, mode & 7))
    named = tuple(Entry(USER, perm, uid) for uid, perm in users.items())
    mask = Entry(MASK, functools.reduce(operator.or_, (entry.perm for entry in named), mode >> 3 & 7))
    write(path, (*base, *named, mask))
    if inherited and stat.S_ISDIR(mode):
        write(path, (*base, *named, mask), DEFAULT)


def permits(info: os.stat_result, acl: tuple[Entry, ...] | None, uid: int, gids: frozenset[int], want: int) -> bool:
    """True when a process of ``uid`` in the groups ``gids``, without ``CAP_DAC_OVERRIDE``, may
    ``want`` (``READ | WRITE | EXECUTE`` bits) on the file ``info`` describes, whose ACL is ``acl``."""
    if info.st_uid == uid:
        return want & ~(info.st_mode >> 6) & 7 == 0
    if acl is not None and info.st_mode & stat.S_IRWXG:
        return _acl_permits(info, acl, uid, gids, want)
    bits = info.st_mode >> 3 if info.st_gid in gids else info.st_mode
    return want & ~bits & 7 == 0


def _acl_permits(info: os.stat_result, acl: tuple[Entry, ...], uid: int, gids: frozenset[int], want: int) -> bool:
    mask = next((entry.perm for entry in acl if entry.tag == MASK), 7)
    group_matched = False
    for entry in acl:
        if entry.tag == USER and entry.id == uid:
            return want & ~(entry.perm & mask) == 0
        if entry.tag in (GROUP_OBJ, GROUP) and (info.st_gid if entry.tag == GROUP_OBJ else entry.id) in gids:
            group_matched = True
            if want & ~entry.perm == 0:
                return want & ~(entry.perm & mask) == 0
        if entry.tag == OTHER:
            return not group_matched and want & ~entry.perm == 0
    return False

