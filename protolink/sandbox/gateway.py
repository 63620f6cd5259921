"""A node's gateway: ``protolink-sandbox gateway --listen HOST:PORT``, run as root on each Swarm node.

The sandbox service reaches the sandboxes Swarm placed on a node through that node's gateway;
a client never does. The gateway listens with TLS only (a certificate of its own, made at its
first start in its state directory; the service pins the fingerprint it prints) and takes a call
only with its token (``authorization: Bearer TOKEN``, compared in constant time). Each
``/protolink.sandbox.v1.Sandbox/*`` call names a task container
(:data:`~.service.forward.CONTAINER_KEY`); the gateway asks its node's engine for it and
forwards the call's bytes unchanged (:class:`~.service.forward.Forwarder`, the service's own) to
the server's socket through the task's root, ``/proc/PID/root/run/protolink/sandbox.sock``.

Only the product's containers are reachable: one without the labels of
:func:`~.leftovers.labels` is NOT_FOUND, as a missing one is. One that stopped ends the call
with :class:`~protolink.errors.SandboxLostError`.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import re
import secrets
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from protolink.errors import SandboxAuthenticationError, SandboxError, SandboxLostError, SandboxNotFoundError
from protolink.wire.status import abort_with, to_status

from . import engine
from .client import channel_options
from .hostdirs import write_private
from .leftovers import CREATED_LABEL, EXPIRY_LABEL, OWNER_LABEL, SESSION_LABEL
from .placements.server import SOCKET_PATH
from .service.events import Events
from .service.forward import CONTAINER_KEY, Forwarder
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
    """A task container's server, reached through its root (a :class:`~.service.forward.Target`)."""

    id: str
    pid: int
    state: str = "running"
    active: int = 0
    last_used: float = 0.0
    _channel: grpc.aio.Channel | None = field(default=None, repr=False)

    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"unix:///proc/{self.pid}/root{SOCKET_PATH}",
                                                      options=channel_options())
        return self._channel


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
        container = await asyncio.to_thread(self._inspect, name) if _CONTAINER.fullmatch(name) else None
        labels = (container or {}).get("Config", {}).get("Labels") or {}
        if container is None or not all(key in labels for key in PRODUCT_LABELS):
            await abort_with(context, to_status(SandboxNotFoundError(f"no sandbox container {name!r} on this node")))
        state = container.get("State") or {}
        if not state.get("Running") or not state.get("Pid"):
            await self._forget(container["Id"])
            await abort_with(context, to_status(SandboxLostError(
                f"the sandbox container {name} on this node is gone ({state.get('Status', 'unknown')})")))
        return "", self._target(container["Id"], int(state["Pid"]))

    def _inspect(self, name: str) -> dict[str, Any] | None:
        import docker.errors

        try:
            return self.docker.api.inspect_container(name)
        except docker.errors.NotFound:
            return None

    def _target(self, container_id: str, pid: int) -> TaskTarget:
        target = self._targets.get(container_id)
        if target is None or target.pid != pid:
            target = self._targets[container_id] = TaskTarget(container_id, pid)
        return target

    async def _forget(self, container_id: str) -> None:
        target = self._targets.pop(container_id, None)
        if target is not None and target._channel is not None:
            await target._channel.close()

    async def close(self) -> None:
        for container_id in list(self._targets):
            await self._forget(container_id)


class GatewayServer:
    """The gateway's TLS listener at ``listen`` (``HOST:PORT``; port 0 picks one: :attr:`port`)."""

    def __init__(self, gateway: Gateway, listen: str, credentials: grpc.ServerCredentials) -> None:
        self.gateway, self.listen = gateway, listen
        self.port: int | None = None
        self._server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        self._server.add_generic_rpc_handlers((Forwarder(gateway.resolve, Events()),))
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
    try:
        await server.start()
        print(f"gateway listening at {listen.rpartition(':')[0]}:{server.port}\n"
              f"fingerprint: {certificate.fingerprint}\ntoken file: {token_file}", flush=True)
        await stop.wait()
    finally:
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
    parser = argparse.ArgumentParser(prog="protolink-sandbox gateway", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
