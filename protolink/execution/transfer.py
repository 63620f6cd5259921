"""Files in and out of a directory as bounded streams: one file's bytes, or a tree as tar.

Both ends of a sandbox transfer run this module: the sandbox's server writes what is uploaded
and reads what is downloaded beneath its roots; the host client reads what it uploads and writes
what it downloads, with the local directory as the root. The side that writes trusts nothing it
receives:

- paths are checked as the file tools check them (:mod:`.paths`): lexically beneath a root,
  then walked one directory descriptor at a time with ``O_NOFOLLOW``, so no symlink is followed,
  whether it was there before or a member of the same archive made it;
- a tar member is refused (:class:`ArchiveError`) for an absolute or ``..`` name, a hard link, a
  device, FIFO or other special type, set-id bits, a symlink whose target leaves the destination
  (unless the caller keeps such links, as links), or a name given twice;
- every stream stops at its :class:`TransferLimits` (:class:`TransferLimitError`);
- a tree is extracted into a private sibling directory and renamed into place at the end, a file
  written to a temporary sibling and renamed or linked: a failed transfer leaves nothing.
  A transfer that was killed leaves its sibling (``.protolink-transfer-`` and 16 hex digits);
  the next transfer into that directory removes such leftovers when no other transfer is under
  way there. Each transfer holds a shared ``flock`` on the directory while it runs, and only
  the one that gets it exclusively sweeps, so a sibling in use is never touched.

Reading never follows a link either: a tree is walked by descriptors, symlinks are stored as
symlinks and special files are skipped and reported. The tar is built while it is read, one
header and one chunk at a time, so neither side holds a tree in memory.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shutil
import stat
import tarfile
from collections.abc import Generator, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, fields
from typing import BinaryIO, Literal

from protolink.errors import ArchiveError, TransferLimitError

from .paths import (
    MAX_PATH_CHARS,
    OpenedFile,
    WorkspacePath,
    lstat_at,
    open_child_directory,
    open_directory,
    open_flags,
    open_regular_at,
    resolve_under_roots,
)

Kind = Literal["file", "tar"]

MiB = 1024 * 1024
GiB = 1024 * MiB
#: Bytes per read, write and message: large enough that per-message costs vanish beside the
#: copy, small enough that a transfer holds a few of them at most (well under the default gRPC
#: message limit of 32 MiB).
CHUNK_BYTES = 1 * MiB
#: Mode of a file uploaded without one, and of a directory a tar implies without naming it.
FILE_MODE, DIRECTORY_MODE = 0o644, 0o755
#: What a tar may spend beyond its contents on each entry: a header, a pax header holding a long
#: name and link name, and the padding of both, so a stream of headers alone stays bounded.
ENTRY_OVERHEAD_BYTES = 4 * tarfile.BLOCKSIZE + 2 * MAX_PATH_CHARS
_TEMP_PREFIX = ".protolink-transfer-"
#: What a killed transfer leaves; nothing else is ever removed as a leftover.
_LEFTOVER = re.compile(re.escape(_TEMP_PREFIX) + "[0-9a-f]{16}")
#: An existing tree that an overwrite moves aside, until the new one is in place: not a
#: leftover, so a transfer killed between the two renames loses neither.
_ASIDE_PREFIX = ".protolink-replaced-"
_NEW_FILE_FLAGS = open_flags("O_WRONLY", "O_CREAT", "O_EXCL", "O_NOFOLLOW", "O_CLOEXEC")
_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)


@dataclass(frozen=True)
class TransferLimits:
    """Bounds of one transfer; each must be at least 1.

    The defaults follow a sandbox's default limits: its writable roots may grow by 1 GiB
    (``Limits.disk_bytes``), which is also the largest file a process there may write, so a
    larger upload could not land. Depth and path length stay far below what the kernel accepts
    (4096 bytes a path), so a tree that fits can be used by ordinary tools.
    """

    max_total_bytes: int = 1 * GiB
    max_file_bytes: int = 1 * GiB
    max_entries: int = 100_000
    max_path_chars: int = 1024
    max_depth: int = 64

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field.name} must be a whole number of at least 1, not {value!r}")
        if self.max_path_chars > MAX_PATH_CHARS:
            raise ValueError(f"max_path_chars must be at most {MAX_PATH_CHARS}")

    def within(self, other: TransferLimits) -> TransferLimits:
        """Each bound the smaller of this one's and ``other``'s."""
        return TransferLimits(**{f.name: min(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)})

    @property
    def max_archive_bytes(self) -> int:
        """The most a tar within these limits can be, headers and padding included."""
        return self.max_total_bytes + (self.max_entries + 2) * ENTRY_OVERHEAD_BYTES


DEFAULT_LIMITS = TransferLimits()


@dataclass(frozen=True)
class TransferResult:
    """What a transfer moved: ``path`` where it landed (or was read), ``kind``, how many regular
    files, directories and symlinks, the files' bytes, and what was skipped (special files found
    while reading a tree, by relative path)."""

    path: str
    kind: Kind
    files: int = 0
    directories: int = 0
    symlinks: int = 0
    bytes: int = 0
    skipped: tuple[str, ...] = ()


# Writing ----------------------------------------------------------------------------------


def receive(destination: str, roots: Sequence[str], kind: Kind, chunks: Iterable[bytes], *, overwrite: bool = False,
            mode: int | None = None, keep_outside_symlinks: bool = False,
            limits: TransferLimits = DEFAULT_LIMITS) -> TransferResult:
    """Write ``chunks`` to ``destination`` beneath ``roots``: a file's bytes (``mode``, 0644 by
    default), or a tar extracted as the directory ``destination``.

    The parent must exist; ``destination`` must not, unless ``overwrite`` (a tree then replaces
    the tree there, a file the file). Symlinks whose target leaves the destination are refused
    unless ``keep_outside_symlinks`` (they are then kept as links, never followed). Raises
    ArchiveError, TransferLimitError, and the path rules' ValueError and OSError; nothing is left
    of a failed transfer.
    """
    if kind not in ("file", "tar"):
        raise ValueError(f"kind must be 'file' or 'tar', not {kind!r}")
    if mode is not None and not 0 <= mode <= 0o777:
        raise ValueError(f"mode {mode:#o} is not a permission mode (set-id bits are refused)")
    target = _named(destination, roots)
    with open_directory(target.parent) as parent_fd:
        _settle(parent_fd)
        if not overwrite:
            _require_absent(parent_fd, target)
        if kind == "file":
            return _receive_file(parent_fd, target, chunks, overwrite, FILE_MODE if mode is None else mode, limits)
        extraction = _Extraction(target.path, keep_outside_symlinks, limits)
        with _temporary_directory(parent_fd) as (temp_name, temp_fd):
            stream = _ChunkReader(chunks, limits.max_archive_bytes)
            result = extraction.run(stream, temp_fd)
            stream.drain()  # what follows the archive's end, so a stream that fails after it fails the transfer
            _replace(parent_fd, temp_name, target, overwrite)
        return result


def _receive_file(parent_fd: int, target: WorkspacePath, chunks: Iterable[bytes], overwrite: bool, mode: int,
                  limits: TransferLimits) -> TransferResult:
    name = _temporary_name()
    try:
        with open(os.open(name, _NEW_FILE_FLAGS, 0o600, dir_fd=parent_fd), "wb", buffering=0) as file:
            size = _copy(chunks, file, min(limits.max_file_bytes, limits.max_total_bytes), target.path)
            os.fchmod(file.fileno(), mode)
        if overwrite:
            os.rename(name, target.name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        else:  # a link, unlike a rename, refuses a name that appeared meanwhile
            os.link(name, target.name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd, follow_symlinks=False)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(name, dir_fd=parent_fd)
    return TransferResult(target.path, "file", files=1, bytes=size)


class _Extraction:
    """Extracts one tar stream into an empty directory, member by member, refusing what is unsafe."""

    def __init__(self, path: str, keep_outside_symlinks: bool, limits: TransferLimits) -> None:
        self._path = path
        self._keep_outside_symlinks = keep_outside_symlinks
        self._limits = limits
        self._counts = {"files": 0, "directories": 0, "symlinks": 0, "bytes": 0}
        self._entries = 0
        self._seen: set[tuple[str, ...]] = set()
        self._directory_modes: dict[tuple[str, ...], int] = {}

    def run(self, stream: BinaryIO, root_fd: int) -> TransferResult:
        with _Directories(root_fd, self._path) as directories:
            try:
                archive = tarfile.open(fileobj=stream, mode="r|", encoding="utf-8", errors="surrogateescape")
            except tarfile.TarError as error:
                raise ArchiveError(f"the archive for {self._path} is not a tar: {error}") from None
            with archive:
                try:
                    for member in archive:
                        self._extract(archive, member, directories)
                except tarfile.TarError as error:
                    raise ArchiveError(f"the archive for {self._path} is malformed: {error}") from None
            modes = {(): DIRECTORY_MODE, **dict.fromkeys(directories.created, DIRECTORY_MODE), **self._directory_modes}
            # Deepest first, so a directory without write permission is finished last.
            for parts, mode in sorted(modes.items(), key=lambda item: -len(item[0])):
                os.fchmod(directories.open(parts, create=False), mode)
        return TransferResult(self._path, "tar", **self._counts)

    def _extract(self, archive: tarfile.TarFile, member: tarfile.TarInfo, directories: _Directories) -> None:
        self._entries += 1
        if self._entries > self._limits.max_entries:
            raise TransferLimitError(f"the archive for {self._path} holds more than {self._limits.max_entries} entries")
        parts = self._parts(member.name)
        if member.mode & (stat.S_ISUID | stat.S_ISGID):
            raise ArchiveError(f"{member.name!r} has set-id bits")
        if member.isdir():
            self._directory_modes[parts] = member.mode & 0o777
            if parts:
                directories.open(parts, create=True)
            self._counts["directories"] += 1
            return
        if not parts:
            raise ArchiveError(f"{member.name!r} names the destination itself, which is a directory")
        if parts in self._seen:
            raise ArchiveError(f"{member.name!r} appears twice in the archive")
        self._seen.add(parts)
        if member.type in _FILE_TYPES:
            self._file(archive, member, parts, directories)
        elif member.issym():
            self._symlink(member, parts, directories)
        elif member.islnk():
            raise ArchiveError(f"{member.name!r} is a hard link; hard links are refused")
        else:
            raise ArchiveError(f"{member.name!r} is a special file (device, FIFO or other); it is refused")

    def _parts(self, name: str) -> tuple[str, ...]:
        if len(name) > self._limits.max_path_chars:
            raise TransferLimitError(f"a name in the archive is longer than {self._limits.max_path_chars} characters")
        if "\0" in name or name.startswith("/"):
            raise ArchiveError(f"{name!r} is an absolute name")
        parts = tuple(part for part in name.split("/") if part not in ("", "."))
        if ".." in parts:
            raise ArchiveError(f"{name!r} contains '..'")
        if len(parts) > self._limits.max_depth:
            raise TransferLimitError(f"{name!r} is deeper than {self._limits.max_depth} levels")
        return parts

    def _file(self, archive: tarfile.TarFile, member: tarfile.TarInfo, parts: tuple[str, ...],
              directories: _Directories) -> None:
        if member.size > self._limits.max_file_bytes:
            raise TransferLimitError(f"{member.name!r} is {member.size} bytes; the limit is "
                                     f"{self._limits.max_file_bytes}")
        if self._counts["bytes"] + member.size > self._limits.max_total_bytes:
            raise TransferLimitError(f"the archive for {self._path} holds more than "
                                     f"{self._limits.max_total_bytes} bytes of files")
        parent = directories.open(parts[:-1], create=True)
        try:
            fd = os.open(parts[-1], _NEW_FILE_FLAGS, 0o600, dir_fd=parent)
        except FileExistsError:
            raise ArchiveError(f"{member.name!r} is already in the destination") from None
        try:
            source = archive.extractfile(member)
            assert source is not None  # a regular member always has data
            with os.fdopen(fd, "wb", buffering=0, closefd=False) as file:
                _copy(iter(lambda: source.read(CHUNK_BYTES), b""), file, member.size, member.name)
            os.fchmod(fd, member.mode & 0o777)
            with suppress(OverflowError, ValueError):  # a time the file system cannot hold
                os.utime(fd, (member.mtime, member.mtime))
        finally:
            os.close(fd)
        self._counts["files"] += 1
        self._counts["bytes"] += member.size

    def _symlink(self, member: tarfile.TarInfo, parts: tuple[str, ...], directories: _Directories) -> None:
        target = member.linkname
        if not target or "\0" in target or len(target) > self._limits.max_path_chars:
            raise ArchiveError(f"{member.name!r} is a symlink with an invalid target")
        if not self._keep_outside_symlinks and not _stays_inside(parts[:-1], target):
            raise ArchiveError(f"{member.name!r} is a symlink to {target!r}, outside the destination")
        try:
            os.symlink(target, parts[-1], dir_fd=directories.open(parts[:-1], create=True))
        except FileExistsError:
            raise ArchiveError(f"{member.name!r} is already in the destination") from None
        self._counts["symlinks"] += 1


class _Directories:
    """Directory descriptors beneath a root descriptor, opened (and created) one component at a
    time with ``O_NOFOLLOW``; the descriptors of the last path stay open, since a tar lists a
    directory's entries together."""

    def __init__(self, root_fd: int, path: str) -> None:
        self._root_fd = root_fd
        self._path = path
        self._open: list[tuple[str, int]] = []
        self.created: list[tuple[str, ...]] = []

    def __enter__(self) -> _Directories:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._close_from(0)

    def open(self, parts: tuple[str, ...], *, create: bool) -> int:
        kept = 0
        while kept < min(len(parts), len(self._open)) and self._open[kept][0] == parts[kept]:
            kept += 1
        self._close_from(kept)
        for index in range(kept, len(parts)):
            parent = self._open[-1][1] if self._open else self._root_fd
            self._open.append((parts[index], self._child(parent, parts[: index + 1], create)))
        return self._open[-1][1] if self._open else self._root_fd

    def _child(self, parent: int, parts: tuple[str, ...], create: bool) -> int:
        name, where = parts[-1], "/".join(parts)
        if create:
            # Something there already: a directory, or what is refused below. gVisor answers
            # ENOENT, not EEXIST, for a symlink to nothing.
            with suppress(FileExistsError, FileNotFoundError):
                os.mkdir(name, 0o700, dir_fd=parent)
                self.created.append(parts)
        try:
            return open_child_directory(parent, name, f"{self._path}/{where}")
        except (ValueError, NotADirectoryError, FileNotFoundError):
            raise ArchiveError(f"{where!r} is not a directory the archive made (a symlink or a file); "
                               "nothing is written through it") from None

    def _close_from(self, index: int) -> None:
        while len(self._open) > index:
            os.close(self._open.pop()[1])


