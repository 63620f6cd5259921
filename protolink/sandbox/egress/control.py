"""The appliance's egress daemon and its control channel: one JSON request, one JSON answer.

``protolink-sandbox up --allow ...`` starts one daemon per appliance (:mod:`.daemon`); the
other verbs talk to it over a Unix socket in this user's runtime directory (0700), the socket
itself 0600. A message is one line of JSON (a dict) of at most :data:`MAX_MESSAGE` bytes::

    {"op": "status"}                      -> {"ok": true, "allow": [...], "open_connections": 0, ...}
    {"op": "set", "allow": ["pypi.org"]}  -> {"ok": true, "allow": [...], ...}   ([] denies all)
    {"op": "stop"}                        -> {"ok": true}, then the daemon ends

A refusal is ``{"ok": false, "error": {"type": "bad-request" | "bad-rule", "message": ...}}``.
A daemon that is not there, or does not answer within :data:`TIMEOUT_SECONDS`, is a typed error
here, never a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protolink.errors import SandboxError, SandboxProtocolError, SandboxUnavailableError

from .. import detached
from ..hostdirs import runtime_dir
from ..records import checked_name

MAX_MESSAGE = 64 * 1024
TIMEOUT_SECONDS = 5.0


class EgressControlError(SandboxError):
    """The egress daemon of an appliance could not do what was asked."""


class NoEgressDaemonError(EgressControlError, SandboxUnavailableError):
    """The appliance has no egress daemon (it was started without ``--allow``, or it ended)."""


class EgressDaemonUnresponsiveError(EgressControlError, SandboxUnavailableError, TimeoutError):
    """The daemon's socket is there but nothing answers on it in time."""


class EgressRequestError(EgressControlError, ValueError):
    """The daemon refused the request (a rule it cannot parse, an unknown operation)."""


@dataclass(frozen=True)
class EgressFiles:
    """What an appliance's egress daemon keeps in the runtime directory."""

    socket: Path  # the control socket
    pid: Path  # {"pid": ..., "owner": ...} while the daemon runs
    events: Path  # the decisions, JSON lines (and ``events.1``, the previous part)
    log: Path  # the daemon's own messages

    @classmethod
    def of(cls, name: str) -> EgressFiles:
        base = runtime_dir() / f"{checked_name(name)}.egress"
        return cls(*(Path(f"{base}.{suffix}") for suffix in ("sock", "pid", "jsonl", "log")))

    def all(self) -> list[Path]:
        """Every one of them, the rotated parts of the logs included."""
        return [self.socket, self.pid, *(Path(f"{path}{part}") for path in (self.events, self.log) for part in ("", ".1"))]


def encode(message: dict[str, Any]) -> bytes:
    """One message on the wire: compact JSON and a newline."""
    data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
    if len(data) > MAX_MESSAGE:
        raise SandboxProtocolError(f"egress control message of {len(data)} bytes (at most {MAX_MESSAGE})")
    return data


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any]:
    """The next message; SandboxProtocolError when it is too long, not JSON, or not an object."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise SandboxProtocolError(f"egress control message longer than {MAX_MESSAGE} bytes") from None
    except asyncio.IncompleteReadError:
        raise SandboxProtocolError("the egress control connection closed mid-message") from None
    try:
        message = json.loads(line)
    except ValueError:
        raise SandboxProtocolError("egress control message is not JSON") from None
    if not isinstance(message, dict):
        raise SandboxProtocolError("egress control message is not a JSON object")
    return message


def refusal(kind: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": {"type": kind, "message": message}}


async def ask(name: str, op: str, *, timeout: float = TIMEOUT_SECONDS, **fields: Any) -> dict[str, Any]:
    """Send ``op`` (with ``fields``) to appliance ``name``'s egress daemon and return its answer."""
    path = EgressFiles.of(name).socket
    none = NoEgressDaemonError(f"{name} has no egress daemon: start it with "
                               "`protolink-sandbox up --allow HOST[:PORT]` (after `down`)")
    if not path.exists():
        raise none
    try:
        async with asyncio.timeout(timeout):
            try:
                reader, writer = await asyncio.open_unix_connection(path, limit=MAX_MESSAGE)
            except (ConnectionRefusedError, FileNotFoundError):
                raise none from None  # a daemon that ended without removing its socket
            try:
                writer.write(encode({"op": op, **fields}))
                await writer.drain()
                answer = await read_message(reader)
            finally:
                writer.close()
    except TimeoutError:
        raise EgressDaemonUnresponsiveError(
            f"the egress daemon of {name} did not answer within {timeout:g} s (its log: {EgressFiles.of(name).log})"
        ) from None
    except (ConnectionError, socket.error) as error:
        raise EgressDaemonUnresponsiveError(f"the egress daemon of {name} broke the connection: {error}") from None
    if answer.get("ok") is True:
        return answer
    error = answer.get("error")
    text = error.get("message") if isinstance(error, dict) else None
    raise EgressRequestError(str(text) if text else f"the egress daemon of {name} refused {op!r}")


async def start_daemon(name: str, channel_dir: Path, container_id: str, container_pid: int, allow: Sequence[str],
                       *, timeout: float = 30.0) -> dict[str, Any]:
    """Start appliance ``name``'s egress daemon, detached (its own session; it outlives this
    process), and return its first status once it answers; EgressControlError, with the end of
    its log, when it ends or does not answer within ``timeout``."""
    files = EgressFiles.of(name)
    await stop_daemon(name)  # one of an earlier appliance of that name that has not noticed its end yet
    process = detached.spawn(
        [sys.executable, "-m", "protolink.sandbox.egress.daemon", name, "--channel-dir", str(channel_dir),
         "--container", container_id, "--container-pid", str(container_pid), *(f"--allow={rule}" for rule in allow)],
        files.log)

    async def status() -> dict[str, Any] | None:
        with contextlib.suppress(NoEgressDaemonError, EgressDaemonUnresponsiveError):
            return await ask(name, "status", timeout=1.0)
        return None

    return await detached.wait_ready(process, status, what=f"the egress daemon of {name}", log=files.log,
                                     timeout=timeout, ended=EgressControlError, late=EgressDaemonUnresponsiveError)


async def stop_daemon(name: str, *, timeout: float = 5.0) -> bool:
    """Stop appliance ``name``'s egress daemon: asked, then SIGTERM, then SIGKILL (only the
    process its pid file names, and only while that process is the one that wrote it); then
    remove its files, its logs included. True when one was running."""
    files = EgressFiles.of(name)
    record = detached.running(files.pid)
    running = record is not None
    with contextlib.suppress(EgressControlError):
        await ask(name, "stop", timeout=min(timeout, 2.0))
        running = True
    if record is not None and not await detached.gone(record, timeout):
        await detached.end(record, timeout=timeout)
    for path in files.all():
        path.unlink(missing_ok=True)
    return running
