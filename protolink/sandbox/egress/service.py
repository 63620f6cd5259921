"""One sandbox's egress on the host: its :class:`~protolink.sandbox.egress.proxy.EgressProxy`
fed by a :class:`~protolink.sandbox.egress.dialer.RelayDialer` dialed into the relay's socket
in the sandbox's channel directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from protolink.wire.egress import SOCKET_NAME

from .dialer import RelayDialer
from .events import EgressEvent
from .policy import EgressPolicy
from .proxy import EgressProxy


class EgressService:
    """The proxy and the dialer of one sandbox; :meth:`start` one, :meth:`aclose` it once."""

    def __init__(self, proxy: EgressProxy, dialer: RelayDialer) -> None:
        self._proxy = proxy
        self._dialer = dialer

    @classmethod
    async def start(cls, channel_dir: Path, policy: EgressPolicy, *, sandbox: str,
                    on_event: Callable[[EgressEvent], None] | None = None, standby: int = 4) -> EgressService:
        """Serve the relay of the sandbox whose channel directory is ``channel_dir`` (its server
        answers already) under ``policy``; every decision goes to ``on_event``. ConnectionError
        when the relay does not answer; nothing is left running then."""
        proxy = EgressProxy(policy, sandbox=sandbox, on_event=on_event)
        dialer = RelayDialer(Path(channel_dir) / SOCKET_NAME, proxy, standby=standby)
        try:
            await dialer.start()
        except BaseException:
            await proxy.aclose()
            raise
        return cls(proxy, dialer)

    @property
    def policy(self) -> EgressPolicy:
        """The policy in force."""
        return self._proxy.policy

    def set_policy(self, policy: EgressPolicy) -> None:
        """Apply ``policy`` to new connections at once, and close the open ones it would refuse."""
        self._proxy.set_policy(policy)

    async def aclose(self) -> None:
        """Stop dialing and end every connection."""
        await self._dialer.aclose()
        await self._proxy.aclose()
