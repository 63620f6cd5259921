"""The egress daemon's record of its decisions: bounded JSON lines, one per event.

The daemon appends to ``NAME.egress.jsonl`` in the runtime directory; past ``max_bytes`` the
file becomes ``NAME.egress.jsonl.1`` (replacing the one before) and a new one starts, so the
two together never hold much more than twice ``max_bytes``. ``protolink-sandbox egress --log``
reads them back (:func:`recent`, :class:`Tail`) and prints each as one line (:func:`describe`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import deque
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .events import EgressEvent

MAX_BYTES = 1 << 20
#: A line longer than this is not one the daemon wrote: skipped when read back.
MAX_LINE = 8 * 1024


def stamp(epoch: float) -> str:
    """``epoch`` as ISO 8601, UTC, to the millisecond."""
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def previous(path: Path) -> Path:
    return path.with_name(path.name + ".1")


class EventLog:
    """Appends events to ``path`` (created 0600), rotating it past ``max_bytes``; what a
    previous log held there is removed."""

    def __init__(self, path: Path, *, max_bytes: int = MAX_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        previous(path).unlink(missing_ok=True)
        self._out = self._open()
        self._size = 0

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_TRUNC, 0o600)

    def write(self, event: EgressEvent) -> None:
        """Record ``event`` (an ``on_event`` callback): one line, one ``write``, no buffer."""
        line = json.dumps({"time": stamp(event.timestamp), **vars(event)}, separators=(",", ":")).encode() + b"\n"
        os.write(self._out, line)
        self._size += len(line)
        if self._size > self.max_bytes:
            os.close(self._out)
            os.replace(self.path, previous(self.path))
            self._out, self._size = self._open(), 0

    def close(self) -> None:
        os.close(self._out)


def _records(lines: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if len(line) > MAX_LINE:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by a rotation, or not ours
        if isinstance(record, dict):
            yield record


def recent(path: Path, count: int) -> list[dict[str, Any]]:
    """The last ``count`` events recorded at ``path`` (its previous part included), oldest first."""
    last: deque[dict[str, Any]] = deque(maxlen=count)
    for part in (previous(path), path):
        try:
            with part.open("rb") as lines:
                last.extend(_records(lines))
        except FileNotFoundError:
            continue
    return list(last)


class Tail:
    """What is appended to ``path`` from now on, across rotations: each :meth:`read` returns the
    events appended since the one before."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: IO[bytes] | None = None
        self._inode: int | None = None
        self._partial = b""
        with contextlib.suppress(FileNotFoundError):
            self._handle = path.open("rb")
            self._handle.seek(0, os.SEEK_END)
            self._inode = os.fstat(self._handle.fileno()).st_ino

    def read(self) -> list[dict[str, Any]]:
        found = self._drain()
        try:
            current: int | None = self.path.stat().st_ino
        except FileNotFoundError:
            current = None
        if current is not None and current != self._inode:  # rotated, or created
            if self._handle is not None:
                found += self._drain()  # what was appended just before the rotation
                self._handle.close()
            self._handle, self._inode, self._partial = self.path.open("rb"), current, b""
            found += self._drain()
        return found

    def _drain(self) -> list[dict[str, Any]]:
        if self._handle is None:
            return []
        lines = (self._partial + self._handle.read()).splitlines(keepends=True)
        self._partial = lines.pop() if lines and not lines[-1].endswith(b"\n") else b""
        return list(_records(iter(lines)))

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


def _size(count: object) -> str:
    if not isinstance(count, int):
        return "?"
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def describe(record: dict[str, Any]) -> str:
    """One event as one line: time, kind, host:port, address, bytes up/down, duration, reason."""
    host, port = record.get("host") or "?", record.get("port") or "?"
    where = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    duration = record.get("duration_seconds")
    seconds = f"{duration:.3f} s" if isinstance(duration, (int, float)) else "? s"
    return (f"{record.get('time', '?')}  {str(record.get('kind', '?')):<7}  {where}  {record.get('address') or '-'}  "
            f"up {_size(record.get('bytes_up'))} down {_size(record.get('bytes_down'))}  {seconds}  "
            f"{record.get('reason') or ''}").rstrip()
