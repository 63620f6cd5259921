"""Host directories that only their owner can open: where sandbox sockets and secrets live."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from protolink.errors import SandboxError


def runtime_dir() -> Path:
    """This user's private directory for sandbox sockets, created 0700 when missing.

    ``PROTOLINK_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/protolink``, else
    ``/tmp/protolink-<uid>``. An existing directory that another user owns, or that others can
    open, is refused rather than used.
    """
    explicit = os.environ.get("PROTOLINK_RUNTIME_DIR")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(explicit) if explicit else Path(xdg) / "protolink" if xdg else Path(f"/tmp/protolink-{os.getuid()}")
    return owner_only_dir(path, "PROTOLINK_RUNTIME_DIR", "the sandbox runtime directory")


def owner_only_dir(path: Path, variable: str, what: str) -> Path:
    """``path``, created 0700 when missing; SandboxError when it is not a directory of this user
    that only this user can open (``variable`` is the setting that moves it elsewhere)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
    except OSError as error:
        raise SandboxError(f"cannot create {what} {path}: {error}") from error
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise SandboxError(
            f"{path} must be a directory owned by uid {os.getuid()} that only its owner can open "
            f"(found uid {info.st_uid}, mode {stat.filemode(info.st_mode)}); remove it or set {variable}"
        )
    return path


#: The longest path a Unix socket can have (``sun_path`` holds 108 bytes, its NUL among them).
MAX_SOCKET_PATH_BYTES = 107
#: The longest name of a socket the host keeps in a private directory (``sandbox.sock``, ...).
SOCKET_NAME_BYTES = 16
#: How much of a name a private directory's name keeps: its random end makes it unique.
NAME_CHARS = 24
#: The random end of a private directory's name, in hex digits.
RANDOM_CHARS = 8


def private_subdir(name: str) -> Path:
    """A new 0700 directory inside :func:`runtime_dir`, named after ``name``, that can hold
    the host's sockets: SandboxError when the runtime directory is too deep for their paths."""
    base = runtime_dir()
    longest = len(os.fsencode(base)) + 1 + NAME_CHARS + 1 + RANDOM_CHARS + 1 + SOCKET_NAME_BYTES
    if longest > MAX_SOCKET_PATH_BYTES:
        raise SandboxError(f"the sandbox runtime directory {base} is too long for the paths of Unix sockets in it "
                           f"(at most {MAX_SOCKET_PATH_BYTES} bytes); set PROTOLINK_RUNTIME_DIR to a shorter one")
    while True:
        path = base / f"{name[:NAME_CHARS]}-{os.urandom(RANDOM_CHARS // 2).hex()}"
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            continue


def write_private(path: Path | str, text: str) -> None:
    """Write ``text`` to a file only its owner can read (mode 0600 from creation), whole: it is
    written beside ``path`` and renamed over it, so a reader finds the old text or the new, never
    an empty or half-written file (a rename replaces a symlink there, never follows it)."""
    path = Path(path)
    fd, written = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(written, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(written)
        raise
