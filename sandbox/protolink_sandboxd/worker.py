"""A worker process: performs workspace and document operations as the command user.

Forked by the server as root with its modules loaded (:mod:`protolink_sandboxd.worker_pool`), or
started as ``python -I -m protolink_sandboxd.worker`` (for document operations, and by a server
that holds a token), it sets its
address-space limit, becomes non-dumpable, takes the command uid/gid as its file-system ids for
good (:func:`~protolink_sandboxd.privileges.drop_to_shielded`) and then serves one request at a
time over stdin/stdout (:mod:`protolink_sandboxd.frames`). Every module it needs is loaded
before the drop (a file-system uid may not read the interpreter's own files); a forked worker
leaves out the document parsers (pypdf, python-docx, openpyxl: some 20 MB), and the pool gives
it no document operation. Before each request its CPU-time
limit is set just above the time the request may take: a parser that spins past it gets
SIGXCPU. The server enforces wall time and replaces a worker it kills.
"""

from __future__ import annotations

import encodings
import importlib
import math
import os
import pkgutil
import resource
import sys
import types

from google.protobuf.message import DecodeError

from protolink.errors import SandboxLimitError
from protolink.wire.operations import WIRE_OPERATIONS
from protolink.wire.status import to_status

from . import frames
from .privileges import (
    OOM_HELPER,
    die_with_parent,
    drop_to_shielded,
    helper_arguments,
    limit,
    make_non_dumpable,
    set_oom_score_adj,
)

IN, OUT = 0, 1


def main(argv: list[str] | None = None, *, parsers: bool = True) -> int:
    """Serve requests on stdin/stdout until the server closes them, with the document
    ``parsers`` loaded or not; the exit code."""
    args = helper_arguments("python -m protolink_sandboxd.worker", argv, "--memory-bytes", "--max-request-bytes")
    if parsers:
        _preload_parsers()
    make_non_dumpable()
    limit(resource.RLIMIT_AS, args.memory_bytes)
    limit(resource.RLIMIT_CORE, 0)
    os.umask(0o022)
    os.chdir("/")
    set_oom_score_adj(OOM_HELPER)
    # Commands run as --uid too: with only the file-system uid theirs the worker is out of
    # their reach (they could otherwise stop, kill or slow it in the middle of someone's call).
    drop_to_shielded(args.uid, args.gid)
    die_with_parent(args.server)  # after the drop, which clears the parent-death signal
    sys.stdout = sys.stderr  # stdout carries frames only
    while (request := _read_request(args.max_request_bytes)) is not None:
        status, payload, healthy = _perform(*request)
        _write_all(frames.reply_frame(status, payload))
        if not healthy:
            return 1
    return 0


def _perform(method: str, payload: bytes, cpu_seconds: float) -> tuple[int, bytes, bool]:
    """(status, payload, whether this worker may serve again)."""
    row = WIRE_OPERATIONS.get(method)
    if row is None:
        return frames.ERROR, _error(ValueError(f"unknown operation {method!r}")), True
    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = used.ru_utime + used.ru_stime
    resource.setrlimit(resource.RLIMIT_CPU, (math.ceil(spent + cpu_seconds) + 1, resource.RLIM_INFINITY))
    try:
        response = row.response(row.operation.run(**row.arguments(row.request_type.FromString(payload))))
        return frames.OK, response.SerializeToString(), True
    except DecodeError:
        return frames.ERROR, _error(ValueError(f"malformed {method} request")), True
    except MemoryError:
        limit_error = SandboxLimitError(f"{method} exceeded the worker's memory limit and was stopped")
        return frames.ERROR, _error(limit_error), False
    except Exception as error:  # every failure becomes a typed wire error; the worker lives on
        return frames.ERROR, _error(error), True


def _error(error: BaseException) -> bytes:
    return to_status(error)[1].SerializeToString()


def _read_request(max_bytes: int) -> tuple[str, bytes, float] | None:
    header = _read_exactly(frames.REQUEST.size)
    if header is None:
        return None
    name_length, payload_length, cpu_seconds = frames.REQUEST.unpack(header)
    if payload_length > max_bytes:
        raise SystemExit(f"worker: request of {payload_length} bytes exceeds {max_bytes}")
    name = _read_exactly(name_length)
    payload = _read_exactly(payload_length)
    if name is None or payload is None:
        return None
    return name.decode("ascii", "replace"), payload, cpu_seconds


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(OUT, view):]


def _preload_parsers() -> None:
    """Import the optional document parsers once, so each extraction does not pay for it: every
    module of theirs (some import others only when a document needs them) and every text codec
    they may look up by name (a PDF's strings can be UTF-16, its fonts name legacy encodings).
    After the drop the interpreter's files may no longer be readable."""
    for name in ("pypdf", "docx", "openpyxl"):
        try:
            package = importlib.import_module(name)
        except ImportError:
            continue
        _import_all(package)
    _import_all(encodings)


def _import_all(package: types.ModuleType) -> None:
    for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}.", onerror=lambda _: None):
        try:
            importlib.import_module(module.name)
        except Exception:  # noqa: BLE001 (a module that cannot load here: no document needs it)
            pass  # an optional dependency (numpy, pycryptodome) or another platform's codec (mbcs)


def _read_exactly(size: int) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        chunk = os.read(IN, min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


if __name__ == "__main__":
    sys.exit(main())
