"""File snapshots and conditional, atomic replacement beneath the roots.

A replacement happens only while the target still matches the expected revision: bytes
(SHA-256 and size), mode bits, ``(device, inode)`` identity and the parent directory's
identity. New content goes to a temporary file in the same directory, is fsynced, and is
renamed over the target (replace) or hard-linked to it (create, which fails if the target
appeared meanwhile); the directory is fsynced afterwards. The final compare/rename is not a
lock: it narrows, but cannot close, the window for hostile concurrent writers.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress

from protolink.errors import ResourceConflictError, ResourceUnchangedError
from protolink.revisions import ResourceRevision, ResourceSnapshot, revision_of

from .paths import (
    WorkspacePath,
    lstat_at,
    open_directory,
    open_flags,
    open_regular_at,
    read_bounded,
    resolve_under_roots,
)

CREATE_MODE = 0o600
_TEMP_FLAGS = open_flags("O_WRONLY", "O_CREAT", "O_EXCL", "O_NOFOLLOW", "O_CLOEXEC")


def snapshot_file(path: str, roots: Sequence[str], *, max_file_bytes: int) -> ResourceSnapshot:
    """The regular file at ``path``: bytes, mode, identity and parent identity.

    An absent file (in an existing parent) yields ``exists=False`` with the parent's identity.
    FileNotFoundError when the parent is missing; ValueError for symlinks, special files,
    paths outside the roots and files over ``max_file_bytes``.
    """
    target = _file_target(path, roots)
    with open_directory(target.parent) as dir_fd:
        return _snapshot_at(dir_fd, target, max_file_bytes)


def replace_file(expected: ResourceRevision, data: bytes | None, mode: int | None,
                 roots: Sequence[str]) -> ResourceRevision:
    """Write ``data`` (or remove the file when None) if the target still matches ``expected``.

    ``expected.exists`` False creates the file (mode 0600 unless ``mode`` says otherwise);
    otherwise ``mode`` defaults to the expected mode. Raises ResourceConflictError when the
    target or its parent directory changed, and ResourceUnchangedError when the file system
    refused the write (read-only, full, ...): in both cases nothing was written. Any other error
    comes after the commit point. Returns what was written.
    """
    _require_complete(expected)
    target = _file_target(expected.resource_id, roots)
    if data is None and not expected.exists:
        raise ValueError(f"{target.path}: nothing to remove")
    if mode is None:
        mode = CREATE_MODE if not expected.exists or expected.mode is None else expected.mode
    _checked_mode(mode)
    with _approved_parent(target) as dir_fd:
        with _unchanged_on_failure(target):
            _require_unchanged(dir_fd, target, expected)
            written = _commit(dir_fd, target, expected, data, mode)
        # Past the commit point: an error here leaves the outcome uncertain for the caller.
        os.fsync(dir_fd)
    if data is None or written is None:
        return ResourceRevision(target.path, False, parent_identity=expected.parent_identity)
    return revision_of(target.path, data, mode=stat.S_IMODE(written.st_mode),
                       identity=(written.st_dev, written.st_ino), parent_identity=expected.parent_identity)


def _commit(dir_fd: int, target: WorkspacePath, expected: ResourceRevision, data: bytes | None,
            mode: int) -> os.stat_result | None:
    """Unlink, or write a temporary file and rename/link it into place; the commit is one system
    call that happens entirely or not at all. Returns the written file's status."""
    if data is None:
        os.unlink(target.name, dir_fd=dir_fd)
        return None
    with _temporary_file(dir_fd) as (temp_name, temp_fd):
        _write_all(temp_fd, data)
        os.fchmod(temp_fd, mode)
        os.fsync(temp_fd)
        written = os.fstat(temp_fd)
        if expected.exists:
            _require_unchanged(dir_fd, target, expected)
            os.rename(temp_name, target.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        else:
            _link_new(dir_fd, temp_name, target)
    return written


def _snapshot_at(dir_fd: int, target: WorkspacePath, max_bytes: int) -> ResourceSnapshot:
    parent = os.fstat(dir_fd)
    parent_identity = (parent.st_dev, parent.st_ino)
    try:
        with open_regular_at(dir_fd, target.name, target.path) as opened:
            data = read_bounded(opened, max_bytes)
    except FileNotFoundError:
        return ResourceSnapshot(ResourceRevision(target.path, False, parent_identity=parent_identity), None)
    revision = revision_of(target.path, data, mode=stat.S_IMODE(opened.stat.st_mode),
                           identity=(opened.stat.st_dev, opened.stat.st_ino), parent_identity=parent_identity)
    return ResourceSnapshot(revision, data)


def _require_unchanged(dir_fd: int, target: WorkspacePath, expected: ResourceRevision) -> None:
    # Metadata first: a file whose mode or identity changed is a conflict even when the change
    # also made it unreadable to us (a sandbox user, say).
    with suppress(FileNotFoundError):  # an absent file is reported by the snapshot below
        st = lstat_at(dir_fd, target.name, target.path)
        if expected.exists and (expected.mode not in (None, stat.S_IMODE(st.st_mode))
                                or expected.identity not in (None, (st.st_dev, st.st_ino))):
            raise ResourceConflictError(f"{target.path}: the file changed since it was approved")
    try:
        current = _snapshot_at(dir_fd, target, expected.size or 0).revision
    except ValueError as error:  # now a symlink, special file, or larger than expected
        raise ResourceConflictError(f"{target.path} changed since it was approved: {error}") from None
    if not expected.matches(current):
        what = "parent directory" if current.parent_identity != expected.parent_identity else "file"
        raise ResourceConflictError(f"{target.path}: the {what} changed since it was approved")


def _link_new(dir_fd: int, temp_name: str, target: WorkspacePath) -> None:
    # A hard link publishes the complete file at once and, unlike rename, refuses an existing name.
    try:
        os.link(temp_name, target.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except FileExistsError:
        raise ResourceConflictError(f"{target.path} was created concurrently") from None


@contextmanager
def _temporary_file(dir_fd: int) -> Iterator[tuple[str, int]]:
    """A new private file in ``dir_fd``, unlinked by name afterwards if it is still there."""
    name = f".protolink-{secrets.token_hex(8)}.tmp"
    fd = os.open(name, _TEMP_FLAGS, CREATE_MODE, dir_fd=dir_fd)
    try:
        yield name, fd
    finally:
        os.close(fd)
        # Renamed over the target, or a stray name left by a failing disk: neither is an error here.
        with suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)


@contextmanager
def _approved_parent(target: WorkspacePath) -> Iterator[int]:
    """The target's directory; the approved snapshot walked it, so failing to walk it now is a conflict."""
    with ExitStack() as stack:
        try:
            dir_fd = stack.enter_context(open_directory(target.parent))
        except (ValueError, FileNotFoundError, NotADirectoryError) as error:
            raise ResourceConflictError(
                f"{target.path}: a parent directory changed since it was approved: {error}") from None
        yield dir_fd


@contextmanager
def _unchanged_on_failure(target: WorkspacePath) -> Iterator[None]:
    try:
        yield
    except OSError as error:
        if isinstance(error, ResourceUnchangedError):
            raise
        raise ResourceUnchangedError.of(target.path, error) from error


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _file_target(path: str, roots: Sequence[str]) -> WorkspacePath:
    target = resolve_under_roots(path, roots)
    if not target.parts:
        raise ValueError(f"{target.path} is a root directory, not a file")
    return target


def _checked_mode(mode: int) -> None:
    if not 0 <= mode <= 0o7777:
        raise ValueError(f"mode {mode:#o} is not a permission mode")


def _require_complete(expected: ResourceRevision) -> None:
    needed = ("size", "sha256", "mode", "identity", "parent_identity") if expected.exists else ("parent_identity",)
    missing = [name for name in needed if getattr(expected, name) is None]
    if missing:
        raise ValueError(f"expected revision of {expected.resource_id} lacks {', '.join(missing)}")

