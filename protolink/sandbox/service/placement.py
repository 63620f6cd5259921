"""Where the service's sandboxes run: the :class:`Placement` interface.

The manager chooses one placement when it is made (:class:`~.on_docker.OnDocker`, containers on
the host's engine; :class:`~.on_swarm.OnSwarm`, Swarm services of one task) and asks it alone to
start, reach, record a claim of, remove, adopt and find the lost among its sandboxes: the
pools, claims, quotas, loss rule and audit events are the manager's, one for both placements.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol

from ..egress.events import EgressEvent
from .config import Overrides, Template
from .events import Events
from .sandboxes import Placed


@dataclass
class Adopted:
    """What a previous run of the service left: the sandboxes that still run, and those that
    are lost (already removed), each with why."""

    running: list[Placed] = field(default_factory=list)
    lost: list[tuple[Placed, str]] = field(default_factory=list)


class Placement(Protocol):
    """Starts, reaches and removes the sandboxes of one service (named when it is made);
    :meth:`open` before use."""

    async def open(self) -> None:
        """Connect to the engine (or the Swarm manager) the sandboxes run on."""

    async def close(self) -> None:
        """Close that connection (the sandboxes stay)."""

    def check(self, template: Template, overrides: Overrides) -> None:
        """ValueError when a sandbox of ``template`` with ``overrides`` cannot be placed here."""

    async def start(self, placed: Placed, overrides: Overrides) -> None:
        """Start ``placed`` (mounting ``overrides.roots``, and a managed workspace made here, at
        ``placed.workspace``, when that names one) and wait until its server answers; on failure
        nothing is left."""

    async def reach(self, placed: Placed) -> None:
        """Connect running ``placed`` again when it was not reached before;
        SandboxNotReachedError when it still is not."""

    async def record_claim(self, placed: Placed) -> None:
        """Record the owner of claimed pool member ``placed`` where a restarted service reads it."""

    async def remove(self, placed: Placed) -> None:
        """Remove ``placed`` with its connections, host directories and workspace."""

    async def adopt(self) -> Adopted:
        """The sandboxes a previous run of the service left; the others (pool leftovers, the
        stopped) are removed."""

    def where(self, placed: Placed) -> dict[str, str]:
        """What an audit record of ``placed`` says of where it ran (on Swarm, its node)."""

    async def lost(self, watched: list[Placed]) -> list[tuple[Placed, str]]:
        """Of the running ``watched``, those whose container or task is gone, each with why.
        Any error when the engine did not answer this time."""


def egress_events(events: Events, placed: Placed) -> Callable[[EgressEvent], None]:
    """What hands ``placed``'s egress decisions to ``events``: kind ``egress``, the event's
    ``kind`` as ``decision``, the sandbox's id as the sandbox (not the proxy's name for it)."""

    def on_egress(event: EgressEvent) -> None:
        fields = asdict(event)
        del fields["sandbox"]
        fields["decision"] = fields.pop("kind")
        events.emit("egress", placed.tenant, placed.id, **fields)

    return on_egress
