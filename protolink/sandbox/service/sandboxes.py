"""The service's sandboxes: one record per sandbox, and the container it runs in.

A :class:`Placed` sandbox is what the service knows of one sandbox: its owner, template,
limits, deadlines and address. It is started here (a :class:`ServiceContainer`, a
DockerSandbox whose container carries the labels of :mod:`.labels`, or a Swarm service of one
task, :class:`~.swarm.SwarmPlacement`), rebuilt from those labels when a restarted service
adopts it, and removed here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc

from protolink.errors import SandboxNotReachedError
from protolink.execution.process_types import NO_EVENTS, ProcessSpec
from protolink.wire._pb import sandbox_pb2
from protolink.wire.roots import Root

from ..appliance import ADDRESS_LABEL
from ..client import attach, channel_options
from ..config import Identity, Lease, Limits, SandboxConfig
from ..docker import DockerSandbox
from ..egress.policy import parse_policy
from ..egress.service import EgressService
from ..leftovers import CREATED_LABEL, remove_host_dirs
from ..placements.docker import ContainerSpec, EngineFacts, HostFacts, unix_address
from ..writable_roots import open_to
from . import labels
from .config import Overrides, Template
from .events import Events
from .forward import HeldCall
from .swarm import SwarmPlacement, adopted_template

log = logging.getLogger(__name__)
#: What a pool member runs once while it waits (:func:`warm_up`).
WARM_UP = ProcessSpec(("/bin/true",), "/", {"PATH": "/usr/bin:/bin"}, 30, 1 << 10)

INFO = "/protolink.sandbox.v1.Sandbox/Info"
INFO_SECONDS = 10.0
#: How long a Swarm task's server may take to listen once the task runs (a hang guard).
SWARM_SERVER_SECONDS = 60.0


class ServiceContainer(DockerSandbox):
    """A DockerSandbox whose container also carries ``extra_labels`` and its socket's address."""

    def __init__(self, *, extra_labels: dict[str, str], **options: Any) -> None:
        super().__init__(**options)
        self.extra_labels = extra_labels

    def _spec(self, engine_facts: EngineFacts, host: HostFacts) -> ContainerSpec:
        spec = super()._spec(engine_facts, host)
        return replace(spec, labels={**spec.labels, **self.extra_labels, ADDRESS_LABEL: unix_address(host.channel_dir)})


@dataclass
class Placed:
    """One sandbox of the service. ``tenant`` is its owner's id (empty while it waits in the
    pool); ``expires`` and the idle clock (``last_used`` + ``idle_seconds``, stopped while calls
    are in flight) say when it ends; ``state`` is ``starting``, ``running``, or how it ended."""

    id: str
    tenant: str
    template: Template
    labels: dict[str, str] = field(default_factory=dict)
    workspace: str = ""
    pooled: bool = False
    created: float = field(default_factory=time.time)
    expires: float = 0.0
    last_used: float = field(default_factory=time.time)
    active: int = 0
    renewed: bool = False
    state: str = "starting"
    address: str = ""
    container_id: str = ""
    swarm_service: str = ""  # on Swarm: the service, its task and the node it runs on
    task_id: str = ""
    node: str = ""
    container_labels: dict[str, str] = field(default_factory=dict)
    docker: ServiceContainer | None = None
    egress: EgressService | None = None
    info: bytes = b""
    held: HeldCall | None = None  # a pool member's Execute call, opened ahead for its owner's first
    reaching: asyncio.Lock = field(default_factory=asyncio.Lock)  # one reconnection at a time
    _channel: grpc.aio.Channel | None = None

    @property
    def idle_expires(self) -> float:
        idle = self.template.idle_seconds
        return 0.0 if idle is None or self.active else self.last_used + idle

    def due(self, now: float) -> str | None:
        """Why the sandbox ends now (``expired``, ``idle``); None while it may run on."""
        if self.state != "running":
            return None
        if self.expires and now >= self.expires:
            return "expired"
        if self.idle_expires and now >= self.idle_expires:
            return "idle"
        return None

    def hand_to(self, tenant: str, now: float, *, pooled: bool) -> None:
        """Give this sandbox to ``tenant`` (from the pool, or as it starts): its time to live starts now."""
        self.tenant = tenant
        self.pooled = pooled
        self.created = self.last_used = now
        self.expires = now + self.template.ttl_seconds if self.template.ttl_seconds else 0.0

    def renew(self, ttl_seconds: float | None, now: float) -> None:
        ttl = ttl_seconds or self.template.ttl_seconds
        self.expires = now + ttl if ttl else 0.0
        self.last_used = now
        self.renewed = True

    def channel(self) -> grpc.aio.Channel:
        """The channel to this sandbox's own server (opened on first use; on Swarm, to its node's
        gateway, opened by :func:`connect_swarm`)."""
        if self._channel is None and self.swarm_service:
            raise SandboxNotReachedError(f"sandbox {self.id}: its node's gateway did not answer")
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.address, options=channel_options())
        return self._channel

    def held_call(self) -> HeldCall | None:
        """The Execute call opened to this pool member ahead of its owner's first (once; None
        when there is none, or it ended): see :class:`~.forward.HeldCall`."""
        held, self.held = self.held, None
        return held if held is not None and not held.call.done() else None

    def to_dict(self) -> dict[str, Any]:
        """What a status shows (and the ``state`` of one that ended)."""
        return {"id": self.id, "template": self.template.name, "image": self.template.image,
                "memory_bytes": self.template.memory_bytes, "cpus": self.template.cpus, "pids": self.template.pids,
                "labels": dict(self.labels), "created": self.created, "expires": self.expires,
                "idle_expires": self.idle_expires, "workspace": self.workspace, "pooled": self.pooled,
                "state": self.state, "info": self.info}


