"""The service's sandboxes on a Docker Swarm cluster: :class:`SwarmPlacement`.

Each sandbox is a Swarm service of one task made by
:func:`~protolink.sandbox.placements.swarm.service_spec` on the configured manager's engine; the
service waits until the task runs, then reaches its server through the gateway of the node it
landed on (:mod:`protolink.sandbox.gateway`): TLS pinned to the gateway's fingerprint, the
gateways' token and the task's container id on every call. A task that stops running, or whose
node goes down, is lost (:meth:`SwarmPlacement.lost`): Swarm never restarts it (restart policy
``none``), and the service never recreates it. The service's labels record its template's
runtime and node labels, which a restarted service reads back (:func:`adopted_template`), and
its lease: an expiry the running service renews (:meth:`SwarmPlacement.renew_leases`), after
which a manager's gateway removes it (:func:`~..leftovers.reap`).
The service's placement on Swarm, :class:`~.on_swarm.OnSwarm`, places its sandboxes through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import replace
from typing import Any

import grpc

from protolink.errors import SandboxUnavailableError

from ..client import channel_options
from ..config import SandboxConfig
from ..leftovers import EXPIRY_LABEL, OWNER_LABEL
from ..placements.swarm import (
    GVISOR_RUNTIME,
    PlacementFacts,
    ServiceSpec,
    SwarmFacts,
    constraints,
    hosting_cpus,
    service_spec,
)
from .config import SwarmConfig, Template
from .forward import CONTAINER_KEY
from ..tls import pinned_channel

log = logging.getLogger(__name__)

#: How often a starting task is looked at.
POLL_SECONDS = 0.1
#: Task states after which a task never runs again.
ENDED = frozenset({"complete", "shutdown", "failed", "rejected", "orphaned", "remove"})
#: The labels of a sandbox's Swarm service that record its template's runtime and node labels
#: (a JSON object): the other labels do not, and a restarted service reads them back (:func:`adopted_template`).
RUNTIME_LABEL = "io.protolink.service.runtime"
NODE_LABELS_LABEL = "io.protolink.service.node-labels"


def placement_spec(config: SandboxConfig, labels: dict[str, str], node_labels: dict[str, str], node_cpus: int,
                   created: int, workspace: str = "") -> ServiceSpec:
    """The Swarm service of ``config``: on a node with ``node_labels`` (and, for a configured
    runtime, its node label), tuned for gVisor when the runtime is ``runsc``, with its managed
    ``workspace`` (a writable root of ``config``; empty: none) on the node."""
    facts = SwarmFacts(node_cpus=node_cpus, gvisor=config.runtime == GVISOR_RUNTIME)
    recorded = {NODE_LABELS_LABEL: json.dumps(dict(sorted(node_labels.items())))}
    if config.runtime is not None:
        recorded[RUNTIME_LABEL] = config.runtime
    return service_spec(config, facts, PlacementFacts(created=created, node_labels=node_labels,
                                                      labels={**labels, **recorded}, workspace=workspace))


def adopted_template(template: Template, swarm_service: dict[str, Any]) -> Template:
    """``template`` (read back from a Swarm service's other labels) with the runtime and node
    labels that service was placed with (:func:`placement_spec` records them)."""
    found = swarm_service["Spec"].get("Labels") or {}
    node_labels = json.loads(found.get(NODE_LABELS_LABEL, "{}"))
    return replace(template, runtime=found.get(RUNTIME_LABEL),
                   node_labels=tuple(sorted((str(key), str(value)) for key, value in node_labels.items())))


def lease_until(now: float, config: SwarmConfig) -> str:
    """The expiry label of a Swarm service whose lease is renewed at ``now``."""
    return str(int(now + config.lease_seconds))


def manager_client(manager: str) -> Any:
    """A docker client of the Swarm manager's engine ``manager`` (a docker URL); blocking."""
    import docker

    return docker.DockerClient(base_url=manager, version="auto")


def remove_services(manager: str, label: str, service: str) -> int:
    """Remove every Swarm service carrying ``label=service`` on ``manager`` (blocking); how many."""
    import docker.errors

    client = manager_client(manager)
    try:
        found = client.api.services(filters={"label": f"{label}={service}"})
        for each in found:
            with contextlib.suppress(docker.errors.NotFound):
                client.api.remove_service(each["ID"])
    finally:
        client.close()
    return len(found)


class SwarmPlacement:
    """Sandboxes as services on the Swarm of ``config``; :meth:`open` before use (blocking calls
    run on threads)."""

    def __init__(self, config: SwarmConfig) -> None:
        self.config = config
        self._token = ""
        self._docker: Any = None
        self._relabeling = asyncio.Lock()

    async def open(self) -> None:
        self._token = self.config.token()
        self._docker = await asyncio.to_thread(manager_client, self.config.manager)

    async def close(self) -> None:
        if self._docker is not None:
            await asyncio.to_thread(self._docker.close)

    async def start(self, config: SandboxConfig, labels: dict[str, str], node_labels: dict[str, str],
                    workspace: str = "") -> tuple[str, str, str]:
        """Create ``config``'s service (carrying ``labels``, on a node with ``node_labels``, with
        its managed ``workspace`` on that node) and wait until its task runs: the node's
        hostname, the task's container id and the task's id. SandboxUnavailableError when no
        node runs it within the configured time, or it fails; nothing is left then."""
        cpus = await asyncio.to_thread(self._node_cpus, config, node_labels)
        created = int(time.time())
        spec = placement_spec(config, labels, node_labels, cpus, created, workspace)
        # The service's own labels carry the lease (its container's keep no expiry: no reaper of a
        # node's engine may remove a task that runs).
        spec = replace(spec, labels={**spec.labels, EXPIRY_LABEL: lease_until(created, self.config)})
        await asyncio.to_thread(self._docker.api.create_service, **spec.create_kwargs())
        try:
            return await self._running(config.name)
        except BaseException:
            await self.remove(config.name)
            raise

    async def channel(self, node: str, container_id: str) -> grpc.aio.Channel:
        """A channel to a task's server through the gateway of ``node``."""
        gateway = self.config.gateways.get(node)
        if gateway is None:
            raise SandboxUnavailableError(f"node {node} has no gateway in the service's [swarm.nodes]")
        return await pinned_channel(gateway.address, gateway.fingerprint, options=channel_options(),
                                    call_metadata=[("authorization", f"Bearer {self._token}"),
                                                   (CONTAINER_KEY, container_id)])

    async def remove(self, name: str) -> None:
        """Remove the service ``name`` (its task's container goes with it, on its node)."""
        import docker.errors

        with contextlib.suppress(docker.errors.NotFound):
            await asyncio.to_thread(self._docker.api.remove_service, name)

    async def relabel(self, name: str, labels: dict[str, str]) -> None:
        """Add ``labels`` to the service ``name``'s own labels (one update at a time: each names
        the version it read). Its spec is sent back as stored, so its task is not replaced: a
        service's labels are not its task's. A service removed meanwhile is let be."""
        async with self._relabeling:
            await asyncio.to_thread(self._relabel, name, labels)

    async def renew_leases(self, service: str, label: str) -> None:
        """Move the lease of every Swarm service carrying ``label=service`` to
        ``lease_seconds`` from now (:data:`~..leftovers.EXPIRY_LABEL`)."""
        until = lease_until(time.time(), self.config)
        for found in await self.services(service, label):
            await self.relabel(found["Spec"]["Name"], {EXPIRY_LABEL: until})

    def _relabel(self, name: str, labels: dict[str, str]) -> None:
        import docker.errors

        with contextlib.suppress(docker.errors.NotFound):
            found = self._docker.api.inspect_service(name)
            spec = found["Spec"]
            self._docker.api.update_service(
                found["ID"], found["Version"]["Index"], name=spec["Name"], labels={**spec.get("Labels", {}), **labels},
                task_template=spec["TaskTemplate"], mode=spec.get("Mode"), update_config=spec.get("UpdateConfig"),
                rollback_config=spec.get("RollbackConfig"), endpoint_spec=spec.get("EndpointSpec"))

    async def services(self, service: str, label: str) -> list[dict[str, Any]]:
        """The Swarm services carrying ``label=service``."""
        return await asyncio.to_thread(self._docker.api.services, filters={"label": f"{label}={service}"})

    async def task(self, name: str) -> tuple[str, str, str] | None:
        """Where the service ``name``'s task runs (as :meth:`start` says), None when it does not."""
        return await asyncio.to_thread(self._running_task, name, await asyncio.to_thread(self._down_nodes))

    async def lost(self, names: dict[str, str]) -> list[str]:
        """Of ``names`` (service name: its task's id), those whose task no longer runs: ended,
        replaced, gone, or on a node that is down. The manager is asked once for the nodes and
        once for the tasks of every sandbox, however many there are."""
        running = await asyncio.to_thread(self._running_tasks)
        return [name for name, task_id in names.items() if task_id not in running]

    def _node_cpus(self, config: SandboxConfig, node_labels: dict[str, str]) -> int:
        """The fewest CPUs of a node that may run ``config`` now (:func:`hosting_cpus`)."""
        cpus = hosting_cpus(self._docker.api.nodes(), config, node_labels)
        if cpus is None:
            raise SandboxUnavailableError(f"no ready Swarm node may run sandbox {config.name} "
                                          f"(its constraints: {constraints(config, node_labels)})")
        return cpus

    def _down_nodes(self) -> dict[str, str]:
        """Each node by id: its hostname, or "" when it is down."""
        return {node["ID"]: "" if node["Status"]["State"] != "ready" else node["Description"]["Hostname"]
                for node in self._docker.api.nodes()}

    def _running_task(self, name: str, nodes: dict[str, str]) -> tuple[str, str, str] | None:
        import docker.errors

        try:
            tasks = self._docker.api.tasks(filters={"service": name})
        except docker.errors.NotFound:
            return None
        for task in tasks:
            if _runs(task, nodes):
                return nodes[task["NodeID"]], task["Status"]["ContainerStatus"]["ContainerID"], task["ID"]
        return None

    def _running_tasks(self) -> set[str]:
        """The ids of the sandboxes' tasks that run (any service's: they carry the product's labels)."""
        nodes = self._down_nodes()
        tasks = self._docker.api.tasks(filters={"label": OWNER_LABEL, "desired-state": "running"})
        return {task["ID"] for task in tasks if _runs(task, nodes)}

    async def _running(self, name: str) -> tuple[str, str, str]:
        deadline = time.monotonic() + self.config.start_seconds
        while True:
            tasks = await asyncio.to_thread(self._docker.api.tasks, filters={"service": name})
            for task in tasks:
                state = task["Status"]["State"]
                if state == "running":
                    nodes = await asyncio.to_thread(self._down_nodes)
                    return nodes.get(task["NodeID"], ""), task["Status"]["ContainerStatus"]["ContainerID"], task["ID"]
                if state in ENDED:
                    raise SandboxUnavailableError(f"the task of sandbox {name} ended as {state} before it ran: "
                                                  f"{task['Status'].get('Err', '')}")
            if time.monotonic() > deadline:
                why = "; ".join(task["Status"].get("Err", "") for task in tasks) or "no task"
                raise SandboxUnavailableError(f"no Swarm node ran sandbox {name} within "
                                              f"{self.config.start_seconds:g} s ({why})")
            await asyncio.sleep(POLL_SECONDS)


def _runs(task: dict[str, Any], nodes: dict[str, str]) -> bool:
    """Whether ``task`` runs, and is meant to, on a node that is up (``nodes``: hostnames by id, "" when down)."""
    return (task["Status"]["State"] == "running" and task.get("DesiredState") == "running"
            and bool(nodes.get(task.get("NodeID", ""), "")))