def _stays_inside(directory: tuple[str, ...], target: str) -> bool:
    """Whether the symlink ``target``, read in ``directory`` (parts beneath the destination),
    names something beneath the destination."""
    if target.startswith("/"):
        return False
    depth = len(directory)
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part not in ("", "."):
            depth += 1
    return True


def _settle(parent_fd: int) -> None:
    """Hold the directory ``parent_fd`` for a transfer (a shared lock, until the descriptor
    closes); first, when no transfer is under way there, remove what killed ones left."""
    try:
        fcntl.flock(parent_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # another transfer is under way: its sibling is not a leftover
        pass
    except OSError:  # a file system without locks: nothing can tell a leftover from a sibling in use
        return
    else:
        with os.scandir(parent_fd) as entries:
            leftovers = [entry.name for entry in entries if _LEFTOVER.fullmatch(entry.name)]
        for name in leftovers:
            with suppress(OSError):  # one this user cannot remove stays
                _remove(parent_fd, name)
    fcntl.flock(parent_fd, fcntl.LOCK_SH)


def _replace(parent_fd: int, temp_name: str, target: WorkspacePath, overwrite: bool) -> None:
    """Rename the finished tree ``temp_name`` to the target; with ``overwrite``, whatever is
    there first moves aside, and is removed once the new tree is in place."""
    if not overwrite:
        _require_absent(parent_fd, target)
        os.rename(temp_name, target.name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        return
    aside = _temporary_name(_ASIDE_PREFIX)
    try:
        os.rename(target.name, aside, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    except FileNotFoundError:
        os.rename(temp_name, target.name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        return
    try:
        os.rename(temp_name, target.name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    except BaseException:
        os.rename(aside, target.name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        raise
    doomed = _temporary_name()  # a leftover, should this transfer be killed while removing it
    os.rename(aside, doomed, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    _remove(parent_fd, doomed)


def _require_absent(parent_fd: int, target: WorkspacePath) -> None:
    with suppress(FileNotFoundError):
        lstat_at(parent_fd, target.name, target.path)
        raise FileExistsError(17, f"{target.path} exists; pass overwrite=True to replace it")


@contextmanager
def _temporary_directory(parent_fd: int) -> Iterator[tuple[str, int]]:
    """A new private directory in ``parent_fd``, removed with everything in it unless it was
    renamed away."""
    name = _temporary_name()
    os.mkdir(name, 0o700, dir_fd=parent_fd)
    try:
        fd = open_child_directory(parent_fd, name, name)
        try:
            yield name, fd
        finally:
            os.close(fd)
    finally:
        _remove(parent_fd, name)


def _remove(parent_fd: int, name: str) -> None:
    """Remove ``name`` in ``parent_fd`` if it is there: a tree (walked by descriptors, following
    no link), a file or a link."""
    try:
        entry = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(entry.st_mode):
        _make_removable(parent_fd, name)
        shutil.rmtree(name, dir_fd=parent_fd)
    else:
        os.unlink(name, dir_fd=parent_fd)


def _make_removable(parent_fd: int, name: str) -> None:
    """Give the owner write and search permission on every directory of the tree ``name`` (an
    archive may have made some read-only), walking by descriptors."""
    with suppress(OSError):
        fd = open_child_directory(parent_fd, name, name)
        try:
            os.fchmod(fd, 0o700)
            for entry in os.scandir(fd):
                if entry.is_dir(follow_symlinks=False):
                    _make_removable(fd, entry.name)
        finally:
            os.close(fd)


def _temporary_name(prefix: str = _TEMP_PREFIX) -> str:
    return f"{prefix}{secrets.token_hex(8)}"


def _copy(chunks: Iterable[bytes], file: BinaryIO, limit: int, what: str) -> int:
    """Write ``chunks`` to ``file``; TransferLimitError past ``limit`` bytes."""
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise TransferLimitError(f"{what} is larger than {limit} bytes")
        file.write(chunk)
    return size


class _ChunkReader:
    """A read-only binary stream over an iterable of chunks (tarfile's stream mode reads it),
    refusing more than ``limit`` bytes."""

    def __init__(self, chunks: Iterable[bytes], limit: int) -> None:
        self._chunks = iter(chunks)
        self._buffer = memoryview(b"")
        self._limit = limit
        self._total = 0

    def read(self, size: int = -1) -> bytes:
        pieces: list[bytes] = []
        wanted = size if size >= 0 else self._limit + 1
        while wanted > 0:
            if not self._buffer:
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self._total += len(chunk)
                if self._total > self._limit:
                    raise TransferLimitError(f"the archive is larger than {self._limit} bytes")
                self._buffer = memoryview(chunk)
            piece, self._buffer = self._buffer[:wanted], self._buffer[wanted:]
            pieces.append(bytes(piece))
            wanted -= len(piece)
        return b"".join(pieces)

    def drain(self) -> None:
        """Read to the end, within the limit."""
        while self.read(CHUNK_BYTES):
            pass


# Reading ----------------------------------------------------------------------------------


class Source:
    """What :func:`open_source` found: its ``path`` and ``kind``. Iterating yields its bytes (a
    tree as tar), once; :attr:`result` then says what was sent."""

    def __init__(self, path: str, kind: Kind, chunks: Generator[bytes, None, TransferResult]) -> None:
        self.path = path
        self.kind: Kind = kind
        self.result: TransferResult | None = None
        self._chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        """The bytes, in pieces of about :data:`CHUNK_BYTES` (a tree's small headers and files
        joined), so a message or a frame carries more than a few hundred bytes."""
        pending: list[bytes] = []
        size = 0
        while True:
            try:
                piece = next(self._chunks)
            except StopIteration as stop:
                self.result = stop.value
                break
            if len(piece) >= CHUNK_BYTES:
                if pending:
                    yield b"".join(pending)
                    pending, size = [], 0
                yield piece
                continue
            pending.append(piece)
            size += len(piece)
            if size >= CHUNK_BYTES:
                yield b"".join(pending)
                pending, size = [], 0
        if pending:
            yield b"".join(pending)


@contextmanager
def open_source(path: str, roots: Sequence[str], *, limits: TransferLimits = DEFAULT_LIMITS) -> Iterator[Source]:
    """The regular file or directory at ``path`` beneath ``roots``, ready to be read as a
    :class:`Source`; a symlink or special file at ``path`` is refused (ValueError)."""
    target = resolve_under_roots(path, roots)
    with ExitStack() as stack:
        if not target.parts:
            fd = stack.enter_context(open_directory(target))
            yield Source(target.path, "tar", _TreeArchive(target.path, limits).chunks(fd))
            return
        parent = stack.enter_context(open_directory(target.parent))
        if stat.S_ISDIR(lstat_at(parent, target.name, target.path).st_mode):
            fd = open_child_directory(parent, target.name, target.path)
            stack.callback(os.close, fd)
            yield Source(target.path, "tar", _TreeArchive(target.path, limits).chunks(fd))
            return
        opened = stack.enter_context(open_regular_at(parent, target.name, target.path))
        yield Source(target.path, "file", _file_chunks(opened, limits))


def _file_chunks(opened: OpenedFile, limits: TransferLimits) -> Generator[bytes, None, TransferResult]:
    limit = min(limits.max_file_bytes, limits.max_total_bytes)
    if opened.stat.st_size > limit:
        raise TransferLimitError(f"{opened.path} is {opened.stat.st_size} bytes; the limit is {limit}")
    size = 0
    while chunk := os.read(opened.fd, CHUNK_BYTES):
        size += len(chunk)
        if size > limit:
            raise TransferLimitError(f"{opened.path} grew past the {limit}-byte limit while it was read")
        yield chunk
    return TransferResult(opened.path, "file", files=1, bytes=size)


class _TreeArchive:
    """A tar of a directory tree, built while the tree is walked by descriptors."""

    def __init__(self, path: str, limits: TransferLimits) -> None:
        self._path = path
        self._limits = limits
        self._counts = {"files": 0, "directories": 0, "symlinks": 0, "bytes": 0}
        self._entries = 0
        self._skipped: list[str] = []

    def chunks(self, root_fd: int) -> Generator[bytes, None, TransferResult]:
        yield from self._directory(root_fd, ())
        yield bytes(2 * tarfile.BLOCKSIZE)  # the end of the archive
        return TransferResult(self._path, "tar", **self._counts, skipped=tuple(self._skipped))

    def _directory(self, fd: int, parts: tuple[str, ...]) -> Iterator[bytes]:
        with os.scandir(fd) as entries:
            names = sorted(entry.name for entry in entries)
        for name in names:
            child = (*parts, name)
            relative = "/".join(child)
            where = f"{self._path}/{relative}"
            try:
                entry = lstat_at(fd, name, where)
            except FileNotFoundError:
                continue  # removed while the tree was read
            if stat.S_ISDIR(entry.st_mode):
                yield self._header(child, tarfile.DIRTYPE, entry)
                self._counts["directories"] += 1
                child_fd = open_child_directory(fd, name, where)
                try:
                    yield from self._directory(child_fd, child)
                finally:
                    os.close(child_fd)
            elif stat.S_ISREG(entry.st_mode):
                with open_regular_at(fd, name, where) as opened:
                    yield from self._file(child, opened)
            elif stat.S_ISLNK(entry.st_mode):
                yield self._header(child, tarfile.SYMTYPE, entry, linkname=os.readlink(name, dir_fd=fd))
                self._counts["symlinks"] += 1
            else:
                self._skipped.append(relative)

    def _file(self, parts: tuple[str, ...], opened: OpenedFile) -> Iterator[bytes]:
        size = opened.stat.st_size
        if size > self._limits.max_file_bytes:
            raise TransferLimitError(f"{opened.path} is {size} bytes; the limit is {self._limits.max_file_bytes}")
        if self._counts["bytes"] + size > self._limits.max_total_bytes:
            raise TransferLimitError(f"{self._path} holds more than {self._limits.max_total_bytes} bytes of files")
        yield self._header(parts, tarfile.REGTYPE, opened.stat, size=size)
        remaining = size
        while remaining:
            chunk = os.read(opened.fd, min(remaining, CHUNK_BYTES))
            if not chunk:
                raise ValueError(f"{opened.path} shrank while it was read")
            remaining -= len(chunk)
            yield chunk
        if padding := -size % tarfile.BLOCKSIZE:
            yield bytes(padding)
        self._counts["files"] += 1
        self._counts["bytes"] += size

    def _header(self, parts: tuple[str, ...], type: bytes, entry: os.stat_result, *, size: int = 0,
                linkname: str = "") -> bytes:
        self._entries += 1
        if self._entries > self._limits.max_entries:
            raise TransferLimitError(f"{self._path} holds more than {self._limits.max_entries} entries")
        name = "/".join(parts)
        if len(parts) > self._limits.max_depth:
            raise TransferLimitError(f"{self._path}/{name} is deeper than {self._limits.max_depth} levels")
        if len(name) > self._limits.max_path_chars or len(linkname) > self._limits.max_path_chars:
            raise TransferLimitError(f"a name in {self._path} is longer than {self._limits.max_path_chars} characters")
        info = tarfile.TarInfo(name)
        info.type, info.size, info.linkname = type, size, linkname
        info.mode = stat.S_IMODE(entry.st_mode) & 0o777  # never set-id bits, nor the sticky bit
        info.mtime = int(entry.st_mtime)
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _named(path: str, roots: Sequence[str]) -> WorkspacePath:
    target = resolve_under_roots(path, roots)
    if not target.parts:
        raise ValueError(f"{target.path} is a root; name a file or directory beneath it")
    return target
