"""Labels on every sandbox container, and the reaper that removes the ones left behind.

Each container carries ``io.protolink.owner`` (who started it), ``io.protolink.session``,
``io.protolink.created`` and ``io.protolink.expiry`` (Unix seconds; ``0`` for none), and
``io.protolink.hostdirs``, the owner-only host directories made for it (its socket). An owner
of the form ``process:<host>/<pid namespace>:<pid>:<start ticks>`` is a host process: once it is
gone (on this host, in this pid namespace) its containers are orphans. Any other owner (a
long-running appliance, or a process in another pid namespace: a container that shares the
engine and the host name, whose pids this process cannot see) is reaped only by its expiry.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any

from .hostdirs import runtime_dir

OWNER_LABEL = "io.protolink.owner"
SESSION_LABEL = "io.protolink.session"
CREATED_LABEL = "io.protolink.created"
EXPIRY_LABEL = "io.protolink.expiry"
HOSTDIRS_LABEL = "io.protolink.hostdirs"
#: The label of a Swarm sandbox's workspace volume on its node (its value: the sandbox's name).
WORKSPACE_LABEL = "io.protolink.workspace"

#: How often a Swarm node's gateway removes what gone sandboxes left (:func:`keep_reaping_node`).
NODE_REAP_SECONDS = 5.0
#: How old an unused workspace volume must be to be removed: a starting task's stays.
WORKSPACE_SETTLE_SECONDS = 30.0

_PROCESS_OWNER = "process"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reaped:
    """A container the reaper removed, and why (``"owner gone"`` or ``"expired"``)."""

    container_id: str
    name: str
    owner: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"container_id": self.container_id, "name": self.name, "owner": self.owner,
                "reason": self.reason}


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # The command name (field 2) may hold spaces; the fields after it do not.
            return stat.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _host() -> str:
    """This host and pid namespace: sessions in containers that share an engine often share a
    host name too, and each would take the others' owners for processes that are gone."""
    return f"{socket.gethostname()}/{os.stat('/proc/self/ns/pid').st_ino}"


def process_owner(pid: int | None = None) -> str:
    """The owner label naming a host process (this one by default)."""
    pid = os.getpid() if pid is None else pid
    return f"{_PROCESS_OWNER}:{_host()}:{pid}:{_start_ticks(pid)}"


def owner_gone(owner: str) -> bool:
    """True when ``owner`` names a process of this host and pid namespace that no longer runs."""
    parts = owner.split(":")
    if len(parts) != 4 or parts[0] != _PROCESS_OWNER or parts[1] != _host():
        return False
    try:
        pid = int(parts[2])
    except ValueError:
        return False
    return _start_ticks(pid) != parts[3]


def labels(owner: str, session: str, expiry_seconds: float | None, host_dirs: list[Path], *,
           now: float | None = None) -> dict[str, str]:
    """The labels of a new container."""
    created = int(time.time() if now is None else now)
    expiry = 0 if expiry_seconds is None else created + max(1, int(expiry_seconds))
    return {OWNER_LABEL: owner, SESSION_LABEL: session, CREATED_LABEL: str(created), EXPIRY_LABEL: str(expiry),
            HOSTDIRS_LABEL: ",".join(map(str, host_dirs))}


def remove_host_dirs(container_labels: dict[str, str]) -> None:
    """Remove the container's host directories; only ever ones inside this user's runtime dir."""
    base = runtime_dir()
    for item in container_labels.get(HOSTDIRS_LABEL, "").split(","):
        path = Path(item)
        if item and path.parent == base and path.name and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def _reason(container_labels: dict[str, str], now: float) -> str | None:
    try:
        expiry = int(container_labels.get(EXPIRY_LABEL, "0"))
    except ValueError:
        expiry = 0
    if expiry and expiry <= now:
        return "expired"
    if owner_gone(container_labels.get(OWNER_LABEL, "")):
        return "owner gone"
    return None


@dataclass(frozen=True)
class Labelled:
    """One labelled sandbox part on an engine: its id, name and labels, and how to remove it
    (by force; what goes with it, too)."""

    id: str
    name: str
    labels: dict[str, str]
    remove: Callable[[], None]


