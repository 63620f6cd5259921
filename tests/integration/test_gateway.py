"""A node's gateway (:mod:`protolink.sandbox.gateway`) on this host's engine: TLS and a token
only, the product's containers only, the typed loss for a container that stopped."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from protolink.errors import SandboxAuthenticationError, SandboxLostError, SandboxNotFoundError
from protolink.sandbox.client import attach
from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.gateway import Gateway, GatewayServer
from protolink.sandbox.service.forward import CONTAINER_KEY
from protolink.sandbox.service.tls import ensure_certificate, server_credentials
from protolink.sandbox.tls import pinned_channel
from protolink.wire._pb import sandbox_pb2
from protolink.wire.status import from_rpc_error
from tests.conftest import TEST_NAME_PREFIX
from tests.descriptors import descriptor_targets

pytestmark = pytest.mark.docker

INFO = "/protolink.sandbox.v1.Sandbox/Info"
TOKEN = secrets.token_urlsafe(16)


class Reached:
    """The gateway's address and fingerprint, and calls through it."""

    def __init__(self, address: str, fingerprint: str) -> None:
        self.address, self.fingerprint = address, fingerprint

    async def info(self, container: str, token: str | None = TOKEN) -> sandbox_pb2.InfoResponse:
        """The Info of ``container``'s server through the gateway; the typed error of a refusal."""
        metadata = [(CONTAINER_KEY, container)] + ([("authorization", f"Bearer {token}")] if token is not None else [])
        channel = await pinned_channel(self.address, self.fingerprint)
        try:
            answer = await channel.unary_unary(INFO)(sandbox_pb2.InfoRequest().SerializeToString(),
                                                    metadata=metadata, timeout=60)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error) from None
        finally:
            await channel.close()
        return sandbox_pb2.InfoResponse.FromString(answer)


@asynccontextmanager
async def serving(docker_client, state: Path) -> AsyncIterator[Reached]:
    """A gateway on this host's engine, stopped at the end."""
    certificate = ensure_certificate(state)
    server = GatewayServer(Gateway(TOKEN, docker_client), "127.0.0.1:0", server_credentials(certificate))
    await server.start()
    try:
        yield Reached(f"127.0.0.1:{server.port}", certificate.fingerprint)
    finally:
        await server.stop()


@pytest.fixture
async def gateway(docker_client, tmp_path: Path) -> AsyncIterator[Reached]:
    async with serving(docker_client, tmp_path / "state") as reached:
        yield reached


def _pidfds() -> list[int]:
    """This process's open pidfds (a gateway holds one per container it reaches)."""
    return [fd for fd, target in descriptor_targets().items() if target == "anon_inode:[pidfd]"]


@pytest.fixture
async def sandbox(sandbox_image: str) -> AsyncIterator[DockerSandbox]:
    made = DockerSandbox(image=sandbox_image, name=f"{TEST_NAME_PREFIX}gateway-{secrets.token_hex(4)}")
    await made.start()
    try:
        yield made
    finally:
        await made.aclose()


@pytest.fixture
def unlabelled(docker_client, sandbox_image: str) -> Any:
    """A running container of the sandbox image without the product's labels."""
    container = docker_client.containers.run(sandbox_image, ["600"], entrypoint=["/bin/sleep"], detach=True,
                                             name=f"{TEST_NAME_PREFIX}gateway-plain-{secrets.token_hex(4)}",
                                             network_mode="none")
    yield container
    container.remove(force=True)


async def test_the_gateway_forwards_to_a_sandbox_through_its_root(gateway, sandbox, run):
    info = await gateway.info(sandbox.container_id)
    assert info.boundary == sandbox.boundary
    channel = await pinned_channel(gateway.address, gateway.fingerprint,
                                   call_metadata=[("authorization", f"Bearer {TOKEN}"),
                                                  (CONTAINER_KEY, sandbox.container_id)])
    backend = await attach(channel, owns_channel=True, timeout=60)
    async with backend:
        who = await run(backend, ["/usr/bin/id", "-u"])
    assert who.stdout == "65534\n"


async def test_a_call_without_the_token_or_with_another_is_refused(gateway, sandbox):
    with pytest.raises(SandboxAuthenticationError):
        await gateway.info(sandbox.container_id, token=None)
    with pytest.raises(SandboxAuthenticationError):
        await gateway.info(sandbox.container_id, token=TOKEN + "x")
    with pytest.raises(SandboxAuthenticationError):
        await gateway.info(sandbox.container_id, token="")


async def test_the_gateway_does_not_answer_plaintext(gateway, sandbox):
    channel = grpc.aio.insecure_channel(gateway.address)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await channel.unary_unary(INFO)(sandbox_pb2.InfoRequest().SerializeToString(), timeout=10,
                                            metadata=[("authorization", f"Bearer {TOKEN}"),
                                                      (CONTAINER_KEY, sandbox.container_id)])
    finally:
        await channel.close()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_container_without_the_products_labels_is_not_found_like_a_missing_one(gateway, unlabelled):
    with pytest.raises(SandboxNotFoundError) as plain:
        await gateway.info(unlabelled.id)
    with pytest.raises(SandboxNotFoundError) as missing:
        await gateway.info("0" * 64)
    assert str(plain.value).replace(unlabelled.id, "0" * 64) == str(missing.value)


async def test_the_gateway_asks_its_engine_about_a_container_at_its_first_call_only(gateway, sandbox, caplog):
    with caplog.at_level(logging.DEBUG, logger="urllib3.connectionpool"):  # it logs every request it sends
        for _ in range(3):
            assert (await gateway.info(sandbox.container_id)).boundary == sandbox.boundary
    inspections = [record for record in caplog.records if f"/containers/{sandbox.container_id}/json" in
                   record.getMessage()]
    assert len(inspections) == 1


async def test_a_sandbox_whose_container_stopped_is_lost(gateway, sandbox, docker_client):
    await gateway.info(sandbox.container_id)  # reached once: the gateway holds it
    docker_client.api.kill(sandbox.container_id)
    docker_client.api.wait(sandbox.container_id, timeout=60)
    for _ in range(2):  # and at every call after
        with pytest.raises(SandboxLostError):
            await gateway.info(sandbox.container_id)


async def test_first_calls_at_the_same_time_hold_the_container_once_and_nothing_outlives_the_gateway(
        docker_client, sandbox, tmp_path: Path):
    before = _pidfds()
    async with serving(docker_client, tmp_path / "state") as gateway:
        await asyncio.gather(*(gateway.info(sandbox.container_id) for _ in range(8)))
        assert len(_pidfds()) == len(before) + 1
    assert _pidfds() == before
