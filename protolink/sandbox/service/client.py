"""The async client of a sandbox service::

    async with await connect("unix:///run/user/1000/protolink/protolink-appliance.service.sock") as service:
        async with await service.create(memory_mib=512, ttl_seconds=600) as sandbox:
            result = await sandbox.backend.execute(spec, emitter)

A Unix socket needs no setup: without ``token`` the service's local default token is read. A
TCP address needs TLS: pass ``credentials`` (``grpc.ChannelCredentials``) or a ``channel``
already built; a plaintext TCP channel is refused here, and by the service. Refusals are typed,
as the wire carries them (:mod:`protolink.wire.status`): SandboxNotFoundError, QuotaExceededError,
SandboxPermissionError, SandboxAuthenticationError, ValueError, SandboxProtectionError.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import grpc

from protolink.errors import (
    SandboxAuthenticationError,
    SandboxError,
    SandboxNotFoundError,
    SandboxUnavailableError,
)
from protolink.wire._pb import sandbox_pb2, service_pb2, service_pb2_grpc
from protolink.wire.roots import Root
from protolink.wire.status import from_rpc_error

from .. import transfer
from ..addresses import grpc_target, socket_path
from ..client import SandboxBackend, attach, channel_options
from ..transfer import TransferResult
from .files import DEFAULT_NAME, ServiceFiles, commands_socket
from .forward import SANDBOX_KEY
from ..tls import pinned_channel

CALL_SECONDS = 10.0
CREATE_SECONDS = 120.0


@dataclass(frozen=True)
class SandboxStatus:
    """What the service says of a sandbox; times are Unix seconds (0: none). ``state`` is
    ``running``, or how it ended: ``deleted``, ``expired``, ``idle``, ``down``."""

    id: str
    template: str
    image: str
    memory_bytes: int
    cpus: float
    pids: int
    labels: Mapping[str, str]
    created: float
    expires: float
    idle_expires: float
    workspace: str
    pooled: bool
    state: str
    info: bytes = field(default=b"", repr=False, compare=False)

    @classmethod
    def of(cls, message: service_pb2.SandboxStatus) -> SandboxStatus:
        return cls(message.id, message.template, message.image, message.memory_bytes, message.cpus, message.pids,
                   dict(message.labels), message.created, message.expires, message.idle_expires, message.workspace,
                   message.pooled, message.state, message.info)


async def connect(address: str | None = None, token: str | None = None, *, name: str = DEFAULT_NAME,
                  fingerprint: str | None = None, channel: grpc.aio.Channel | None = None,
                  credentials: grpc.ChannelCredentials | None = None, timeout: float = 5.0,
                  command_channel: bool = True) -> ServiceClient:
    """A client of the service at ``address`` (``unix:///path`` or ``host:port``; default: the
    Unix socket of local service ``name``), or over ``channel``. ``token`` defaults to the
    local service's default token. A TCP address is always TLS: pin the service's certificate
    with the ``fingerprint`` that ``up`` printed (CertificateMismatchError when another one
    answers), or pass ``credentials``. SandboxUnavailableError when it does not answer in ``timeout``.

    On a Unix socket, the sandboxes' commands run on the service's command channel
    (:mod:`.command_relay`), their large output passed as pipes, unless ``command_channel`` is
    False (every call on gRPC, as a remote client's)."""
    files = ServiceFiles.of(name)
    if token is None:
        try:
            token = files.default_token.read_text().strip()
        except FileNotFoundError:
            raise SandboxAuthenticationError(f"no token given, and service {name} has no default token at "
                                             f"{files.default_token} (is it up?)") from None
    owned = channel is None
    if channel is None:
        address = address or files.address
        if socket_path(address) is not None:
            channel = grpc.aio.insecure_channel(address, options=channel_options())
        elif fingerprint is not None:
            channel = await pinned_channel(grpc_target(address), fingerprint, options=channel_options(),
                                           connect_seconds=timeout)
        elif credentials is None:
            raise ValueError(f"{address} is TCP: pass fingerprint= (the one `up` printed), credentials= (TLS) or "
                             "a channel=; tokens never travel in clear")
        else:
            channel = grpc.aio.secure_channel(grpc_target(address), credentials, options=channel_options())
    path = socket_path(address) if address is not None and command_channel else None
    client = ServiceClient(channel, token, owns_channel=owned, command_socket=path and commands_socket(path))
    try:
        await client.list(timeout=timeout, wait_for_ready=True)
    except BaseException:
        await client.aclose()
        raise
    return client


class ServiceClient:
    """A connection to a sandbox service as one token (its tenant); see the module."""

    def __init__(self, channel: grpc.aio.Channel, token: str, *, owns_channel: bool = True,
                 command_socket: str | None = None) -> None:
        self.channel = channel
        #: The service's command channel, for a client on its host (:mod:`.command_relay`).
        self.command_socket = command_socket
        self._backends: set[SandboxBackend] = set()  # of the sandboxes it opened, closed with it
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._stub = service_pb2_grpc.SandboxServiceStub(channel)
        self._owns_channel = owns_channel

    async def __aenter__(self) -> ServiceClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection and the backends of the sandboxes it opened (their calls and
        connections of their own); the sandboxes themselves stay."""
        backends, self._backends = self._backends, set()
        for backend in backends:
            await backend.aclose()
        if self._owns_channel:
            await self.channel.close()

    async def _call(self, method: str, request: Any, *, timeout: float = CALL_SECONDS,
                    wait_for_ready: bool = False) -> Any:
        try:
            return await getattr(self._stub, method)(request, metadata=self._metadata, timeout=timeout,
                                                     wait_for_ready=wait_for_ready)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error) from None

    async def create(self, template: str = "", *, image: str | None = None, memory_mib: int | None = None,
                     cpus: float | None = None, pids: int | None = None, allow: Sequence[str] | None = None,
                     ttl_seconds: float | None = None, idle_seconds: float | None = None,
                     labels: Mapping[str, str] | None = None, roots: Sequence[str | Root] = (),
                     workspace: bool = False, timeout: float = CREATE_SECONDS) -> Sandbox:
        """A new sandbox of ``template`` (empty: the service's default) with these changes; one
        that changes nothing may come from the warm pool. ``allow`` (egress rules; ``[]``: a
        relay that allows nothing yet) gives it a way out; ``roots`` (``PATH[:rw]`` or Root)
        must lie in roots the service allows; ``workspace`` adds an empty managed workspace."""
        parsed = [root if isinstance(root, Root) else Root.parse(root) for root in roots]
        request = service_pb2.CreateRequest(
            template=template, image=image, memory_bytes=None if memory_mib is None else memory_mib << 20, cpus=cpus,
            pids=pids, allow=list(allow or ()), egress=allow is not None, ttl_seconds=ttl_seconds,
            idle_seconds=idle_seconds, labels=dict(labels or {}),
            roots=[service_pb2.HostRoot(path=root.path, writable=root.writable) for root in parsed],
            managed_workspace=workspace)
        status = SandboxStatus.of(await self._call("Create", request, timeout=timeout))
        return await Sandbox.open(self, status)

    async def list(self, *, timeout: float = CALL_SECONDS, wait_for_ready: bool = False) -> list[SandboxStatus]:
        """This token's sandboxes: those that run, then those that ended lately."""
        answer = await self._call("List", service_pb2.ListRequest(), timeout=timeout, wait_for_ready=wait_for_ready)
        return [SandboxStatus.of(item) for item in answer.sandboxes]

    async def pool_ready(self) -> dict[str, int]:
        """How many never-used sandboxes each template's pool holds now."""
        return dict((await self._call("List", service_pb2.ListRequest())).pool_ready)

    async def get(self, sandbox_id: str) -> SandboxStatus:
        return SandboxStatus.of(await self._call("Get", service_pb2.GetRequest(id=sandbox_id)))

    async def open(self, sandbox_id: str) -> Sandbox:
        """A handle on this token's running sandbox ``sandbox_id`` (after a restart of the client, say)."""
        return await Sandbox.open(self, await self.get(sandbox_id))

    async def renew(self, sandbox_id: str, ttl_seconds: float | None = None) -> SandboxStatus:
        """Give ``sandbox_id`` ``ttl_seconds`` more from now (None: its own time to live)."""
        request = service_pb2.RenewRequest(id=sandbox_id, ttl_seconds=ttl_seconds or 0.0)
        return SandboxStatus.of(await self._call("Renew", request))

    async def delete(self, sandbox_id: str) -> None:
        await self._call("Delete", service_pb2.DeleteRequest(id=sandbox_id))

    def metadata(self, sandbox_id: str) -> tuple[tuple[str, str], ...]:
        """The metadata of a call forwarded to ``sandbox_id``."""
        return (*self._metadata, (SANDBOX_KEY, sandbox_id))


@dataclass
class Sandbox:
    """One sandbox of a :class:`ServiceClient`: its ``id``, ``status`` at creation and ``backend``
    (the :class:`~protolink.sandbox.client.SandboxBackend` every tool takes). ``async with`` it
    to delete it at the end."""

    client: ServiceClient
    status: SandboxStatus
    backend: SandboxBackend = field(repr=False)

    @classmethod
    async def open(cls, client: ServiceClient, status: SandboxStatus) -> Sandbox:
        info = sandbox_pb2.InfoResponse.FromString(status.info) if status.info else None
        try:
            backend = await attach(client.channel, client.metadata(status.id), timeout=CALL_SECONDS, info=info,
                                   command_socket=client.command_socket)
        except SandboxUnavailableError:
            raise
        except SandboxError as error:
            raise SandboxNotFoundError(f"sandbox {status.id} cannot be reached: {error}") from None
        client._backends.add(backend)
        return cls(client, status, backend)

    @property
    def id(self) -> str:
        return self.status.id

    async def renew(self, ttl_seconds: float | None = None) -> SandboxStatus:
        self.status = await self.client.renew(self.id, ttl_seconds)
        return self.status

    async def upload(self, source: str | os.PathLike[str], destination: str, **options: Any) -> TransferResult:
        """A local file, or a directory as tar, into the sandbox at ``destination`` (in a writable
        root, the managed workspace say): :func:`protolink.sandbox.transfer.upload`."""
        return await transfer.upload(self.backend, source, destination, **options)

    async def download(self, source: str, destination: str | os.PathLike[str], **options: Any) -> TransferResult:
        """A file or directory of the sandbox to the local ``destination``:
        :func:`protolink.sandbox.transfer.download`."""
        return await transfer.download(self.backend, source, destination, **options)

    async def delete(self) -> None:
        """Close the backend and delete the sandbox (one already gone is no error)."""
        await self.backend.aclose()
        self.client._backends.discard(self.backend)
        try:
            await self.client.delete(self.id)
        except SandboxNotFoundError:
            pass

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.delete()