def containers(client: Any) -> list[Labelled]:
    """The sandbox containers on ``client``'s engine (a docker SDK client); each one's host
    directories go with it."""
    found = client.api.containers(all=True, filters={"label": OWNER_LABEL})
    return [Labelled(entry["Id"], (entry.get("Names") or ["/"])[0].lstrip("/"), entry.get("Labels") or {},
                     functools.partial(_remove_container, client, entry["Id"], entry.get("Labels") or {}))
            for entry in found]


def _remove_container(client: Any, container_id: str, container_labels: dict[str, str]) -> None:
    client.api.remove_container(container_id, force=True)
    remove_host_dirs(container_labels)


def swarm_services(client: Any) -> list[Labelled]:
    """The sandboxes' Swarm services on a manager's engine ``client`` (their tasks' containers
    go with them, on their nodes). A sandbox service renews its Swarm services' expiry while it
    runs (a lease), so what one killed for good left expires."""
    found = client.api.services(filters={"label": OWNER_LABEL})
    return [Labelled(entry["ID"], entry["Spec"]["Name"], entry["Spec"].get("Labels") or {},
                     functools.partial(client.api.remove_service, entry["ID"])) for entry in found]


def reap(client: Any, listed: Callable[[Any], list[Labelled]] = containers, *,
         now: float | None = None) -> list[Reaped]:
    """Remove every one ``listed`` finds on ``client``'s engine (a docker SDK client) whose
    owner is gone or whose expiry passed.

    Blocking: call it through ``asyncio.to_thread`` from async code. One that disappears
    meanwhile, or that the engine is already removing (its owner's own cleanup, or another
    reaper), is skipped; one whose removal the engine does not finish in one read is taken up
    at the next pass.
    """
    import docker.errors

    now = time.time() if now is None else now
    removed = []
    # One listing (labels included), not an inspection each: this runs at every start.
    for found in listed(client):
        reason = _reason(found.labels, now)
        if reason is None:
            continue
        try:
            found.remove()
        except docker.errors.NotFound:
            continue
        except docker.errors.APIError as error:
            if error.status_code == HTTPStatus.CONFLICT:  # "removal ... is already in progress"
                continue
            raise
        removed.append(Reaped(found.id[:12], found.name, found.labels.get(OWNER_LABEL, ""), reason))
    return removed


def reap_workspaces(client: Any, *, now: float | None = None) -> list[str]:
    """Remove the Swarm sandboxes' workspace volumes (:data:`WORKSPACE_LABEL`) that no container
    uses on ``client``'s engine (a node's; a docker SDK client) and that are older than
    :data:`WORKSPACE_SETTLE_SECONDS` (a starting task's node makes its volume just before its
    container); their names. Blocking. One taken meanwhile stays. A node removes its task's
    container when its service goes, never a named volume: its gateway calls this
    (:func:`keep_reaping_node`)."""
    import docker.errors

    now = time.time() if now is None else now
    removed = []
    for volume in client.api.volumes(filters={"label": WORKSPACE_LABEL, "dangling": True}).get("Volumes") or []:
        if datetime.fromisoformat(volume["CreatedAt"]).timestamp() > now - WORKSPACE_SETTLE_SECONDS:
            continue
        try:
            client.api.remove_volume(volume["Name"])
        except docker.errors.NotFound:
            continue
        except docker.errors.APIError as error:
            if error.status_code == HTTPStatus.CONFLICT:  # in use again: a task of that name started
                continue
            raise
        removed.append(volume["Name"])
    return removed


def reap_node(client: Any) -> None:
    """What a Swarm node's gateway removes on its engine ``client``: the workspace volumes no
    container uses, and, on a manager, the Swarm services whose lease expired. Blocking."""
    for name in reap_workspaces(client):
        log.info("removed the workspace volume %s: its sandbox is gone", name)
    if client.info().get("Swarm", {}).get("ControlAvailable"):
        for gone in reap(client, swarm_services):
            log.warning("removed Swarm service %s of %s: %s", gone.name, gone.owner, gone.reason)


async def keep_reaping_node(client: Any, every: float = NODE_REAP_SECONDS) -> None:
    """:func:`reap_node` every ``every`` seconds, until cancelled; an engine that does not answer
    is asked again at the next turn."""
    while True:
        try:
            await asyncio.to_thread(reap_node, client)
        except Exception as error:
            log.warning("could not remove the leftovers of Swarm sandboxes: %s", error)
        await asyncio.sleep(every)
