"""Starting and stopping a service process from the command line (``up``, ``down``).

:func:`start_service` starts it detached (its own session, stdin closed, its messages in its
log file) and waits until it answers; :func:`stop_service` ends it (SIGTERM, then SIGKILL, only
the process its pid file names while that process runs); :func:`remove_everything` removes every
container the service made, its workspaces and its files.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from .. import detached
from ..leftovers import remove_host_dirs
from . import labels
from .files import ServiceFiles


def running(name: str) -> dict[str, Any] | None:
    """The pid record of service ``name`` while its process runs; None otherwise."""
    return detached.running(ServiceFiles.of(name).pid)


async def start_service(name: str, arguments: Sequence[str] = (), *, timeout: float = 60.0) -> dict[str, Any]:
    """Start service ``name`` detached with the extra command-line ``arguments``; its pid record
    once it serves (the running one's, when it runs already). SandboxError with the end of its
    log when it ends or does not answer in time."""
    if (record := running(name)) is not None:
        return record
    files = ServiceFiles.of(name)
    files.pid.unlink(missing_ok=True)
    process = detached.spawn([sys.executable, "-m", "protolink.sandbox.service", "--name", name, *arguments],
                             files.log)

    async def serving() -> dict[str, Any] | None:
        return running(name)

    return await detached.wait_ready(process, serving, what=f"the sandbox service {name}", log=files.log,
                                     timeout=timeout)


async def stop_service(name: str, *, timeout: float = 10.0) -> bool:
    """End service ``name``'s process; True when one ran."""
    record = running(name)
    if record is None:
        return False
    await detached.end(record, timeout=timeout)
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

