"""One sandbox's egress at the side that decides: its
:class:`~protolink.sandbox.egress.proxy.EgressProxy`, fed the commands' connections by a
:class:`~protolink.sandbox.egress.dialer.RelayDialer` dialed into the relay's socket in the
sandbox's channel directory (on this host), or by
:class:`~protolink.sandbox.egress.streamed.GatewayStreams` through the gateway of the node the
sandbox runs on (on Swarm)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import grpc

from protolink.wire.egress import SOCKET_NAME

from .dialer import ConnectionHandler, RelayDialer
from .events import EgressEvent
from .policy import EgressPolicy
from .proxy import EgressProxy
from .streamed import GatewayStreams


class Feed(Protocol):
    """What brings the proxy the commands' connections: :meth:`start` once, then :meth:`aclose`."""

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


class EgressService:
    """The proxy and the feed of one sandbox; :meth:`start` or :meth:`through_gateway` one,
    :meth:`aclose` it once."""

    def __init__(self, proxy: EgressProxy, feed: Feed) -> None:
        self._proxy = proxy
        self._feed = feed

    @classmethod
    async def start(cls, channel_dir: Path, policy: EgressPolicy, *, sandbox: str,
                    on_event: Callable[[EgressEvent], None] | None = None, standby: int = 4) -> EgressService:
        """Serve the relay of the sandbox whose channel directory is ``channel_dir`` (its server
        answers already) under ``policy``; every decision goes to ``on_event``. ConnectionError
        when the relay does not answer; nothing is left running then."""
        return await cls._fed(lambda proxy: RelayDialer(Path(channel_dir) / SOCKET_NAME, proxy, standby=standby),
                              policy, sandbox, on_event)

    @classmethod
    async def through_gateway(cls, channel: grpc.aio.Channel, policy: EgressPolicy, *, sandbox: str,
                              on_event: Callable[[EgressEvent], None] | None = None,
                              standby: int = 4) -> EgressService:
        """As :meth:`start`, for a sandbox whose node's gateway ``channel`` reaches (its calls
        name the sandbox's task); ConnectionError when the gateway does not reach the relay."""
        return await cls._fed(lambda proxy: GatewayStreams(channel, proxy, standby=standby), policy, sandbox, on_event)

    @classmethod
    async def _fed(cls, feed: Callable[[ConnectionHandler], Feed], policy: EgressPolicy, sandbox: str,
                   on_event: Callable[[EgressEvent], None] | None) -> EgressService:
        proxy = EgressProxy(policy, sandbox=sandbox, on_event=on_event)
        fed = feed(proxy)
        try:
            await fed.start()
        except BaseException:
            await proxy.aclose()
            raise
        return cls(proxy, fed)

    @property
    def policy(self) -> EgressPolicy:
        """The policy in force."""
        return self._proxy.policy

    def set_policy(self, policy: EgressPolicy) -> None:
        """Apply ``policy`` to new connections at once, and close the open ones it would refuse."""
        self._proxy.set_policy(policy)

    async def aclose(self) -> None:
        """Stop the feed and end every connection."""
        await self._feed.aclose()
        await self._proxy.aclose()