def container_labels(service: str, placed: Placed) -> dict[str, str]:
    """The labels a container of ``placed`` carries (see :mod:`.labels`)."""
    template = placed.template
    found = {
        labels.SERVICE: service, labels.TEMPLATE: template.name, labels.CREATED: repr(placed.created),
        labels.LIMITS: json.dumps({"image": template.image, "memory_bytes": template.memory_bytes,
                                   "cpus": template.cpus, "pids": template.pids}),
        labels.TTL: labels.seconds(template.ttl_seconds), labels.IDLE: labels.seconds(template.idle_seconds),
        labels.WORKSPACE: placed.workspace,
        **{labels.USER_PREFIX + key: value for key, value in placed.labels.items()},
    }
    if template.allow is not None:
        found[labels.EGRESS] = labels.rules(template.allow) or "[]"
    if placed.tenant == "":
        found[labels.POOLED] = "1"
    return found


def adopted(service: str, name: str, container: dict[str, Any], now: float) -> Placed | None:
    """The sandbox a container of ``service`` (an engine listing's entry) holds; None for a pool
    leftover or a container that is not one of its sandboxes."""
    found = container.get("Labels") or {}
    owner = labels.owner_of(name, service)
    if owner is None or owner[0] == labels.POOL_OWNER:
        return None
    placed = _from_labels(found, owner[0], owner[1], now)
    placed.address, placed.container_id = found.get(ADDRESS_LABEL, ""), container["Id"]
    return placed


def adopted_service(swarm_service: dict[str, Any], now: float) -> Placed | None:
    """The sandbox a Swarm service (a manager's listing entry) holds; None for one without an owner."""
    found = swarm_service["Spec"].get("Labels") or {}
    if not found.get(labels.TENANT) or not found.get(labels.SANDBOX):
        return None
    placed = _from_labels(found, found[labels.TENANT], found[labels.SANDBOX], now)
    placed.template = adopted_template(placed.template, swarm_service)
    placed.swarm_service = swarm_service["Spec"]["Name"]
    return placed


def _from_labels(found: dict[str, str], tenant: str, sandbox_id: str, now: float) -> Placed:
    limits = json.loads(found.get(labels.LIMITS, "{}"))
    template = Template(name=found.get(labels.TEMPLATE, ""), image=str(limits.get("image", "")),
                        memory_bytes=int(limits.get("memory_bytes", Limits.memory)),
                        cpus=float(limits.get("cpus", Limits.cpus)), pids=int(limits.get("pids", Limits.pids)),
                        ttl_seconds=labels.seconds_from(found.get(labels.TTL)),
                        idle_seconds=labels.seconds_from(found.get(labels.IDLE)),
                        allow=labels.rules_from(found.get(labels.EGRESS)))
    created = float(found.get(labels.CREATED) or found.get(CREATED_LABEL) or now)
    user = {key.removeprefix(labels.USER_PREFIX): value for key, value in found.items()
            if key.startswith(labels.USER_PREFIX)}
    placed = Placed(id=sandbox_id, tenant=tenant, template=template, labels=user,
                    workspace=found.get(labels.WORKSPACE, ""), pooled=labels.POOLED in found, created=created,
                    last_used=now, state="running", container_labels=found)
    placed.expires = created + template.ttl_seconds if template.ttl_seconds else 0.0
    return placed


