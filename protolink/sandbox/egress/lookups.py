"""The proxy's name lookups: connections that ask for one name at the same time share one lookup.

A package manager opens dozens of connections to its registry at once. Asked that many times at
once, a resolver may drop queries: on these machines, of 40 lookups at once, half waited 5 s for
the resolver's retry, and ``npm ci`` behind the proxy took 4x its time on the host. So a lookup
that is running serves every connection that asks for its name meanwhile; once it ends, the next
connection asks again (no answer is kept: each connection is checked against a fresh answer, and
connects to the address it checked).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from protolink.net.network import Network

#: Resolutions at once per proxy: the system resolver's threads are shared with everything else.
MAX_LOOKUPS = 4


class Lookups:
    """Name resolution through ``network``, shared by concurrent askers of one name."""

    def __init__(self, network: Network) -> None:
        self._network = network
        self._running: dict[str, asyncio.Task[Sequence[str]]] = {}
        self._slots = asyncio.Semaphore(MAX_LOOKUPS)

    async def resolve(self, host: str, port: int) -> Sequence[str]:
        """Every address ``host`` resolves to. Cancelling one asker leaves the lookup to the others."""
        lookup = self._running.get(host)
        if lookup is None:
            lookup = asyncio.create_task(self._resolve(host, port), name=f"egress lookup {host}")
            self._running[host] = lookup
            lookup.add_done_callback(lambda done: self._finished(host, done))
        return await asyncio.shield(lookup)

    def cancel(self) -> None:
        """Stop the lookups still running (the proxy is closing)."""
        for lookup in list(self._running.values()):
            lookup.cancel()

    async def _resolve(self, host: str, port: int) -> Sequence[str]:
        async with self._slots:
            return await self._network.resolve(host, port)

    def _finished(self, host: str, lookup: asyncio.Task[Sequence[str]]) -> None:
        if self._running.get(host) is lookup:
            del self._running[host]
        if not lookup.cancelled():
            lookup.exception()  # retrieved here too: every asker may have given up already
