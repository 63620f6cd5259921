"""The file system as a recoverable :class:`~protolink.core.resources.Resource`: regular files
beneath explicit roots, read and conditionally replaced through a workspace backend."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from protolink.revisions import ResourceRevision, ResourceSnapshot

from .backends import WorkspaceBackend
from .paths import canonical_roots, canonical_target

DEFAULT_MAX_FILE_BYTES = 8 * 1024 * 1024


class FilesystemResource:
    """Regular files beneath explicit roots as a Resource; resource ids are absolute paths.

    Reads and conditional replacements go through a workspace backend (the host by default),
    which applies the descriptor-based path rules next to the files. A resource id may spell a
    root through an alias; snapshots name the file through the root's real path.
    """

    def __init__(self, roots: Sequence[str | os.PathLike[str]], *, backend: WorkspaceBackend | None = None,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> None:
        if max_file_bytes < 1:
            raise ValueError("max_file_bytes must be >= 1")
        if backend is None:
            from .local import (
                LocalExecutionBackend,  # the host, unless a backend is given
            )

            backend = LocalExecutionBackend()
        self.roots = canonical_roots(roots)
        self.backend = backend
        self.max_file_bytes = max_file_bytes

    async def read(self, resource_id: str) -> ResourceSnapshot:
        """The file's bytes, mode and identity; an absent file yields ``exists=False``."""
        path = (await asyncio.to_thread(canonical_target, resource_id, self.roots)).path
        return await self.backend.snapshot_file(path, roots=self.roots, max_file_bytes=self.max_file_bytes)

    async def replace(self, expected_snapshot: ResourceSnapshot, data: bytes | None,
                      mode: int | None) -> ResourceRevision:
        """Atomically write (or with ``data=None`` remove) the file if it still matches."""
        if data is not None and len(data) > self.max_file_bytes:
            raise ValueError(f"content is {len(data)} bytes; the limit is {self.max_file_bytes}")
        return await self.backend.replace_file(expected_snapshot.revision, data, mode, roots=self.roots)
