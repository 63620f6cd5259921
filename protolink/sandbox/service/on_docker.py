"""The service's sandboxes as containers on the host's Docker engine: :class:`OnDocker`.

Each sandbox is a :class:`ServiceContainer` whose name records its owner and whose labels
(:mod:`.labels`) record the rest; a restarted service adopts the running ones by those
(:func:`.sandboxes.adopted`), resuming their egress, and removes the others. A container that
stops behind the service's back is lost (:meth:`OnDocker.lost`).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from protolink.wire._pb import sandbox_pb2
from protolink.wire.roots import Root

from .. import engine
from ..addresses import socket_path
from ..appliance import ADDRESS_LABEL
from ..client import channel_options
from ..config import Identity
from ..docker import DockerSandbox
from ..egress.policy import parse_policy
from ..egress.service import EgressService
from ..leftovers import remove_host_dirs
from ..placements.docker import ContainerSpec, EngineFacts, HostFacts, unix_address
from ..writable_roots import open_to
from . import labels, sandboxes
from .config import Overrides, Template
from .events import Events
from .placement import Adopted, egress_events
from .sandboxes import INFO, INFO_SECONDS, Placed

log = logging.getLogger(__name__)


class ServiceContainer(DockerSandbox):
    """A DockerSandbox whose container also carries ``extra_labels`` and its socket's address."""

    def __init__(self, *, extra_labels: dict[str, str], **options: Any) -> None:
        super().__init__(**options)
        self.extra_labels = extra_labels

    def _spec(self, engine_facts: EngineFacts, host: HostFacts) -> ContainerSpec:
        spec = super()._spec(engine_facts, host)
        return replace(spec, labels={**spec.labels, **self.extra_labels, ADDRESS_LABEL: unix_address(host.channel_dir)})


class OnDocker:
    """The sandboxes of service ``service`` on the host's engine; ``events`` hears of their egress."""

    def __init__(self, service: str, events: Events) -> None:
        self.service = service
        self.events = events
        self.identity = Identity.of()
        self._docker: Any = None

    async def open(self) -> None:
        self._docker = await asyncio.to_thread(engine.client)

    async def close(self) -> None:
        if self._docker is not None:
            await asyncio.to_thread(self._docker.close)

    def check(self, template: Template, overrides: Overrides) -> None:
        """Any sandbox may run on the host's engine."""

    async def start(self, placed: Placed, overrides: Overrides) -> None:
        """Start ``placed``'s container, its managed workspace (if any) a host directory at
        ``placed.workspace``, open to the command user; on failure the directory is removed."""
        if not placed.workspace:
            return await self._start(placed, overrides.roots)
        await asyncio.to_thread(_make_workspace, Path(placed.workspace), self.identity)
        try:
            await self._start(placed, overrides.roots + (Root(placed.workspace, writable=True),))
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, placed.workspace, True)
            raise

    async def _start(self, placed: Placed, roots: tuple[Root, ...]) -> None:
        config = sandboxes.sandbox_config(self.service, placed, roots,
                                          labels.container_name(self.service, placed.tenant, placed.id))
        container = ServiceContainer(config=config, extra_labels=sandboxes.container_labels(self.service, placed),
                                     on_egress_event=egress_events(self.events, placed))
        await container.start()
        placed.docker = container
        placed.address = container.address or ""
        placed.container_id = container.container_id or ""
        _connect(placed)
        # The connection is made and the server's Info kept: a client's first call is its own.
        placed.info = await placed.channel().unary_unary(INFO)(sandbox_pb2.InfoRequest().SerializeToString(),
                                                              timeout=INFO_SECONDS, wait_for_ready=True)
        placed.state = "running"

    async def reach(self, placed: Placed) -> None:
        """A container's socket is always there to connect to."""

    async def record_claim(self, placed: Placed) -> None:
        """Write the claim's owner into the container's name."""
        await asyncio.to_thread(self._docker.api.rename, placed.container_id,
                                labels.container_name(self.service, placed.tenant, placed.id))

    async def remove(self, placed: Placed) -> None:
        await sandboxes.disconnect(placed)
        if placed.docker is not None:
            await placed.docker.aclose()
        elif placed.container_id:
            await asyncio.to_thread(self._remove_container, placed.container_id)
            await asyncio.to_thread(remove_host_dirs, placed.container_labels)
        if placed.workspace:
            await asyncio.to_thread(shutil.rmtree, placed.workspace, True)

    async def adopt(self) -> Adopted:
        """The running containers of sandboxes; pool leftovers and stopped ones are removed."""
        now = time.time()
        found = await asyncio.to_thread(self._docker.api.containers, all=True,
                                        filters={"label": f"{labels.SERVICE}={self.service}"})
        adopted = Adopted()
        for container in found:
            name = (container.get("Names") or ["/"])[0].lstrip("/")
            placed = sandboxes.adopted(self.service, name, container, now)
            if placed is None or container.get("State") != "running":
                await asyncio.to_thread(self._remove_container, container["Id"])
                await asyncio.to_thread(remove_host_dirs, container.get("Labels") or {})
                continue
            _connect(placed)
            await self._resume_egress(placed)
            adopted.running.append(placed)
        return adopted

    def where(self, placed: Placed) -> dict[str, str]:
        return {}

    async def lost(self, watched: list[Placed]) -> list[tuple[Placed, str]]:
        running = await asyncio.to_thread(self._running_containers)
        return [(placed, f"its container {placed.container_id[:12]} stopped (killed, out of memory, or removed)")
                for placed in watched if placed.container_id and placed.container_id not in running]

    async def _resume_egress(self, placed: Placed) -> None:
        """Serve the egress of an adopted sandbox again (its relay waits for a host to dial in)."""
        if placed.template.allow is None:
            return
        path = socket_path(placed.address)
        if path is None:  # its address label is gone: there is no channel directory to dial into
            log.warning("sandbox %s: its egress could not be resumed: it has no Unix socket address", placed.id)
            return
        try:
            placed.egress = await EgressService.start(Path(path).parent,
                                                      parse_policy(placed.template.allow), sandbox=placed.id,
                                                      on_event=egress_events(self.events, placed))
        except ConnectionError as error:
            log.warning("sandbox %s: its egress could not be resumed: %s", placed.id, error)

    def _running_containers(self) -> set[str]:
        found = self._docker.api.containers(filters={"label": f"{labels.SERVICE}={self.service}",
                                                     "status": "running"})
        return {container["Id"] for container in found}

    def _remove_container(self, container_id: str) -> None:
        engine.remove_container(self._docker, container_id, volumes=True)


def _make_workspace(path: Path, identity: Identity) -> None:
    """An empty directory at ``path`` (beneath the service's private workspace directory),
    writable by the command user ``identity``."""
    path.mkdir(mode=0o700)
    open_to(path, identity.uid, identity.gid, "the managed workspace")


def _connect(placed: Placed) -> None:
    """Open the channel to ``placed``'s own server, at its socket (it connects on first use)."""
    placed._channel = grpc.aio.insecure_channel(placed.address, options=channel_options())
