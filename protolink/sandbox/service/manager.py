"""The service's bookkeeping: which tenant holds which sandbox, quotas, pools, deadlines.

:class:`Manager` creates sandboxes (from a template's warm pool when nothing is changed, else
cold), finds them for their owner only (another tenant's looks absent), renews and removes
them, removes the ones whose time to live or idle timeout passed, and, at start, adopts the
sandboxes a previous run of the service left and removes pool leftovers. Where sandboxes run is
its :class:`~.placement.Placement`, chosen once: containers on the host's engine
(:class:`~.on_docker.OnDocker`), or, with a ``[swarm]`` configuration, Swarm services
(:class:`~.on_swarm.OnSwarm`), pool members too. A sandbox whose container or task is gone is
lost (one rule for both placements): removed, never recreated, and its owner's next call ends
with :class:`~protolink.errors.SandboxLostError`. A pool member whose container or task is gone
is removed and replaced, never handed out.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from itertools import chain
from typing import Any

from protolink.errors import (
    QuotaExceededError,
    SandboxError,
    SandboxLostError,
    SandboxNotFoundError,
    SandboxUnavailableError,
)

from ..hostdirs import write_private
from . import sandboxes
from .config import Overrides, ServiceConfig, Template
from .events import Events
from .files import ServiceFiles
from .on_docker import OnDocker
from .on_swarm import OnSwarm
from .placement import Placement
from .sandboxes import Placed
from .tokens import Tenant

log = logging.getLogger(__name__)

#: How often deadlines are looked at.
TICK_SECONDS = 0.5
#: How often the placement is asked which of the service's containers or tasks still run.
LIVENESS_SECONDS = 2.0
#: How many ended sandboxes a listing still shows.
ENDED_KEPT = 100
#: Pool members started at once per template.
POOL_STARTS = 1
#: How long after a claim its pool starts a new member, and the claim is recorded (in the
#: container's name, or the Swarm service's labels: :meth:`.placement.Placement.record_claim`): the claimed
#: sandbox's first calls do not compete with a start or a rename for the CPU (a rename beside the
#: first command made it some 10 ms slower). A service that dies meanwhile leaves a pool member's
#: record: the next run removes that sandbox.
REFILL_DELAY_SECONDS = 1.0


class Manager:
    """The sandboxes of service ``name``; see the module."""

    def __init__(self, name: str, config: ServiceConfig, files: ServiceFiles, events: Events) -> None:
        self.name = name
        self.config = config
        self.files = files
        self.events = events
        self.sandboxes: dict[str, Placed] = {}
        self.ended: collections.deque[Placed] = collections.deque(maxlen=ENDED_KEPT)
        self.pools: dict[str, list[Placed]] = {name: [] for name in config.templates}
        self._starting: dict[str, int] = dict.fromkeys(config.templates, 0)
        self._refill = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._unrecorded: set[str] = set()  # ids of claimed pool members whose record still says "pool"
        self.placement: Placement = OnSwarm(name, config.swarm, events) if config.swarm is not None else OnDocker(name, events)

    async def start(self) -> None:
        """Adopt what a previous run left, then keep deadlines and pools."""
        await self.placement.open()
        await self._adopt()
        self._spawn(self._watch_deadlines())
        self._spawn(self._watch_lost())
        self._spawn(self._keep_pools())
        self._refill.set()

    async def close(self, *, remove_all: bool = False) -> None:
        """Stop the background work and remove the pools (and every sandbox with ``remove_all``);
        the others stay for the next run to adopt."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        doomed = [member for pool in self.pools.values() for member in pool]
        if remove_all:
            doomed += list(self.sandboxes.values())
        else:  # kept for the next run, which adopts a sandbox by its name or labels
            await asyncio.gather(*(self._record_claim(self.sandboxes[name]) for name in list(self._unrecorded)))
        await asyncio.gather(*(self._remove(placed, "down") for placed in doomed), return_exceptions=True)
        for placed in self.sandboxes.values():  # kept: drop the connections of this run
            placed.calls.end(_end_of_calls(placed, "down"))
            await sandboxes.disconnect(placed)
        await self.placement.close()

    # What tenants ask --------------------------------------------------------------------

    def find(self, tenant: Tenant, sandbox_id: str) -> Placed:
        """``tenant``'s running sandbox ``sandbox_id``, or its lost one (whose calls end with the
        typed loss); SandboxNotFoundError for any other."""
        placed = self.sandboxes.get(sandbox_id)
        if placed is None:
            placed = next((ended for ended in self.ended if ended.id == sandbox_id and ended.state == "lost"), None)
        if placed is None or placed.tenant != tenant.id or placed.state not in ("running", "lost"):
            raise SandboxNotFoundError(f"no sandbox {sandbox_id!r}")
        return placed

    async def reach(self, tenant: Tenant, sandbox_id: str) -> Placed:
        """:meth:`find`, connected: a Swarm sandbox whose gateway did not answer before is connected
        again (SandboxNotReachedError when it still does not)."""
        placed = self.find(tenant, sandbox_id)
        await self.placement.reach(placed)
        return placed

    def listing(self, tenant: Tenant) -> list[Placed]:
        """``tenant``'s sandboxes that run, then those that ended lately."""
        running = [placed for placed in self.sandboxes.values() if placed.tenant == tenant.id]
        return running + [placed for placed in self.ended if placed.tenant == tenant.id]

    async def create(self, tenant: Tenant, template_name: str, overrides: Overrides) -> Placed:
        """A new sandbox for ``tenant``: a pooled one when ``overrides`` change nothing and the
        pool has one, else one started now. QuotaExceededError, SandboxPermissionError (a root
        the configuration does not allow) and ValueError refuse at once."""
        base = self.config.template(template_name)
        template = overrides.applied(base)
        self.placement.check(template, overrides)
        roots = self.config.checked_roots(overrides.roots)
        self._check_quota(tenant, template)
        now = time.time()
        if overrides.none and self.pools[base.name]:
            placed = self.pools[base.name].pop(0)  # the one that waited longest: settled, warmed up
            placed.hand_to(tenant.id, now, pooled=True)
            self.sandboxes[placed.id] = placed
            self._unrecorded.add(placed.id)
            self._spawn(self._record_claim(placed, after=REFILL_DELAY_SECONDS))
            asyncio.get_running_loop().call_later(REFILL_DELAY_SECONDS, self._refill.set)
            self.events.emit("sandbox.created", tenant.id, placed.id, template=base.name, image=template.image,
                             pooled=True, duration_seconds=time.time() - now)
            return placed
        placed = sandboxes.new_placed(sandboxes.new_id(), tenant.id, template, overrides)
        placed.hand_to(tenant.id, now, pooled=False)
        self.sandboxes[placed.id] = placed  # holds its share of the quota while it starts
        if overrides.workspace:  # where it is; the placement makes it
            placed.workspace = str(self.files.workspaces() / placed.id)
        try:
            await self.placement.start(placed, Overrides(roots=roots))
        except BaseException:
            del self.sandboxes[placed.id]
            raise
        placed.last_used = time.time()
        self.events.emit("sandbox.created", tenant.id, placed.id, template=base.name, image=template.image,
                         pooled=False, duration_seconds=time.time() - now)
        return placed

    def renew(self, tenant: Tenant, sandbox_id: str, ttl_seconds: float | None) -> Placed:
        """Give ``sandbox_id`` ``ttl_seconds`` (None: its own time to live) from now. Container
        labels cannot change: the new deadline is kept in the renewals file for the next run."""
        placed = self.find(tenant, sandbox_id)
        if placed.state == "lost":
            raise SandboxLostError(f"sandbox {sandbox_id} is lost: its container or task is gone")
        placed.renew(ttl_seconds, time.time())
        self._save_renewals()
        return placed

    def _save_renewals(self) -> None:
        write_private(self.files.renewals, json.dumps({placed.id: placed.expires for placed in self.sandboxes.values()
                                                       if placed.renewed}))

    def _load_renewals(self) -> dict[str, float]:
        try:
            found = json.loads(self.files.renewals.read_text())
        except (OSError, ValueError):
            return {}
        return {str(key): float(value) for key, value in found.items()} if isinstance(found, dict) else {}

    async def delete(self, tenant: Tenant, sandbox_id: str) -> None:
        await self._remove(self.find(tenant, sandbox_id), "deleted")

    # Inside ------------------------------------------------------------------------------

    def _check_quota(self, tenant: Tenant, template: Template) -> None:
        held = [placed.template for placed in self.sandboxes.values() if placed.tenant == tenant.id]
        why = tenant.quota.refusal(len(held) + 1, sum(t.memory_bytes for t in held) + template.memory_bytes,
                                   sum(t.cpus for t in held) + template.cpus)
        if why is not None:
            raise QuotaExceededError(f"quota of token {tenant.name!r} exceeded: {why}")

    async def _remove(self, placed: Placed, reason: str) -> None:
        if placed.state in ("deleted", "expired", "idle", "down", "lost"):
            return
        placed.state = reason
        placed.calls.end(_end_of_calls(placed, reason))
        self.sandboxes.pop(placed.id, None)
        self._unrecorded.discard(placed.id)
        for pool in self.pools.values():
            if placed in pool:
                pool.remove(placed)
        if placed.renewed:
            self._save_renewals()
        if placed.tenant and reason == "lost":  # its owner is told so while it is removed (a dead node's is slow)
            self.ended.append(placed)
        try:
            await self.placement.remove(placed)
        finally:
            if placed.tenant:
                if reason != "lost":  # listed as ended once it is gone
                    self.ended.append(placed)
                self.events.emit("sandbox.removed", placed.tenant, placed.id, reason=reason)

    async def _record_claim(self, placed: Placed, *, after: float = 0.0) -> None:
        """Record the new owner of a claimed pool member (:meth:`.placement.Placement.record_claim`),
        ``after`` seconds (unless it is gone by then)."""
        await asyncio.sleep(after)
        if placed.id not in self._unrecorded:
            return
        self._unrecorded.discard(placed.id)
        try:
            await self.placement.record_claim(placed)
        except Exception as error:
            log.warning("could not record the owner of claimed sandbox %s: %s", placed.id, error)

    async def _adopt(self) -> None:
        """Adopt what a previous run left (:meth:`.placement.Placement.adopt`) with its renewed
        deadlines; report the lost."""
        renewals = self._load_renewals()
        adopted = await self.placement.adopt()
        for placed in adopted.running:
            if placed.id in renewals:
                placed.expires, placed.renewed = renewals[placed.id], True
            self.sandboxes[placed.id] = placed
            log.info("adopted sandbox %s of tenant %s%s", placed.id, placed.tenant,
                     f" on node {placed.node}" if placed.node else "")
        for placed, why in adopted.lost:
            placed.state = "lost"
            self.ended.append(placed)
            self._report_lost(placed, why)

    def _report_lost(self, placed: Placed, why: str) -> None:
        """Record that ``placed`` is lost, and why (the audit log keeps it; on Swarm, with its node)."""
        log.warning("sandbox %s is lost: %s", placed.id, why)
        self.events.emit("sandbox.lost", placed.tenant, placed.id, **self.placement.where(placed), reason=why)

    async def _watch_deadlines(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            now = time.time()
            for placed in list(self.sandboxes.values()):
                reason = placed.due(now)
                if reason is not None:
                    self._spawn(self._remove(placed, reason))

    async def _watch_lost(self) -> None:
        """Report lost, and remove, a sandbox whose container or task is gone behind the service's
        back (killed, out of memory, removed; its node is down or left): never recreated, its
        quota freed, its client's calls end with SandboxLostError; a pool member is only replaced."""
        while True:
            await asyncio.sleep(LIVENESS_SECONDS)
            watched = [placed for placed in self._placed() if placed.state == "running"]
            try:
                gone = await self.placement.lost(watched)
            except Exception as error:  # the engine did not answer this time: asked again at the next tick
                log.warning("could not look for the service's lost sandboxes: %s", error)
                continue
            for placed, why in gone:
                self._remove_lost(placed, why)

    def _placed(self) -> list[Placed]:
        """The sandboxes tenants hold, and the pool members."""
        return [*self.sandboxes.values(), *chain(*self.pools.values())]

    def _remove_lost(self, placed: Placed, why: str) -> None:
        """Remove ``placed``, whose container or task is gone: reported lost to its owner (a pool
        member is only replaced)."""
        if placed.tenant:
            self._report_lost(placed, why)
        self._spawn(self._remove(placed, "lost"))
        self._refill.set()

    async def _keep_pools(self) -> None:
        while True:
            await self._refill.wait()
            self._refill.clear()
            for template in self.config.templates.values():
                while len(self.pools[template.name]) + self._starting[template.name] < template.pool \
                        and self._starting[template.name] < POOL_STARTS:
                    self._starting[template.name] += 1
                    self._spawn(self._pool_one(template))

    async def _pool_one(self, template: Template) -> None:
        placed = Placed(id=sandboxes.new_id(), tenant="", template=template)
        try:
            await self.placement.start(placed, Overrides())
            await sandboxes.warm_up(placed)
        except SandboxError as error:
            log.warning("could not start a pooled sandbox of template %s: %s", template.name, error)
            await asyncio.sleep(5.0)  # an engine that refuses is not asked again at once
        else:
            self.pools[template.name].append(placed)
        finally:
            self._starting[template.name] -= 1
            self._refill.set()

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("service task failed", exc_info=task.exception())


def _end_of_calls(placed: Placed, reason: str) -> SandboxError:
    """The error the calls in flight to ``placed`` end with when it ends for ``reason``."""
    if reason == "lost":
        return SandboxLostError(f"sandbox {placed.id} was lost during the call: its container or task is gone")
    if reason == "down":
        return SandboxUnavailableError(f"the sandbox service stopped during a call to sandbox {placed.id}")
    return SandboxNotFoundError(f"sandbox {placed.id} ended during the call ({reason})")
