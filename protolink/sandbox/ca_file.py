"""A certificate authority file for a sandbox's commands: checked, then copied, never mounted.

A sandbox given ``ca_file`` (:class:`~protolink.sandbox.config.SandboxConfig`) gets a copy of it
taken when it starts: what its commands trust is what was checked then, whatever later happens
to the host's file. :func:`read_ca_file` is the one check, :func:`copy_ca_file` the one copy.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from protolink.errors import CaFileError

#: The largest CA file taken (Debian's whole bundle is some 220 kB).
MAX_CA_BYTES = 4 << 20
#: What a PEM certificate starts with; a CA file holds at least one.
PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"


def read_ca_file(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the CA file at ``path`` (symlinks followed); CaFileError when it is missing,
    not a regular file, not readable, larger than :data:`MAX_CA_BYTES` or holds no
    :data:`PEM_CERTIFICATE`. Reads the file system."""
    name = os.fspath(path)
    try:  # O_NONBLOCK: a FIFO is refused, not waited on
        with open(name, "rb", opener=lambda file, flags: os.open(file, flags | os.O_NONBLOCK)) as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise CaFileError(f"ca_file {name} is not a regular file", path=name)
            data = file.read(MAX_CA_BYTES + 1)
    except OSError as error:
        raise CaFileError(f"ca_file {name}: {error.strerror}", path=name) from None
    if len(data) > MAX_CA_BYTES:
        raise CaFileError(f"ca_file {name} is larger than {MAX_CA_BYTES >> 20} MiB", path=name)
    if PEM_CERTIFICATE not in data:
        raise CaFileError(f"ca_file {name} holds no PEM certificate (no {PEM_CERTIFICATE.decode()} line)", path=name)
    return data


def copy_ca_file(source: str | os.PathLike[str], target: Path) -> None:
    """Write the CA file at ``source``, checked by :func:`read_ca_file`, to the new file
    ``target``, readable by every user (commands run as another uid)."""
    data = read_ca_file(source)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as file:
        os.fchmod(file.fileno(), 0o644)  # whatever the umask
        file.write(data)
