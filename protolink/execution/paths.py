"""Absolute paths beneath explicit roots, opened through directory descriptors.

Every workspace and document operation starts here. A path is checked lexically against the
roots (absolute, no ``..``, beneath a root), then opened one component at a time with
``openat``-style calls and ``O_NOFOLLOW``, so a symlink anywhere beneath a root is rejected
rather than followed, including one swapped in after the lexical check. Special files are
never opened for reading: their type is checked with ``fstatat`` first and again on the
opened descriptor.

Roots are their real paths, resolved at registration. Where the roots were registered (the
host), :func:`canonical_target` also accepts a root spelled through symlinks outside every root
(an alias, such as macOS ``/tmp`` for ``/private/tmp``) and respells the path through the
root's real path; every operation then names files by that canonical spelling.

These functions run wherever the files are (the host, or the server inside a sandbox), and
take the roots as explicit arguments. They are the POSIX descriptor-based boundary the spec
describes, not an OS sandbox.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

MAX_PATH_CHARS = 4096

EntryType = Literal["file", "directory", "other"]


def open_flags(*names: str) -> int:
    """``os.O_*`` flags by name; those Windows lacks count as 0 there, where
    :func:`require_posix` refuses every root before any flag is used."""
    flags = 0
    for name in names:
        flags |= getattr(os, name, 0)
    return flags


_DIRECTORY_FLAGS = open_flags("O_RDONLY", "O_DIRECTORY", "O_NOFOLLOW", "O_CLOEXEC")
# O_NONBLOCK: opening a FIFO swapped in after the type check must not wait for a writer.
_FILE_FLAGS = open_flags("O_RDONLY", "O_NOFOLLOW", "O_NONBLOCK", "O_NOCTTY", "O_CLOEXEC")


@dataclass(frozen=True)
class WorkspacePath:
    """A canonical absolute path split into the root that holds it and the parts beneath it."""

    root: str
    parts: tuple[str, ...]

    @property
    def path(self) -> str:
        return _join(self.root, self.parts)

    @property
    def name(self) -> str:
        """The last component; empty for the root itself."""
        return self.parts[-1] if self.parts else ""

    @property
    def parent(self) -> WorkspacePath:
        if not self.parts:
            raise ValueError(f"{self.root} is a root and has no parent beneath the roots")
        return WorkspacePath(self.root, self.parts[:-1])


@dataclass(frozen=True)
class OpenedFile:
    """A regular file opened for reading: its descriptor, its ``fstat`` and its path."""

    fd: int
    stat: os.stat_result
    path: str


def require_posix() -> None:
    """Raise RuntimeError unless descriptor-relative POSIX APIs are available (not Windows)."""
    if os.name != "posix" or os.open not in os.supports_dir_fd:
        raise RuntimeError("filesystem access requires POSIX descriptor-relative APIs; Windows is not supported")


def canonical_roots(roots: Iterable[str | os.PathLike[str]]) -> tuple[str, ...]:
    """Resolve explicit roots once, at registration: absolute existing directories, realpath'd.

    Aliases such as macOS ``/tmp`` become their real paths, so later checks are lexical plus
    descriptor walks that follow no symlink beneath a root (:func:`canonical_target` respells a
    requested path written through an alias).
    """
    require_posix()
    if isinstance(roots, (str, bytes, os.PathLike)):
        raise TypeError("roots must be a list of absolute paths, not a single path")
    resolved: list[str] = []
    for root in roots:
        text = os.fspath(root)
        if not isinstance(text, str) or not os.path.isabs(text) or "\0" in text:
            raise ValueError(f"root {text!r} must be an absolute POSIX path")
        real = os.path.realpath(text)
        if not os.path.isdir(real):
            raise ValueError(f"root {text!r} is not an existing directory")
        if real not in resolved:
            resolved.append(real)
    if not resolved:
        raise ValueError("at least one root is required")
    return tuple(resolved)


def resolve_under_roots(path: str, roots: Sequence[str]) -> WorkspacePath:
    """Check ``path`` lexically: absolute, without ``..``, beneath one of ``roots``.

    ``.`` and repeated slashes are normalized away. The deepest matching root wins. No file
    system access happens here; opening is done by :func:`open_directory` and friends.
    """
    target = _lexically_beneath(_checked_parts(path), roots)
    if target is None:
        raise _outside(path)
    return target


def canonical_target(path: str, roots: Sequence[str]) -> WorkspacePath:
    """``path`` beneath ``roots``, spelled through the root's real path (which the result names).

    A path written beneath a root's real path is taken as :func:`resolve_under_roots` takes it,
    without touching the file system. Otherwise its leading components may spell a root through
    symlinks outside every root (an alias: a link to the root or to one of its parents): they
    are resolved on this host, one at a time, until they name a root, and the rest is kept as
    written, so a symlink beneath the root is still rejected when the path is opened. Symlinks
    are followed only on the way to a root itself; ValueError when none is reached that way.
    """
    parts = _checked_parts(path)
    target = _lexically_beneath(parts, roots) or _through_alias(parts, roots)
    if target is None:
        raise _outside(path)
    return target


@contextmanager
def open_directory(target: WorkspacePath) -> Iterator[int]:
    """A descriptor for the directory ``target``, walked from its root without following symlinks."""
    fd = os.open(target.root, _DIRECTORY_FLAGS)
    try:
        for index, name in enumerate(target.parts):
            child = open_child_directory(fd, name, _join(target.root, target.parts[: index + 1]))
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


@contextmanager
def open_regular_at(dir_fd: int, name: str, path: str) -> Iterator[OpenedFile]:
    """Open the regular file ``name`` in ``dir_fd`` for reading.

    FileNotFoundError when absent; ValueError for a symlink, directory or special file (checked
    with ``fstatat`` before opening, so devices and FIFOs are never opened, and again on the
    descriptor in case the entry was swapped in between).
    """
    before = lstat_at(dir_fd, name, path)
    _require_regular(before, path)
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as error:
        raise _walk_error(error, path, dir_fd, name) from None
    try:
        opened = os.fstat(fd)
        _require_regular(opened, path)
        if (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino):
            raise ValueError(f"{path} changed while it was being opened")
        yield OpenedFile(fd, opened, path)
    finally:
        os.close(fd)


@contextmanager
def open_regular_file(path: str, roots: Sequence[str]) -> Iterator[OpenedFile]:
    """Open the regular file at ``path`` beneath ``roots`` for reading, following no symlink."""
    target = resolve_under_roots(path, roots)
    if not target.parts:
        raise ValueError(f"{target.path} is a directory, not a regular file")
    with open_directory(target.parent) as dir_fd, open_regular_at(dir_fd, target.name, target.path) as opened:
        yield opened


def read_descriptor(fd: int, limit: int) -> bytes:
    """Read from ``fd``'s current position until end of file, at most ``limit`` bytes."""
    chunks: list[bytes] = []
    remaining = limit
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_bounded(opened: OpenedFile, max_bytes: int) -> bytes:
    """All bytes of an opened file, refusing files larger than ``max_bytes`` (even ones that grow)."""
    if opened.stat.st_size > max_bytes:
        raise ValueError(f"{opened.path} is {opened.stat.st_size} bytes; the limit is {max_bytes}")
    data = read_descriptor(opened.fd, max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{opened.path} grew beyond the {max_bytes}-byte limit while being read")
    return data


def lstat_at(dir_fd: int, name: str, path: str) -> os.stat_result:
    """``fstatat`` without following symlinks; FileNotFoundError names ``path``."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"{path} does not exist") from None


def entry_type(mode: int) -> EntryType:
    """``"file"``, ``"directory"`` or ``"other"`` (symlinks, FIFOs, sockets, devices)."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    return "other"


def open_child_directory(dir_fd: int, name: str, path: str) -> int:
    """Open the subdirectory ``name`` of ``dir_fd``; symlinks and non-directories are rejected.

    The descriptor must be the entry ``fstatat`` then finds: gVisor follows a symlink to a
    directory opened with ``O_DIRECTORY | O_NOFOLLOW``, where Linux refuses it.
    """
    try:
        fd = os.open(name, _DIRECTORY_FLAGS, dir_fd=dir_fd)
    except OSError as error:
        raise _walk_error(error, path, dir_fd, name) from None
    try:
        entry = lstat_at(dir_fd, name, path)
        opened = os.fstat(fd)
        if stat.S_ISLNK(entry.st_mode):
            raise ValueError(f"{path} is a symlink; symlinks beneath roots are rejected")
        if (entry.st_dev, entry.st_ino) != (opened.st_dev, opened.st_ino):
            raise ValueError(f"{path} changed while it was being opened")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _walk_error(error: OSError, path: str, dir_fd: int, name: str) -> Exception:
    if error.errno == errno.ENOENT:
        return FileNotFoundError(errno.ENOENT, f"{path} does not exist")
    if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            mode = 0
        if stat.S_ISLNK(mode):
            return ValueError(f"{path} is a symlink; symlinks beneath roots are rejected")
        return ValueError(f"{path} is not a directory")
    return error


def _require_regular(st: os.stat_result, path: str) -> None:
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISLNK(st.st_mode):
        raise ValueError(f"{path} is a symlink; symlinks beneath roots are rejected")
    if stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{path} is a directory, not a regular file")
    raise ValueError(f"{path} is a special file, not a regular file")


def _through_alias(parts: tuple[str, ...], roots: Sequence[str]) -> WorkspacePath | None:
    """Resolve ``parts`` one component at a time until the real path so far is a root."""
    real: tuple[str, ...] = ()
    for index, name in enumerate(parts):
        step = _join("/", (*real, name))
        try:
            if stat.S_ISLNK(os.lstat(step).st_mode):
                step = os.path.realpath(step, strict=True)
        except OSError:  # missing, not a directory, a symlink loop, not searchable
            return None
        real = _split(step)
        reached = _lexically_beneath(real, roots)
        if reached is not None:  # a root itself, or a directory beneath one reached by a symlink
            return _lexically_beneath((*real, *parts[index + 1:]), roots) if not reached.parts else None
    return None


def _checked_parts(path: str) -> tuple[str, ...]:
    """The components of an absolute path of at most MAX_PATH_CHARS, without NUL or ``..``."""
    if not isinstance(path, str) or not path:
        raise ValueError("path must be a non-empty string")
    if "\0" in path or len(path) > MAX_PATH_CHARS:
        raise ValueError(f"path must be at most {MAX_PATH_CHARS} characters without NUL")
    if not path.startswith("/"):
        raise ValueError(f"path {path!r} must be absolute")
    parts = _split(path)
    if ".." in parts:
        raise ValueError(f"path {path!r} must not contain '..'")
    return parts


def _lexically_beneath(parts: tuple[str, ...], roots: Sequence[str]) -> WorkspacePath | None:
    """The deepest root that ``parts`` lies beneath (or names), with the parts below it."""
    best: WorkspacePath | None = None
    for root in roots:
        root_parts = _checked_root(root)
        if parts[: len(root_parts)] == root_parts and (best is None or len(root_parts) > len(_split(best.root))):
            best = WorkspacePath(_join("/", root_parts), parts[len(root_parts):])
    return best


def _outside(path: str) -> ValueError:
    return ValueError(f"path {path!r} is not inside a configured root")


def _checked_root(root: str) -> tuple[str, ...]:
    if not isinstance(root, str) or not root.startswith("/") or "\0" in root:
        raise ValueError(f"root {root!r} must be an absolute path")
    parts = _split(root)
    if ".." in parts:
        raise ValueError(f"root {root!r} must be canonical")
    return parts


def _split(path: str) -> tuple[str, ...]:
    return tuple(part for part in path.split("/") if part not in ("", "."))


def _join(root: str, parts: Sequence[str]) -> str:
    return "/" + "/".join((*_split(root), *parts))
