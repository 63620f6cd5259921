"""The service's sandboxes as Swarm services of one task: :class:`OnSwarm`.

Each sandbox is started by :class:`~.swarm.SwarmPlacement` on the configured manager and
reached through the gateway of the node its task runs on; its service's labels record its
owner and the rest (:func:`.sandboxes.adopted_service` reads them back). A managed workspace
lives on the task's node, in a volume of the sandbox's own (nothing of it on the host; the
node's gateway removes it after the task). A sandbox's egress is decided here, by the service's
own proxy, its commands' connections carried through the gateway
(:meth:`~..egress.service.EgressService.through_gateway`). A task that no longer runs is lost
(:meth:`OnSwarm.lost`). While the service runs it renews a lease on each of its Swarm services;
what a service killed for good left expires and a manager's gateway removes it
(:func:`~protolink.sandbox.leftovers.reap`).
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from protolink.errors import SandboxError, SandboxNotReachedError, SandboxUnavailableError
from protolink.wire._pb import sandbox_pb2

from ..egress.policy import parse_policy
from ..egress.service import EgressService
from . import labels, sandboxes
from .config import Overrides, SwarmConfig, Template
from .events import Events
from .placement import Adopted, egress_events
from .sandboxes import INFO, INFO_SECONDS, Placed
from .swarm import SwarmPlacement
from .tokens import DIGEST_ID_CHARS

#: The longest name Swarm gives a service (a DNS label's).
SWARM_NAME_CHARS = 63

log = logging.getLogger(__name__)

#: How long a Swarm task's server may take to listen once the task runs (a hang guard).
SWARM_SERVER_SECONDS = 60.0


class OnSwarm:
    """The sandboxes of service ``service`` on the Swarm of ``config``; ``events`` hears of their egress."""

    def __init__(self, service: str, config: SwarmConfig, events: Events) -> None:
        longest = labels.swarm_name(service, "0" * DIGEST_ID_CHARS, "0" * sandboxes.ID_CHARS)
        if len(longest) > SWARM_NAME_CHARS:
            raise ValueError(f"service name {service!r} is too long for Swarm: its sandboxes' Swarm services "
                             f"({longest}) would pass {SWARM_NAME_CHARS} characters")
        self.service = service
        self.events = events
        self.swarm = SwarmPlacement(config)
        self._leases: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Connect to the manager, renew the leases of the Swarm services a previous run left (so
        that none expires while it is adopted), and keep renewing them while the service runs."""
        await self.swarm.open()
        await self.swarm.renew_leases(self.service, labels.SERVICE)
        self._leases = asyncio.create_task(self._keep_leases())

    async def close(self) -> None:
        """Stop renewing the leases (the sandboxes kept for the next run expire
        ``lease_seconds`` after the last renewal) and close the connection."""
        if self._leases is not None:
            self._leases.cancel()
            await asyncio.gather(self._leases, return_exceptions=True)
        await self.swarm.close()

    async def _keep_leases(self) -> None:
        """Renew the leases three times per lease: a manager that does not answer once costs none."""
        while True:
            await asyncio.sleep(self.swarm.config.lease_seconds / 3)
            try:
                await self.swarm.renew_leases(self.service, labels.SERVICE)
            except Exception as error:
                log.warning("could not renew the leases of the service's Swarm sandboxes: %s", error)

    def check(self, template: Template, overrides: Overrides) -> None:
        """Any sandbox may run on Swarm."""

    async def start(self, placed: Placed, overrides: Overrides) -> None:
        """Start ``placed`` as a Swarm service and wait until its server answers through its node's
        gateway. Its managed workspace, if any, is a volume made on its node
        (:func:`.swarm.placement_spec`), mounted at ``placed.workspace``: nothing of it is on this host."""
        name = labels.swarm_name(self.service, placed.tenant, placed.id)
        config = sandboxes.sandbox_config(self.service, placed, overrides.roots, name)
        found = {**sandboxes.container_labels(self.service, placed), labels.TENANT: placed.tenant,
                 labels.SANDBOX: placed.id}
        placed.node, placed.container_id, placed.task_id = await self.swarm.start(
            config, found, dict(placed.template.node_labels), placed.workspace)
        placed.swarm_service, placed.container_labels = name, found
        try:
            await self._connect(placed)
            await self._serve_egress(placed)
        except BaseException:
            await self.remove(placed)
            raise

    async def reach(self, placed: Placed) -> None:
        """Connect a running sandbox again when its gateway did not answer before (no channel,
        or a channel that failed to connect), its egress served anew on the new channel."""
        if placed.state != "running":
            return
        async with placed.reaching:
            if placed._channel is not None:
                if placed._channel.get_state() != grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                    return
                await sandboxes.disconnect(placed)
            await self._connect(placed, patience=0)
            try:
                await self._serve_egress(placed)
            except SandboxUnavailableError as error:  # its commands get no egress; its calls still go
                log.warning("%s", error)

    async def record_claim(self, placed: Placed) -> None:
        """Write the claim's owner into the service's labels, with the claim's time (from which
        its time to live counts)."""
        await self.swarm.relabel(placed.swarm_service, {labels.TENANT: placed.tenant,
                                                        labels.CREATED: repr(placed.created)})

    async def remove(self, placed: Placed) -> None:
        """Remove ``placed``'s connections and its Swarm service (its task's container goes with it)."""
        await sandboxes.disconnect(placed)
        if placed.swarm_service:
            await self.swarm.remove(placed.swarm_service)

    async def adopt(self) -> Adopted:
        """The services whose task still runs (one try to reach each now, the others at its
        calls: :meth:`reach`); the others are lost."""
        now = time.time()
        adopted = Adopted()
        for found in await self.swarm.services(self.service, labels.SERVICE):
            placed = sandboxes.adopted_service(found, now)
            where = None if placed is None else await self.swarm.task(placed.swarm_service)
            if placed is None or where is None:
                await self.swarm.remove(found["Spec"]["Name"])
                if placed is not None:
                    adopted.lost.append((placed, "its task was gone when the service started"))
                continue
            placed.node, placed.container_id, placed.task_id = where
            try:
                await self._connect(placed, patience=0)
                await self._serve_egress(placed)
            except SandboxError as error:
                log.warning("could not reach adopted sandbox %s, or serve its egress: %s", placed.id, error)
            adopted.running.append(placed)
        return adopted

    def where(self, placed: Placed) -> dict[str, str]:
        return {"node": placed.node}

    async def lost(self, watched: list[Placed]) -> list[tuple[Placed, str]]:
        """Of ``watched``, those whose task no longer runs: one look at the manager for all."""
        named = {placed.swarm_service: placed for placed in watched}
        gone = await self.swarm.lost({name: placed.task_id for name, placed in named.items()})
        return [(named[name], "its task no longer runs (its node is down or left, or the task ended)")
                for name in gone]

    async def _serve_egress(self, placed: Placed) -> None:
        """Decide ``placed``'s egress here, its connections carried through its node's gateway (a
        sandbox with ``allow`` rules); SandboxUnavailableError when the gateway does not reach its relay."""
        placed.egress = None
        if placed.template.allow is None:
            return
        try:
            placed.egress = await EgressService.through_gateway(
                placed.channel(), parse_policy(placed.template.allow), sandbox=placed.id,
                on_event=egress_events(self.events, placed))
        except ConnectionError as error:
            raise SandboxUnavailableError(f"sandbox {placed.id}: its egress is not served: {error}") from None

    async def _connect(self, placed: Placed, *, patience: float = SWARM_SERVER_SECONDS) -> None:
        """Open ``placed``'s channel through its node's gateway and keep its server's Info, waiting up
        to ``patience`` seconds while the task's server is not listening yet (the gateway answers
        UNAVAILABLE meanwhile; 0: one try that does not wait for the gateway either).
        SandboxNotReachedError when it does not answer; the channel is closed then."""
        gateway = self.swarm.config.gateways.get(placed.node)
        placed.address = gateway.address if gateway is not None else ""
        placed._channel = await self.swarm.channel(placed.node, placed.container_id)
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
                    raise SandboxNotReachedError(f"the server of sandbox {placed.id} on node {placed.node} does "
                                                 f"not answer through the gateway at {placed.address}: "
                                                 f"{error.details()}") from None
            await asyncio.sleep(0.1)
        placed.state = "running"
