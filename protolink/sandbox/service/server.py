"""The service's gRPC server: the control API (service.proto) and the forwarded sandbox calls.

It listens on a Unix socket (0600, in this user's runtime directory) and, when asked, on a TCP
address, which takes TLS credentials (``grpc.ServerCredentials``, e.g. from
``grpc.ssl_server_credentials``): without them the server refuses to start, since tokens must
never cross a network in clear. Every call needs ``authorization: Bearer <token>``, on the Unix
socket too: the token is the tenant. Beside the Unix socket, the command channel of its local
clients (:mod:`.command_relay`) takes the same tokens.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn, TypeVar

import grpc

from protolink.errors import SandboxAuthenticationError, SandboxError, SandboxNotFoundError, SandboxUnavailableError
from protolink.wire._pb import service_pb2, service_pb2_grpc
from protolink.wire.keepalive import SERVER_KEEPALIVE_OPTIONS
from protolink.wire.roots import Root
from protolink.wire.status import abort_with, to_status

from .command_relay import CommandRelay
from .config import Overrides
from .events import Events
from .files import commands_socket
from .forward import SANDBOX_KEY, Forwarder
from .manager import Manager
from .sandboxes import Placed
from .tokens import Tenant, Tokens

MAX_MESSAGE_BYTES = 64 << 20
RefusalT = TypeVar("RefusalT", bound=BaseException)


class Gate:
    """Who calls: the tenant of the call's bearer token, or the call is refused (UNAUTHENTICATED)."""

    def __init__(self, tokens: Tokens, manager: Manager, events: Events) -> None:
        self.tokens, self.manager, self.events = tokens, manager, events

    async def tenant(self, context: grpc.aio.ServicerContext, method: str) -> Tenant:
        try:
            return self.tenant_of(_metadata(context), method)
        except SandboxAuthenticationError as error:
            await abort_with(context, to_status(error))

    async def sandbox(self, context: grpc.aio.ServicerContext, method: str) -> tuple[str, Placed]:
        """The caller's sandbox that the call's metadata names, for forwarding."""
        try:
            return await self.sandbox_of(_metadata(context), method)
        except SandboxError as error:
            await abort_with(context, to_status(error))

    def tenant_of(self, metadata: Mapping[str, str], method: str) -> Tenant:
        """The tenant of a call with ``metadata``; SandboxAuthenticationError (an event says it) when none."""
        header = metadata.get("authorization", "")
        tenant = self.tokens.tenant(header.removeprefix("Bearer ")) if header.startswith("Bearer ") else None
        if tenant is None:
            raise self.refused(SandboxAuthenticationError("a valid token is required (authorization: Bearer)"),
                               None, method)
        self.events.emit("request", tenant.id, metadata.get(SANDBOX_KEY, ""), method=method)
        return tenant

    async def sandbox_of(self, metadata: Mapping[str, str], method: str) -> tuple[str, Placed]:
        """The tenant of a call with ``metadata``, and its sandbox that they name; the typed
        refusal (an event says it) when there is none."""
        tenant = self.tenant_of(metadata, method)
        try:
            return tenant.id, await self.manager.reach(tenant, metadata.get(SANDBOX_KEY, ""))
        except (SandboxNotFoundError, SandboxUnavailableError) as error:
            raise self.refused(error, tenant, method) from None

    def refused(self, error: RefusalT, tenant: Tenant | None, method: str) -> RefusalT:
        """``error``, once the event of its refusal is out (its full text goes to the events only)."""
        self.events.emit("refused", tenant.id if tenant else "", method=method, code=to_status(error)[0].name,
                         reason=str(error))
        return error

    async def refuse(self, context: grpc.aio.ServicerContext, error: BaseException, tenant: Tenant,
                     method: str) -> NoReturn:
        """End the call with ``error`` as the wire carries it (:func:`~protolink.wire.status.to_status`):
        the client raises the same typed error."""
        await abort_with(context, to_status(self.refused(error, tenant, method)))


def _metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    return {key: str(value) for key, value in context.invocation_metadata() or ()}


def status(placed: Placed) -> service_pb2.SandboxStatus:
    return service_pb2.SandboxStatus(**placed.to_dict())


def overrides(request: service_pb2.CreateRequest) -> Overrides:
    def given(name: str) -> Any:
        return getattr(request, name) if request.HasField(name) else None

    return Overrides(image=given("image"), memory_bytes=given("memory_bytes"), cpus=given("cpus"),
                     pids=given("pids"), allow=tuple(request.allow) if request.egress else None,
                     ttl_seconds=given("ttl_seconds"), idle_seconds=given("idle_seconds"),
                     labels=dict(request.labels), roots=tuple(Root(r.path, r.writable) for r in request.roots),
                     workspace=request.managed_workspace)


