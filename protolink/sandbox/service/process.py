"""Starting and stopping a service process from the command line (``up``, ``down``).

:func:`start_service` starts it detached (its own session, stdin closed, its messages in its
log file) and waits until it answers; :func:`stop_service` ends it (SIGTERM, then SIGKILL, only
the process its pid file names while that process runs); :func:`remove_everything` removes every
container the service made, its workspaces and its files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from protolink.errors import SandboxError

from ..leftovers import owner_gone, remove_host_dirs
from . import labels
from .files import ServiceFiles


def running(name: str) -> dict[str, Any] | None:
    """The pid record of service ``name`` while its process runs; None otherwise."""
    try:
        record = json.loads(ServiceFiles.of(name).pid.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or owner_gone(str(record.get("owner", ""))):
        return None
    return record


async def start_service(name: str, arguments: Sequence[str] = (), *, timeout: float = 60.0) -> dict[str, Any]:
    """Start service ``name`` detached with the extra command-line ``arguments``; its pid record
    once it serves (the running one's, when it runs already). SandboxError with the end of its
    log when it ends or does not answer in time."""
    if (record := running(name)) is not None:
        return record
    files = ServiceFiles.of(name)
    files.pid.unlink(missing_ok=True)
    log_fd = os.open(files.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:
        process = subprocess.Popen([sys.executable, "-m", "protolink.sandbox.service", "--name", name, *arguments],
                                   stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, cwd="/",
                                   start_new_session=True)
    finally:
        os.close(log_fd)
    deadline = time.monotonic() + timeout
    while (record := running(name)) is None:
        if process.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            raise SandboxError(f"the sandbox service {name} did not start (exit {process.poll()}):\n"
                               + _tail(files))
        await asyncio.sleep(0.05)
    return record


async def stop_service(name: str, *, timeout: float = 10.0) -> bool:
    """End service ``name``'s process; True when one ran."""
    record = running(name)
    if record is None:
        return False
    owner, pid = str(record["owner"]), int(record["pid"])
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        deadline = time.monotonic() + timeout
        while not owner_gone(owner) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if owner_gone(owner):
            break
    return True


def remove_everything(name: str, docker_client: Any) -> int:
    """Remove every container of service ``name`` (blocking), its workspaces, socket, pid record
    and log (its tokens stay); how many containers."""
    import docker.errors

    files = ServiceFiles.of(name)
    found = docker_client.api.containers(all=True, filters={"label": f"{labels.SERVICE}={name}"})
    for container in found:
        with contextlib.suppress(docker.errors.NotFound):
            docker_client.api.remove_container(container["Id"], force=True, v=True)
        remove_host_dirs(container.get("Labels") or {})
    shutil.rmtree(files.base / f"{name}.workspaces", ignore_errors=True)
    for path in (files.socket, files.pid, files.log, files.renewals):
        path.unlink(missing_ok=True)
    return len(found)


def _tail(files: ServiceFiles, lines: int = 20) -> str:
    try:
        return "\n".join(files.log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as error:
        return f"(its log {files.log} cannot be read: {error})"
