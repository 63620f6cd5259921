"""Starting and stopping a service process from the command line (``up``, ``down``).

:func:`start_service` starts it detached (its own session, stdin closed, its messages in its
log file) and waits until it answers; :func:`stop_service` ends it (SIGTERM, then SIGKILL, only
the process its pid file names while that process runs); :func:`remove_everything` removes every
container the service made (and every Swarm service, on the manager it recorded), its workspaces
and its files.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from protolink.errors import SandboxUnavailableError

from .. import detached, engine
from ..leftovers import remove_host_dirs
from . import labels
from .files import ServiceFiles
from .swarm import remove_services

log = logging.getLogger(__name__)


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
    """Remove every container of service ``name`` (blocking), every Swarm service it made (by
    its label, on the manager it recorded), its workspaces, socket, pid record and log (its
    tokens stay); how many sandboxes. SandboxUnavailableError when the manager does not answer:
    the rest is removed, the record of the manager kept for the next ``down``."""
    files = ServiceFiles.of(name)
    on_swarm = _remove_swarm_services(name, files)
    found = docker_client.api.containers(all=True, filters={"label": f"{labels.SERVICE}={name}"})
    for container in found:
        engine.remove_container(docker_client, container["Id"], volumes=True)
        remove_host_dirs(container.get("Labels") or {})
    shutil.rmtree(files.base / f"{name}.workspaces", ignore_errors=True)
    for path in (files.socket, files.pid, files.log, files.renewals):
        path.unlink(missing_ok=True)
    if on_swarm is None:
        raise SandboxUnavailableError(f"the Swarm manager of service {name} did not answer: its Swarm services "
                                      f"stay; `down` again once it answers (the manager is in {files.swarm})")
    return len(found) + on_swarm


def _remove_swarm_services(name: str, files: ServiceFiles) -> int | None:
    """Remove the Swarm services of service ``name`` on the manager it recorded; how many (0
    without a record), None when the manager does not answer."""
    try:
        manager = json.loads(files.swarm.read_text())["manager"]
    except FileNotFoundError:
        return 0
    import docker.errors
    import requests

    try:
        removed = remove_services(manager, labels.SERVICE, name)
    except (docker.errors.DockerException, requests.RequestException) as error:
        log.warning("could not remove the Swarm services of %s: %s", name, error)
        return None
    files.swarm.unlink()
    return removed