def new_placed(sandbox_id: str, tenant: str, template: Template, overrides: Overrides) -> Placed:
    return Placed(id=sandbox_id, tenant=tenant, template=template, labels=dict(overrides.labels))


def make_workspace(base: Path, sandbox_id: str, identity: Identity) -> str:
    """An empty directory for one sandbox beneath the private ``base``, writable by the command user."""
    path = base / sandbox_id
    path.mkdir(mode=0o700)
    open_to(path, identity.uid, identity.gid, "the managed workspace")
    return str(path)


async def start(service: str, placed: Placed, overrides: Overrides, events: Events,
                swarm: SwarmPlacement | None = None) -> None:
    """Start ``placed``'s container (on ``swarm`` when given) and wait until its server answers;
    on failure nothing is left."""
    if swarm is not None:
        await _start_on_swarm(service, placed, overrides, swarm)
        return
    roots = overrides.roots + ((Root(placed.workspace, writable=True),) if placed.workspace else ())
    config = sandbox_config(service, placed, roots, labels.container_name(service, placed.tenant, placed.id))

    def on_egress(event: Any) -> None:
        events.emit("egress", placed.tenant, placed.id, **asdict(event))

    container = ServiceContainer(config=config, extra_labels=container_labels(service, placed),
                                 on_egress_event=on_egress)
    await container.start()
    placed.docker = container
    placed.address = container.address or ""
    placed.container_id = container.container_id or ""
    # The connection is made and the server's Info kept: a client's first call is its own.
    placed.info = await placed.channel().unary_unary(INFO)(sandbox_pb2.InfoRequest().SerializeToString(),
                                                          timeout=INFO_SECONDS, wait_for_ready=True)
    placed.state = "running"


def sandbox_config(service: str, placed: Placed, roots: tuple[Root, ...], name: str) -> SandboxConfig:
    """The configuration of ``placed``'s container (or Swarm task) named ``name``, mounting ``roots``."""
    template = placed.template
    return SandboxConfig(
        roots=roots, image=template.image,
        limits=Limits(memory=template.memory_bytes, cpus=template.cpus, pids=template.pids),
        lease=Lease(owner=f"service:{service}", session=placed.id, expiry_seconds=None),
        name=name,
        egress=None if template.allow is None else parse_policy(template.allow),
        runtime=template.runtime,
    )


async def _start_on_swarm(service: str, placed: Placed, overrides: Overrides, swarm: SwarmPlacement) -> None:
    """Start ``placed`` as a Swarm service and wait until its server answers through its node's gateway."""
    name = labels.swarm_name(service, placed.tenant, placed.id)
    config = sandbox_config(service, placed, overrides.roots, name)
    found = {**container_labels(service, placed), labels.TENANT: placed.tenant, labels.SANDBOX: placed.id}
    placed.node, placed.container_id, placed.task_id = await swarm.start(config, found,
                                                                         dict(placed.template.node_labels))
    placed.swarm_service, placed.container_labels = name, found
    try:
        await connect_swarm(placed, swarm)
    except BaseException:
        await remove(placed, None, swarm)
        raise


async def connect_swarm(placed: Placed, swarm: SwarmPlacement, *, patience: float = SWARM_SERVER_SECONDS) -> None:
    """Open ``placed``'s channel through its node's gateway and keep its server's Info, waiting up
    to ``patience`` seconds while the task's server is not listening yet (the gateway answers
    UNAVAILABLE meanwhile; 0: one try that does not wait for the gateway either).
    SandboxNotReachedError when it does not answer; the channel is closed then."""
    gateway = swarm.config.gateways.get(placed.node)
    placed.address = gateway.address if gateway is not None else ""
    placed._channel = await swarm.channel(placed.node, placed.container_id)
    deadline = time.monotonic() + patience
    request = sandbox_pb2.InfoRequest().SerializeToString()
    while True:
        try:
            placed.info = await placed._channel.unary_unary(INFO)(request, timeout=INFO_SECONDS,
                                                                  wait_for_ready=patience > 0)
            break
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                await placed._channel.close()
                placed._channel = None
                raise SandboxNotReachedError(f"the server of sandbox {placed.id} on node {placed.node} does not "
                                             f"answer through the gateway at {placed.address}: "
                                             f"{error.details()}") from None
        await asyncio.sleep(0.1)
    placed.state = "running"


