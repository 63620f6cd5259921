"""The host's end of the egress link: standby connections dialed into the sandbox's relay.

The relay (``protolink_sandboxd.egress_relay``, inside the container) listens on
:data:`~protolink.wire.egress.SOCKET_NAME` in the channel directory; the host dials in and
waits. When a command connects to the relay, the relay writes
:data:`~protolink.wire.egress.HANDOVER` on one standby connection and pipes the command's
bytes over it: :class:`RelayDialer` gives that connection to the proxy and dials a replacement
at once. The host never listens: the container cannot reach anything the host made.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Protocol

from protolink.wire.egress import HANDOVER

log = logging.getLogger(__name__)

#: The largest read the proxy's side of a connection buffers before it waits for its reader.
CHUNK = 256 * 1024
#: Pauses between attempts while the relay's socket is missing or refuses (doubling, then the most).
RETRY_SECONDS = (0.05, 1.0)
#: How long :meth:`RelayDialer.start` waits for the relay to answer.
START_SECONDS = 10.0


class ConnectionHandler(Protocol):
    """What serves a command's connection, start to end (an EgressProxy)."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None: ...


class RelayDialer:
    """Keeps ``standby`` connections open to the relay's Unix socket ``socket_path`` and gives
    each one the relay hands a command's connection to ``proxy.handle``, dialing a replacement
    at once. :meth:`start`, then :meth:`aclose` (which ends every connection it holds or handles)."""

    def __init__(self, socket_path: Path, proxy: ConnectionHandler, *, standby: int = 4) -> None:
        if standby < 1:
            raise ValueError(f"standby must be at least 1, got {standby!r}")
        self._path = socket_path
        self._proxy = proxy
        self._standby = standby
        self._keepers: list[asyncio.Task[None]] = []
        self._waiting: set[asyncio.StreamWriter] = set()
        self._handling: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._closed = False

    @property
    def handling(self) -> int:
        """Command connections being served now."""
        return len(self._handling)

    async def start(self) -> None:
        """Dial the first standby connections, waiting up to START_SECONDS for the relay to
        answer (ConnectionError if it does not), and keep that many from then on."""
        if self._keepers or self._closed:
            raise RuntimeError("a RelayDialer starts once")
        deadline = asyncio.get_running_loop().time() + START_SECONDS
        first = []
        try:
            for _ in range(self._standby):
                first.append(await self._dial_until(deadline))
        except BaseException:
            for _, writer in first:
                writer.close()
            raise
        self._keepers = [asyncio.ensure_future(self._keep(stream)) for stream in first]

    async def aclose(self) -> None:
        """Stop dialing and close every connection, standby or being served."""
        self._closed = True
        tasks = [*self._keepers, *self._handling]
        for task in tasks:
            task.cancel()
        for writer in [*self._waiting, *self._handling.values()]:
            writer.close()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _dial_until(self, deadline: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        pause = RETRY_SECONDS[0]
        while True:
            try:
                return await asyncio.open_unix_connection(self._path, limit=CHUNK)
            except OSError as error:
                if asyncio.get_running_loop().time() + pause > deadline:
                    raise ConnectionError(
                        f"the sandbox's egress relay does not answer at {self._path}: {error}") from None
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_SECONDS[1])

    async def _keep(self, stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None) -> None:
        """One standby slot: wait for a handover on ``stream``, serve it, dial the next; forever."""
        pause = RETRY_SECONDS[0]
        while True:
            if stream is None:
                try:
                    stream = await asyncio.open_unix_connection(self._path, limit=CHUNK)
                except OSError:
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, RETRY_SECONDS[1])
                    continue
            reader, writer = stream
            stream = None
            self._waiting.add(writer)
            try:
                first = await reader.read(1)
            except OSError:
                first = b""
            finally:
                self._waiting.discard(writer)
            if first != HANDOVER:  # the relay closed it (it stops, or holds enough): dial again after a pause
                writer.close()
                await asyncio.sleep(pause)
                pause = min(pause * 2, RETRY_SECONDS[1])
                continue
            pause = RETRY_SECONDS[0]
            self._serve(reader, writer)

    def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._handle(reader, writer))
        self._handling[task] = writer
        task.add_done_callback(self._handling.pop)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._proxy.handle(reader, writer)
        except Exception:  # the proxy promises never to raise; one connection's failure must not end others
            log.exception("the egress proxy failed on a connection")
        finally:
            writer.close()

