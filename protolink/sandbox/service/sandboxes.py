"""The service's sandboxes: one record per sandbox, wherever it runs.

A :class:`Placed` sandbox is what the service knows of one sandbox: its owner, template,
limits, deadlines and address. Its placement (:mod:`.placement`) starts it with the labels of
:mod:`.labels` (:func:`container_labels`), rebuilt from those labels when a restarted service
adopts it (:func:`adopted`, :func:`adopted_service`), and removes it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from protolink.errors import SandboxNotReachedError
from protolink.execution.process_types import NO_EVENTS, ProcessSpec
from protolink.wire._pb import sandbox_pb2
from protolink.wire.roots import Root

from ..appliance import ADDRESS_LABEL
from ..client import attach
from ..config import Lease, Limits, SandboxConfig
from ..docker import DockerSandbox
from ..egress.policy import parse_policy
from ..egress.service import EgressService
from ..leftovers import CREATED_LABEL
from . import labels
from .config import Overrides, Template
from ..pipe_connection import ChannelCalls, channel_socket
from .channel_hop import HeldChannel
from .forward import HeldCall, InFlight
from .swarm import adopted_template

log = logging.getLogger(__name__)
#: What a pool member runs once while it waits (:func:`warm_up`).
WARM_UP = ProcessSpec(("/bin/true",), "/", {"PATH": "/usr/bin:/bin"}, 30, 1 << 10)

INFO = "/protolink.sandbox.v1.Sandbox/Info"
INFO_SECONDS = 10.0
#: How many characters a sandbox's id has (random, in hex).
ID_CHARS = 16


def new_id() -> str:
    """A new sandbox's id: :data:`ID_CHARS` random hex digits."""
    return secrets.token_hex(ID_CHARS // 2)


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
    calls: InFlight = field(default_factory=InFlight)  # forwarded calls in flight
    renewed: bool = False
    state: str = "starting"
    address: str = ""
    container_id: str = ""
    swarm_service: str = ""  # on Swarm: the service, its task and the node it runs on
    task_id: str = ""
    node: str = ""
    container_labels: dict[str, str] = field(default_factory=dict)
    docker: DockerSandbox | None = None
    egress: EgressService | None = None
    info: bytes = b""
    held: HeldCall | HeldChannel | None = None  # a pool member's Execute call, opened ahead for its owner's first
    reaching: asyncio.Lock = field(default_factory=asyncio.Lock)  # one reconnection at a time
    _channel: grpc.aio.Channel | None = None
    _commands: ChannelCalls | None = None

    @property
    def idle_expires(self) -> float:
        idle = self.template.idle_seconds
        return 0.0 if idle is None or len(self.calls) else self.last_used + idle

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
        """The channel to this sandbox's own server, opened by its placement (on Swarm, to its
        node's gateway: SandboxNotReachedError while that did not answer)."""
        if self._channel is None:
            raise SandboxNotReachedError(f"sandbox {self.id}: its server was not reached (on Swarm, its node's "
                                         f"gateway did not answer)")
        return self._channel

    def command_channel(self) -> ChannelCalls | None:
        """Execute calls on this sandbox's command channel (:mod:`.channel_hop`): a container on
        this host, until its server has not offered the channel once; None: gRPC only."""
        if self._commands is None and not self.swarm_service and (path := channel_socket(self.address)):
            self._commands = ChannelCalls(path, (), lambda: None, pipes_above=None)
        return self._commands if self._commands is not None and self._commands.offered else None

    def held_call(self) -> HeldCall | HeldChannel | None:
        """The Execute call opened to this pool member ahead of its owner's first (once; None
        when there is none, or it ended): see :class:`~.forward.HeldCall`."""
        held, self.held = self.held, None
        return held if held is not None and not held.done() else None

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
        ca_file=template.ca_file,
    )


async def warm_up(placed: Placed) -> None:
    """Run :data:`WARM_UP` in pool member ``placed`` before anyone claims it, on the way its
    owner's commands take (its command channel, where it has one): a sandbox's first command
    pays for every path it takes for the first time (the server's, the spawner's, the
    channel's), some 10 ms. Failing only leaves it cold. Then open the Execute call its owner's
    first one goes on (:class:`~.channel_hop.HeldChannel`, or :class:`~.forward.HeldCall` on
    gRPC): the connection to the sandbox is set up ahead."""
    commands = placed.command_channel()
    backend = await attach(placed.channel(), info=sandbox_pb2.InfoResponse.FromString(placed.info),
                           address=placed.address if commands is not None else None, output_pipes=False)
    try:
        await backend.execute(WARM_UP, NO_EVENTS)
    except Exception as error:  # an image without /bin/true, say
        log.info("could not warm up pooled sandbox %s: %s", placed.id, error)
    finally:
        await backend.aclose()
    held = await HeldChannel.open(commands) if commands is not None else None
    placed.held = held if held is not None else HeldCall(placed.channel())


async def disconnect(placed: Placed) -> None:
    """Close ``placed``'s connections of this run: its held call, its channel and its egress."""
    if placed.held is not None:
        placed.held.cancel()
        placed.held = None
    if placed._channel is not None:
        await placed._channel.close()
        placed._channel = None
    if placed.egress is not None:
        await placed.egress.aclose()