class Control(service_pb2_grpc.SandboxServiceServicer):
    """The control API; each call is its caller's alone."""

    def __init__(self, gate: Gate, manager: Manager, events: Events) -> None:
        self.gate, self.manager, self.events = gate, manager, events

    async def Create(self, request: service_pb2.CreateRequest, context: grpc.aio.ServicerContext) -> Any:
        tenant = await self.gate.tenant(context, "Create")
        try:
            return status(await self.manager.create(tenant, request.template, overrides(request)))
        except (SandboxError, ValueError) as error:
            await self.gate.refuse(context, error, tenant, "Create")

    async def List(self, request: service_pb2.ListRequest, context: grpc.aio.ServicerContext) -> Any:
        tenant = await self.gate.tenant(context, "List")
        return service_pb2.ListResponse(sandboxes=[status(placed) for placed in self.manager.listing(tenant)],
                                        pool_ready={name: len(pool) for name, pool in self.manager.pools.items()})

    async def Get(self, request: service_pb2.GetRequest, context: grpc.aio.ServicerContext) -> Any:
        tenant = await self.gate.tenant(context, "Get")
        try:
            return status(self.manager.find(tenant, request.id))
        except SandboxError as error:
            await self.gate.refuse(context, error, tenant, "Get")

    async def Renew(self, request: service_pb2.RenewRequest, context: grpc.aio.ServicerContext) -> Any:
        tenant = await self.gate.tenant(context, "Renew")
        try:
            return status(self.manager.renew(tenant, request.id, request.ttl_seconds or None))
        except SandboxError as error:
            await self.gate.refuse(context, error, tenant, "Renew")

    async def Delete(self, request: service_pb2.DeleteRequest, context: grpc.aio.ServicerContext) -> Any:
        tenant = await self.gate.tenant(context, "Delete")
        try:
            await self.manager.delete(tenant, request.id)
        except SandboxError as error:
            await self.gate.refuse(context, error, tenant, "Delete")
        return service_pb2.DeleteResponse()


def control_handler(control: Control) -> grpc.GenericRpcHandler:
    """The handler of the control API under its name in service.proto (the generated
    registration names the service after the module it was moved to)."""
    service = service_pb2.DESCRIPTOR.services_by_name["SandboxService"]
    return grpc.method_handlers_generic_handler(service.full_name, {
        method.name: grpc.unary_unary_rpc_method_handler(
            getattr(control, method.name),
            request_deserializer=getattr(service_pb2, method.input_type.name).FromString,
            response_serializer=getattr(service_pb2, method.output_type.name).SerializeToString)
        for method in service.methods
    })


class ServiceServer:
    """The server of one service: ``unix_path`` always; ``tcp`` (``HOST:PORT``) only with
    ``tcp_credentials`` (ValueError otherwise)."""

    def __init__(self, manager: Manager, tokens: Tokens, events: Events, *, unix_path: str,
                 tcp: str | None = None, tcp_credentials: grpc.ServerCredentials | None = None) -> None:
        if tcp is not None and tcp_credentials is None:
            raise ValueError(f"a TCP listener ({tcp}) needs TLS credentials: tokens never cross a network in clear")
        self.manager, self.events = manager, events
        self.unix_path, self.tcp, self.tcp_credentials = unix_path, tcp, tcp_credentials
        self.tcp_port: int | None = None
        gate = Gate(tokens, manager, events)
        # Its clients are SandboxBackends, whose keepalives it accepts as a sandbox's server does.
        self._server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                                *SERVER_KEEPALIVE_OPTIONS, ("grpc.so_reuseport", 0)])
        self._server.add_generic_rpc_handlers((control_handler(Control(gate, manager, events)),
                                               Forwarder(gate.sandbox, events)))
        self._commands = CommandRelay(commands_socket(unix_path), gate.sandbox_of, events)

    @property
    def addresses(self) -> Iterable[str]:
        yield f"unix://{self.unix_path}"
        if self.tcp is not None:
            yield f"{self.tcp.rpartition(':')[0]}:{self.tcp_port}"

    async def start(self) -> None:
        if os.path.exists(self.unix_path):
            os.unlink(self.unix_path)
        old = os.umask(0o177)  # the socket is born 0600
        try:
            self._server.add_insecure_port(f"unix://{self.unix_path}")
            if self.tcp is not None:
                assert self.tcp_credentials is not None
                self.tcp_port = self._server.add_secure_port(self.tcp, self.tcp_credentials)
            await self._server.start()
        finally:
            os.umask(old)
        self._commands.start()

    async def stop(self, grace: float = 2.0) -> None:
        await self._commands.aclose()
        await self._server.stop(grace)
