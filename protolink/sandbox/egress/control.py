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
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protolink.errors import SandboxError, SandboxProtocolError, SandboxUnavailableError

from ..hostdirs import runtime_dir
from ..leftovers import owner_gone
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
    log_fd = os.open(files.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "protolink.sandbox.egress.daemon", name, "--channel-dir", str(channel_dir),
             "--container", container_id, "--container-pid", str(container_pid), *(f"--allow={rule}" for rule in allow)],
            stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, cwd="/", start_new_session=True)
    finally:
        os.close(log_fd)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise EgressControlError(f"the egress daemon of {name} ended as it started (exit {process.returncode}):\n"
                                     + _tail(files.log))
        with contextlib.suppress(NoEgressDaemonError, EgressDaemonUnresponsiveError):
            return await ask(name, "status", timeout=1.0)
        if time.monotonic() > deadline:
            process.kill()
            raise EgressDaemonUnresponsiveError(f"the egress daemon of {name} did not answer within {timeout:g} s:\n"
                                                + _tail(files.log))
        await asyncio.sleep(0.05)


async def stop_daemon(name: str, *, timeout: float = 5.0) -> bool:
    """Stop appliance ``name``'s egress daemon: asked, then SIGTERM, then SIGKILL (only the
    process its pid file names, and only while that process is the one that wrote it); then
    remove its files, its logs included. True when one was running."""
    files = EgressFiles.of(name)
    try:
        record = json.loads(files.pid.read_text())
        pid, owner = int(record["pid"]), str(record["owner"])
    except (OSError, ValueError, KeyError, TypeError):
        pid, owner = 0, ""
    running = bool(owner) and not owner_gone(owner)
    with contextlib.suppress(EgressControlError):
        await ask(name, "stop", timeout=min(timeout, 2.0))
        running = True
    for signum in (None, signal.SIGTERM, signal.SIGKILL):
        if not owner or owner_gone(owner):
            break
        if signum is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + timeout
        while not owner_gone(owner) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    for path in files.all():
        path.unlink(missing_ok=True)
    return running


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as error:
        return f"(its log {path} cannot be read: {error})"
