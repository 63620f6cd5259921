"""A node's gateway: ``protolink-sandbox gateway --listen HOST:PORT``, run as root on each Swarm node.

The sandbox service reaches the sandboxes Swarm placed on a node through that node's gateway;
a client never does. The gateway listens with TLS only (a certificate of its own, made at its
first start in its state directory; the service pins the fingerprint it prints) and takes a call
only with its token (``authorization: Bearer TOKEN``, compared in constant time). Each
``/protolink.sandbox.v1.Sandbox/*`` call names a task container
(:data:`~.service.forward.CONTAINER_KEY`); the gateway asks its node's engine for it and
forwards the call's bytes unchanged (:class:`~.service.forward.Forwarder`, the service's own) to
the server's socket through the task's root, ``/proc/PID/root/run/protolink/sandbox.sock``, or,
for a task whose socket directory is a volume (a gVisor node's: gVisor's ``State.Pid`` has a root
of its own), in that volume's directory on the node (:func:`socket_dir`).

Only the product's containers are reachable: one without the labels of
:func:`~.leftovers.labels` is NOT_FOUND, as a missing one is. One that stopped ends the call
with :class:`~protolink.errors.SandboxLostError`.

A sandbox with egress has its commands' connections carried to the service, which decides
them (:mod:`.egress.streamed`): at the service's first egress stream naming a task, the gateway
dials the task's relay (``egress.sock`` beside the server's socket) and gives each command
connection it accepts to one of the service's waiting streams.

It also removes what gone sandboxes left on its node (:func:`~.leftovers.keep_reaping_node`):
their workspace volumes, and on a manager the Swarm services whose lease expired.

The engine is asked about a container at its first call only: the gateway then holds a pidfd of
its init and forwards the next calls while that process lives. Once it has exited, the entry is
dropped and the engine asked again (the container stopped, or was restarted with another init).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import os
import re
import secrets
import select
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from protolink.errors import (SandboxAuthenticationError, SandboxError, SandboxLostError, SandboxNotFoundError,
                              SandboxUnavailableError)
from protolink.wire.egress import SOCKET_NAME as EGRESS_SOCKET_NAME
from protolink.wire.status import abort_with, to_status

from . import engine
from .client import channel_options
from .egress import streamed
from .egress.dialer import RelayDialer
from .hostdirs import write_private
from .leftovers import CREATED_LABEL, EXPIRY_LABEL, OWNER_LABEL, SESSION_LABEL, keep_reaping_node
from .placements.server import SOCKET_DIR, SOCKET_NAME
from .service.events import Events
from .service.forward import CONTAINER_KEY, Forwarder, InFlight
from .service.tls import ensure_certificate, server_credentials

log = logging.getLogger("protolink.sandbox.gateway")

#: The labels a container must carry to be reached: every sandbox container has them.
PRODUCT_LABELS = (OWNER_LABEL, SESSION_LABEL, CREATED_LABEL, EXPIRY_LABEL)
DEFAULT_STATE_DIR = Path("/var/lib/protolink/gateway")
TOKEN_FILE = "token"
#: A container's id or name, as the engine takes it.
_CONTAINER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


@dataclass
class TaskTarget:
    """A task container's server, reached in its socket directory on this node (a
    :class:`~.service.forward.Target`), which ``sockets`` holds (an ``O_PATH`` descriptor: named
    ``/proc/self/fd/N``, as a volume's long path could not be in a socket address's 108 bytes);
    ``pidfd`` holds its init (the container's ``State.Pid``), which :meth:`running` asks. Its
    egress relay is dialed at the first egress stream (:meth:`egress`)."""

    id: str
    sockets: int
    pidfd: int
    state: str = "running"
    calls: InFlight = field(default_factory=InFlight, repr=False)
    last_used: float = 0.0
    _channel: grpc.aio.Channel | None = field(default=None, repr=False)
    _relay: RelayDialer | None = field(default=None, repr=False)
    _connections: streamed.StreamedConnections = field(default_factory=streamed.StreamedConnections, repr=False)
    _dialing: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"unix://{self._socket(SOCKET_NAME)}", options=channel_options())
        return self._channel

    def _socket(self, name: str) -> Path:
        return Path(f"/proc/self/fd/{self.sockets}/{name}")

    def command_channel(self) -> None:
        """None: a gateway forwards on gRPC (the task's socket offers no command channel here)."""
        return None

    def held_call(self) -> None:
        """None: a gateway opens no call ahead (the service holds a pooled sandbox's)."""
        return None

    def running(self) -> bool:
        """Whether its init still runs (a pidfd is readable once its process has exited)."""
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return not poller.poll(0)

    async def egress(self) -> streamed.StreamedConnections:
        """Where the service's egress streams wait for the task's command connections, its relay
        dialed once; ConnectionError when the relay does not answer (a sandbox without egress)."""
        async with self._dialing:
            if self._relay is None:
                relay = RelayDialer(self._socket(EGRESS_SOCKET_NAME), self._connections)
                await relay.start()
                self._relay = relay
        return self._connections

    async def close(self) -> None:
        if self._relay is not None:
            await self._relay.aclose()
        if self._channel is not None:
            await self._channel.close()
        os.close(self.sockets)
        os.close(self.pidfd)


class Gateway:
    """Finds the task a call names, for those who hold ``token``; ``docker`` is the node's engine."""

    def __init__(self, token: str, docker: Any) -> None:
        if not token:
            raise ValueError("a gateway needs a token")
        self._token = token.encode()
        self.docker = docker
        self._targets: dict[str, TaskTarget] = {}

    async def resolve(self, context: grpc.aio.ServicerContext, method: str) -> tuple[str, TaskTarget]:
        metadata = dict(context.invocation_metadata() or ())
        header = str(metadata.get("authorization", ""))
        given = header.removeprefix("Bearer ").encode() if header.startswith("Bearer ") else b""
        if not hmac.compare_digest(given, self._token):
            await abort_with(context, to_status(SandboxAuthenticationError("a valid gateway token is required")))
        name = str(metadata.get(CONTAINER_KEY, ""))
        found = self._targets.get(name)
        if found is not None and found.running():
            return "", found
        await self._forget_ended()
        container = await asyncio.to_thread(self._inspect, name) if _CONTAINER.fullmatch(name) else None
        labels = (container or {}).get("Config", {}).get("Labels") or {}
        if container is None or not all(key in labels for key in PRODUCT_LABELS):
            await abort_with(context, to_status(SandboxNotFoundError(f"no sandbox container {name!r} on this node")))
        state = container.get("State") or {}
        target = _held(container, int(state.get("Pid") or 0)) if state.get("Running") else None
        if target is None:
            await abort_with(context, to_status(SandboxLostError(
                f"the sandbox container {name} on this node is gone ({state.get('Status', 'unknown')})")))
        return "", await self._keep(name, target)

    def _inspect(self, name: str) -> dict[str, Any] | None:
        import docker.errors

        try:
            return self.docker.api.inspect_container(name)
        except docker.errors.NotFound:
            return None

    async def egress(self, requests: object, context: grpc.aio.ServicerContext) -> None:
        """One egress stream of the service (:data:`.egress.streamed.METHOD`) for the task it names."""
        _, target = await self.resolve(context, streamed.METHOD)
        try:
            connections = await target.egress()
        except ConnectionError as error:
            await abort_with(context, to_status(SandboxUnavailableError(str(error))))
        await connections.stand_by(context)

    async def _keep(self, name: str, target: TaskTarget) -> TaskTarget:
        """Hold ``target`` for the calls naming ``name``, unless a call at the same time got there first."""
        held = self._targets.get(name)
        if held is not None and held.running():
            await target.close()
            return held
        self._targets[name] = target
        if held is not None:
            await held.close()
        return target

    async def _forget_ended(self) -> None:
        """Drop the containers whose init has exited (those no call has named since)."""
        for name, target in list(self._targets.items()):
            if not target.running():
                del self._targets[name]
                await target.close()

    async def close(self) -> None:
        targets, self._targets = self._targets, {}
        for target in targets.values():
            await target.close()


def _held(container: dict[str, Any], pid: int) -> TaskTarget | None:
    """The target of a running container (as the engine inspects it) whose init is ``pid``,
    holding it and its socket directory; None when it has exited."""
    try:
        pidfd = os.pidfd_open(pid) if pid else -1
    except ProcessLookupError:
        return None
    if pidfd < 0:
        return None
    try:
        sockets = os.open(socket_dir(container, pid), os.O_PATH | os.O_DIRECTORY)
    except FileNotFoundError:  # the init exited meanwhile, its root with it
        os.close(pidfd)
        return None
    return TaskTarget(container["Id"], sockets, pidfd)


def socket_dir(container: dict[str, Any], pid: int) -> Path:
    """Where this node holds the server's socket directory of ``container`` (as the engine inspects
    it; ``pid`` its init): the source of a volume mounted there (a gVisor task's, whose sockets
    its runtime makes on the node), else the directory through the init's root."""
    for mount in container.get("Mounts") or ():
        if mount.get("Type") == "volume" and mount.get("Destination") == SOCKET_DIR:
            return Path(mount["Source"])
    return Path(f"/proc/{pid}/root{SOCKET_DIR}")


class EgressHandler(grpc.GenericRpcHandler):
    """The generic handler of the gateway's egress streams (raw bytes both ways)."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if handler_call_details.method != streamed.METHOD:
            return None
        return grpc.stream_stream_rpc_method_handler(self._gateway.egress)


class GatewayServer:
    """The gateway's TLS listener at ``listen`` (``HOST:PORT``; port 0 picks one: :attr:`port`)."""

    def __init__(self, gateway: Gateway, listen: str, credentials: grpc.ServerCredentials) -> None:
        self.gateway, self.listen = gateway, listen
        self.port: int | None = None
        self._server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        self._server.add_generic_rpc_handlers((Forwarder(gateway.resolve, Events()), EgressHandler(gateway)))
        self._credentials = credentials

    async def start(self) -> None:
        self.port = self._server.add_secure_port(self.listen, self._credentials)
        if not self.port:
            raise OSError(f"the gateway cannot listen at {self.listen}")
        await self._server.start()

    async def stop(self, grace: float = 2.0) -> None:
        await self._server.stop(grace)
        await self.gateway.close()


def ensure_token(path: Path) -> str:
    """The token in ``path`` (0600), a new one written there when the file is missing."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = secrets.token_urlsafe(32)
        write_private(path, token)
    if not token:
        raise ValueError(f"the gateway's token file {path} is empty")
    return token


async def serve(listen: str, token_file: Path, state_dir: Path, stop: asyncio.Event | None = None) -> None:
    """Run the gateway until ``stop`` is set (or SIGTERM, SIGINT)."""
    certificate = ensure_certificate(state_dir)
    token = ensure_token(token_file)
    docker_client = await asyncio.to_thread(engine.client)
    server = GatewayServer(Gateway(token, docker_client), listen, server_credentials(certificate))
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    reaping = asyncio.create_task(keep_reaping_node(docker_client))
    try:
        await server.start()
        print(f"gateway listening at {listen.rpartition(':')[0]}:{server.port}\n"
              f"fingerprint: {certificate.fingerprint}\ntoken file: {token_file}", flush=True)
        await stop.wait()
    finally:
        reaping.cancel()
        await asyncio.gather(reaping, return_exceptions=True)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await server.stop()
        await asyncio.to_thread(docker_client.close)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", required=True, metavar="HOST:PORT", help="where the service reaches it (TLS)")
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                        help=f"its certificate and key, made at the first start (default {DEFAULT_STATE_DIR})")
    parser.add_argument("--token-file", type=Path, default=None,
                        help="the token the service presents (default STATE_DIR/token, made when missing)")


def run(args: argparse.Namespace) -> int:
    """Serve as ``args`` say; 2 for options or files that cannot be used."""
    logging.basicConfig(format="%(asctime)s protolink-sandbox gateway: %(message)s", level=logging.WARNING)
    try:
        asyncio.run(serve(args.listen, args.token_file or args.state_dir / TOKEN_FILE, args.state_dir))
    except (ValueError, OSError, SandboxError) as error:  # SandboxError: TLS files that cannot be used
        log.error("%s", error)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="protolink-sandbox gateway", description="A Swarm node's gateway to its sandboxes, run as root on each node.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