async def reach(placed: Placed, swarm: SwarmPlacement | None) -> None:
    """Connect a running Swarm sandbox again when its gateway did not answer before (no channel,
    or a channel that failed to connect); SandboxNotReachedError when it still does not."""
    if swarm is None or not placed.swarm_service or placed.state != "running":
        return
    async with placed.reaching:
        if placed._channel is not None:
            if placed._channel.get_state() != grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                return
            await placed._channel.close()
            placed._channel = None
        await connect_swarm(placed, swarm, patience=0)


async def warm_up(placed: Placed) -> None:
    """Run :data:`WARM_UP` in pool member ``placed`` before anyone claims it: a sandbox's first
    command pays for every path it takes for the first time (the server's, the spawner's, the
    channel's), some 10 ms. Failing only leaves it cold. Then open the Execute call its owner's
    first one goes on (:class:`~.forward.HeldCall`): the stream to the sandbox is set up ahead."""
    backend = await attach(placed.channel(), info=sandbox_pb2.InfoResponse.FromString(placed.info))
    try:
        await backend.execute(WARM_UP, NO_EVENTS)
    except Exception as error:  # an image without /bin/true, say
        log.info("could not warm up pooled sandbox %s: %s", placed.id, error)
    finally:
        await backend.aclose()
    placed.held = HeldCall(placed.channel())


async def record_claim(service: str, placed: Placed, docker_client: Any, swarm: SwarmPlacement | None) -> None:
    """Write the owner of the claimed pool member ``placed`` where a restarted service reads it:
    into its container's name, or into its Swarm service's labels (with the claim's time, from
    which its time to live counts)."""
    if placed.swarm_service:
        assert swarm is not None, "a Swarm sandbox is claimed through its placement"
        await swarm.relabel(placed.swarm_service, {labels.TENANT: placed.tenant, labels.CREATED: repr(placed.created)})
    else:
        await asyncio.to_thread(docker_client.api.rename, placed.container_id,
                                labels.container_name(service, placed.tenant, placed.id))


async def resume_egress(placed: Placed, events: Events) -> None:
    """Serve the egress of an adopted sandbox again (its relay waits for a host to dial in)."""
    if placed.template.allow is None:
        return

    def on_egress(event: Any) -> None:
        events.emit("egress", placed.tenant, placed.id, **asdict(event))

    try:
        placed.egress = await EgressService.start(Path(placed.address.removeprefix("unix://")).parent,
                                                  parse_policy(placed.template.allow), sandbox=placed.id,
                                                  on_event=on_egress)
    except ConnectionError as error:
        log.warning("sandbox %s: its egress could not be resumed: %s", placed.id, error)


async def remove(placed: Placed, docker_client: Any, swarm: SwarmPlacement | None = None) -> None:
    """Remove ``placed``'s container (or Swarm service), host directories, workspace and connections."""
    if placed.held is not None:
        placed.held.cancel()
        placed.held = None
    if placed._channel is not None:
        await placed._channel.close()
        placed._channel = None
    if placed.egress is not None:
        await placed.egress.aclose()
    if placed.swarm_service:
        assert swarm is not None, "a Swarm sandbox is removed through its placement"
        await swarm.remove(placed.swarm_service)
    elif placed.docker is not None:
        await placed.docker.aclose()
    elif placed.container_id:
        await asyncio.to_thread(remove_container, docker_client, placed.container_id)
        await asyncio.to_thread(remove_host_dirs, placed.container_labels)
    if placed.workspace:
        await asyncio.to_thread(shutil.rmtree, placed.workspace, True)


def remove_container(docker_client: Any, container_id: str) -> None:
    import docker.errors

    with contextlib.suppress(docker.errors.NotFound):
        docker_client.api.remove_container(container_id, force=True, v=True)
