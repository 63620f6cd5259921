"""The service's audit trail: an append-only JSON Lines file whose records are chained by SHA-256.

Each line is one record, in canonical JSON (keys sorted, no spaces, ASCII only, as Python's
``json`` writes it)::

    {"fields":{...},"hash":"...","kind":"command.ended","prev":"...","seq":7,"time":"2026-12-01T23:44:39.123456Z"}

``seq`` counts from 1; ``time`` is UTC; ``prev`` is the hex SHA-256 of the previous record's
line (without its newline), :data:`GENESIS` for the first; ``hash`` is the hex SHA-256 of the
canonical JSON of the record without ``hash``. :func:`verify` finds a changed record (its hash,
or the next record's ``prev``, no longer matches), a removed one (a gap in ``seq``), records out
of order, a duplicated ``seq``, a malformed line and a tail cut mid-line.

What the chain cannot tell on its own: that the last records were removed (a shorter chain is
still a valid chain), or that the whole file was rewritten with a fresh, consistent chain (the
hashes are not keyed). Against both, keep the head hash (:attr:`AuditLog.head`, or what
``protolink-sandbox audit verify`` prints) somewhere the service cannot write, and pass it to
the next check (``verify(path, kept_head=...)``, ``audit verify --head``): it must still be the
hash of a line in the file.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeAlias

from protolink.errors import AuditLogError, SerializationError

from ..digests import sha256_digest
from ..hostdirs import owner_only_dir

JSON: TypeAlias = "None | bool | int | float | str | Sequence[JSON] | Mapping[str, JSON]"

#: The ``prev`` of the first record.
GENESIS = "0" * 64
_KEYS = frozenset({"seq", "time", "kind", "fields", "prev", "hash"})
_TAIL_CHUNK = 64 * 1024


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def canonical(value: JSON) -> bytes:
    """``value`` as canonical JSON: sorted keys, no spaces, ASCII only, no NaN or infinity."""
    return _CANONICAL.encode(value).encode()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _record_hash(record: Mapping[str, Any]) -> str:
    return _sha256(canonical({key: value for key, value in record.items() if key != "hash"}))


def _canonical_fields(fields: Mapping[str, JSON]) -> bytes:
    """The canonical JSON of ``fields`` as a record holds it: keys that are not strings (JSON
    makes them strings) are normalized first, so that the line reads back to the same bytes."""
    plain = dict(fields)
    encoded = canonical(plain)
    return encoded if _string_keys(plain) else canonical(json.loads(encoded))


def _string_keys(value: object) -> bool:
    """Whether every mapping in ``value``, nested ones too, has only string keys."""
    if isinstance(value, dict):  # the only mapping JSON encodes
        return all(isinstance(key, str) and _string_keys(item) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return all(map(_string_keys, value))
    return True


class AuditLog:
    """An open audit log at ``path``, appended to by :meth:`record` from any thread.

    The file is created 0600 in a directory only its owner can open, opened with ``O_APPEND``,
    and locked (``flock``) so that a second writer, in this process or another, is refused
    rather than forking the chain. An existing file continues from its last record; one whose
    last line is not a valid record (a cut or foreign tail) is refused with
    :class:`~protolink.errors.AuditLogError`: check it with :func:`verify` and move it aside to
    start a new chain.

    Durability: every record reaches the kernel in one ``write(2)`` before :meth:`record`
    returns, so it survives the service being killed; the file is ``fsync``-ed only at
    :meth:`close`, not per record. A per-record ``fsync`` would cost a disk flush on the
    caller's thread (the service's event loop) for every command, and what the chain answers
    is tampering, not power loss: a machine that loses power may lose the last records, or
    leave a cut line that :func:`verify` reports and that reopening refuses.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        owner_only_dir(self.path.parent, "the audit log's path", "the audit log's directory")
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as error:
            raise AuditLogError(f"cannot open the audit log {self.path}: {error.strerror or error}") from None
        try:
            self._check_owned()
            self._lock()
            self._size = os.fstat(self._fd).st_size
            self._seq, self._head = self._tail()
        except BaseException:
            os.close(self._fd)
            raise
        self._mutex = threading.Lock()

    @property
    def head(self) -> str:
        """The hex SHA-256 of the last record's line (:data:`GENESIS` while empty): the ``prev``
        of the next record, and what an operator keeps elsewhere to detect a cut or rewrite."""
        return self._head

    @property
    def count(self) -> int:
        """How many records the chain holds."""
        return self._seq

    def record(self, kind: str, fields: Mapping[str, JSON]) -> None:
        """Append one record of ``kind`` with ``fields``; SerializationError when they are not
        JSON, AuditLogError when the file cannot be written (the chain is left as it was)."""
        if not isinstance(kind, str) or not kind:
            raise SerializationError(f"an audit record's kind must be a non-empty string, not {kind!r}")
        try:
            encoded = _canonical_fields(fields)
        except (TypeError, ValueError) as error:
            raise SerializationError(f"the fields of audit record {kind!r} are not JSON: {error}") from None
        with self._mutex:
            if self._fd < 0:
                raise AuditLogError(f"the audit log {self.path} is closed")
            seq = self._seq + 1
            time = datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")
            # The canonical JSON of the record, written out in its keys' order: without its hash
            # (what the hash covers), then with it.
            after = b'"kind":%b,"prev":"%b","seq":%d,"time":%b}' % (canonical(kind), self._head.encode(), seq,
                                                                    canonical(time))
            digest = _sha256(b'{"fields":%b,%b' % (encoded, after))
            line = b'{"fields":%b,"hash":"%b",%b' % (encoded, digest.encode(), after)
            self._append(line + b"\n")
            self._seq, self._head = seq, _sha256(line)

    def close(self) -> None:
        """Flush the file to the disk and release it (and its lock); closing twice is harmless."""
        with self._mutex:
            if self._fd < 0:
                return
            fd, self._fd = self._fd, -1
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_owned(self) -> None:
        info = os.fstat(self._fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise AuditLogError(
                f"the audit log {self.path} must be a regular file of uid {os.getuid()} that only its owner "
                f"can open (found uid {info.st_uid}, mode {stat.filemode(info.st_mode)})")

    def _lock(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AuditLogError(f"the audit log {self.path} is open for writing elsewhere "
                                f"(another service, or another AuditLog in this one)") from None

    def _tail(self) -> tuple[int, str]:
        """The last record's ``seq`` and line hash; AuditLogError when the file does not end
        with a valid record."""
        if self._size == 0:
            return 0, GENESIS
        end = self._size
        line = b""
        while True:  # read backwards to the newline before the last line
            start = max(0, end - _TAIL_CHUNK)
            line = os.pread(self._fd, end - start, start) + line
            end = start
            cut = line.rfind(b"\n", 0, len(line) - 1)
            if cut >= 0 or start == 0:
                line = line[cut + 1:]
                break
        if not line.endswith(b"\n"):
            record, problem = None, "is cut short (no newline)"
        else:
            line = line.removesuffix(b"\n")
            record, problem = _parse(line)
        if record is None or problem is not None:
            raise AuditLogError(
                f"the audit log {self.path} cannot be continued: its last line {problem}. Check it with "
                f"`protolink-sandbox audit verify {self.path}`, then move it aside to start a new chain")
        return record["seq"], _sha256(line)

    def _append(self, data: bytes) -> None:
        """Write ``data`` in one call; on failure, cut the file back to its last whole record,
        or, when even that fails, close the log (reopening refuses the cut line it leaves)."""
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"only {written} of {len(data)} bytes were written")
        except OSError as error:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                os.close(self._fd)
                self._fd = -1
            raise AuditLogError(f"cannot write to the audit log {self.path}: {error}") from None
        self._size += len(data)


def _parse(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """The record on ``line`` (None when it is not one) and what is wrong with it (None when
    nothing is), as a phrase that follows "the line"."""
    try:
        record = json.loads(line)
    except ValueError:
        return None, "is not JSON"
    if not isinstance(record, dict) or set(record) != _KEYS:
        return None, f"is not a record (a JSON object with exactly the keys {', '.join(sorted(_KEYS))})"
    if not (type(record["seq"]) is int and record["seq"] >= 1 and isinstance(record["kind"], str)
            and isinstance(record["time"], str) and isinstance(record["fields"], dict)
            and all(isinstance(record[key], str) and len(record[key]) == 64 for key in ("prev", "hash"))):
        return None, "is not a record (a field has the wrong type)"
    if record["hash"] != _record_hash(record):
        return record, f"holds record {record['seq']}, whose hash does not match its contents"
    if canonical(record) != line:
        return record, f"holds record {record['seq']}, not in canonical form (it was rewritten)"
    return record, None


@dataclass(frozen=True)
class AuditProblem:
    """One thing wrong in an audit log: at ``line`` (from 1), a ``kind`` of problem
    (changed, removed, reordered, duplicated, malformed, truncated), and what was found."""

    line: int
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.kind}: {self.detail}"


@dataclass(frozen=True)
class AuditReport:
    """What :func:`verify` found: how many records the file holds, the hex SHA-256 of its last
    record's line (:data:`GENESIS` when empty), and the problems (none when intact)."""

    path: Path
    count: int
    head: str
    problems: tuple[AuditProblem, ...]

    @property
    def intact(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class _Line:
    number: int
    seq: int
    prev: str
    digest: str  # SHA-256 of the line
    changed: bool  # its own hash does not match


def verify(path: Path | str, *, kept_head: str | None = None) -> AuditReport:
    """Check the whole chain of the audit log at ``path``; AuditLogError when it cannot be read.

    ``kept_head`` is a head hash kept elsewhere earlier (see the module): when given, it must be
    the hash of a record's line in the file, else the file lost its last records or was
    rewritten since (a "missing head" problem).
    """
    path = Path(path)
    wanted = None if kept_head is None else sha256_digest(kept_head)
    problems: list[AuditProblem] = []
    lines: list[_Line] = []
    head = GENESIS
    found = wanted in (None, GENESIS)
    number = 0
    for number, line, whole in _lines(path):
        if not whole:
            problems.append(AuditProblem(number, "truncated", f"the last line is cut short ({len(line)} bytes "
                                                              f"without a newline)"))
            break
        record, problem = _parse(line)
        if problem is not None:
            problems.append(AuditProblem(number, "malformed" if record is None else "changed", f"the line {problem}"))
        if record is not None:
            head = _sha256(line)
            found = found or head == wanted
            lines.append(_Line(number, record["seq"], record["prev"], head, changed=problem is not None))
    if not found:
        problems.append(AuditProblem(number, "missing head", f"no line has the kept head sha256:{wanted}: the "
                                                             f"records after it were removed, or the file rewritten"))
    problems.extend(_chain_problems(lines))
    problems.sort(key=lambda problem: problem.line)
    return AuditReport(path, len(lines), head, tuple(problems))


def _lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """Each line of ``path`` without its newline, numbered from 1, and whether it had one."""
    try:
        with open(path, "rb") as source:
            for number, line in enumerate(source, 1):
                yield number, line.removesuffix(b"\n"), line.endswith(b"\n")
    except OSError as error:
        raise AuditLogError(f"cannot read the audit log {path}: {error.strerror or error}") from None


def _chain_problems(lines: Sequence[_Line]) -> Iterator[AuditProblem]:
    """What the order, the sequence numbers and the ``prev`` links of well-formed records say."""
    first: dict[int, _Line] = {}
    for line in lines:
        first.setdefault(line.seq, line)
    numbers = sorted(first)
    seen: set[int] = set()
    high = 0
    for line in lines:
        if line.seq in seen:
            yield AuditProblem(line.number, "duplicated", f"record {line.seq} appears a second time")
            continue
        seen.add(line.seq)
        if line.seq < high:
            yield AuditProblem(line.number, "reordered", f"record {line.seq} comes after record {high}")
        gap = max(0, line.seq - high - 1)  # the records that should come between; later lines may hold some
        missing = gap and gap - (bisect_left(numbers, line.seq) - bisect_right(numbers, high))
        if missing:
            yield AuditProblem(line.number, "removed", _missing(high + 1, line.seq - 1, missing))
        high = max(high, line.seq)
        before = first.get(line.seq - 1)
        if line.seq == 1 and line.prev != GENESIS:
            yield AuditProblem(line.number, "changed", "record 1 does not start the chain (its prev is not the "
                                                       "genesis value)")
        elif before is not None and not before.changed and line.prev != before.digest:
            yield AuditProblem(before.number, "changed", f"record {line.seq}'s prev does not match this line: record "
                                                         f"{before.seq} was changed and its hash recomputed, or "
                                                         f"records were removed and the rest renumbered")


def _missing(first: int, last: int, count: int) -> str:
    if first == last:
        return f"record {first} is missing"
    if count == last - first + 1:
        return f"records {first} to {last} are missing"
    return f"records {first} to {last}: {count} missing"

