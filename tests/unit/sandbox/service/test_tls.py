"""The service's TLS: a certificate made once and kept, a key only its owner reads, and clients
that reach a real gRPC server on loopback only with the pinned fingerprint."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import stat
import threading
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
from cryptography import x509
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from protolink.errors import CertificateMismatchError, SandboxError, SandboxNotReachedError
from protolink.sandbox.service.tls import ServiceCertificate, ensure_certificate, server_credentials
from protolink.sandbox.tls import fingerprint_of, pinned_channel

CALL_SECONDS = 60  # a hang guard only


@contextlib.asynccontextmanager
async def health_server(certificate: ServiceCertificate | None) -> AsyncIterator[str]:
    """A gRPC server with the standard health service on a loopback port: TLS with
    ``certificate``, plaintext without. Yields its address."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = (server.add_secure_port("127.0.0.1:0", server_credentials(certificate)) if certificate
            else server.add_insecure_port("127.0.0.1:0"))
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def _check(channel: grpc.aio.Channel) -> int:
    async with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=CALL_SECONDS)
        return answer.status


def test_a_certificate_is_made_once_then_kept_with_a_private_key(tmp_path):
    first = ensure_certificate(tmp_path / "state")
    assert stat.S_IMODE(first.key_path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    assert first.fingerprint.startswith("sha256:") and len(first.fingerprint) == 7 + 64
    assert first.fingerprint == fingerprint_of(first.certificate_path.read_bytes())
    second = ensure_certificate(tmp_path / "state")
    assert (second.fingerprint, second.key_pem) == (first.fingerprint, first.key_pem)
    assert "key_pem" not in repr(second)


def test_services_starting_at_once_make_one_certificate(tmp_path):
    starters, start = 6, threading.Barrier(6)
    made: list[str] = []

    def ensure() -> None:
        start.wait(timeout=60)
        made.append(ensure_certificate(tmp_path / "state").fingerprint)

    threads = [threading.Thread(target=ensure) for _ in range(starters)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(made) == starters and len(set(made)) == 1
    assert sorted(path.name for path in (tmp_path / "state").iterdir()) == ["service-cert.pem", "service-key.pem"]


def test_the_certificate_names_localhost_its_address_and_this_host(tmp_path):
    certificate = x509.load_pem_x509_certificate(ensure_certificate(tmp_path).certificate_pem)
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", socket.gethostname()} <= set(names.get_values_for_type(x509.DNSName))
    assert {"127.0.0.1", "::1"} <= {str(address) for address in names.get_values_for_type(x509.IPAddress)}
    assert (certificate.not_valid_after_utc - certificate.not_valid_before_utc).days >= 3650


def test_a_key_others_can_read_is_refused(tmp_path):
    certificate = ensure_certificate(tmp_path)
    certificate.key_path.chmod(0o644)
    with pytest.raises(SandboxError, match="only its owner can read"):
        ensure_certificate(tmp_path)


def test_a_key_of_another_certificate_is_refused(tmp_path):
    ensure_certificate(tmp_path / "one")
    other = ensure_certificate(tmp_path / "two")
    (tmp_path / "one" / other.key_path.name).write_bytes(other.key_pem)
    with pytest.raises(SandboxError, match="does not belong"):
        ensure_certificate(tmp_path / "one")


async def test_the_pinned_fingerprint_reaches_the_service(tmp_path):
    certificate = ensure_certificate(tmp_path)
    async with health_server(certificate) as address:
        channel = await pinned_channel(address, certificate.fingerprint)
        assert await _check(channel) == health_pb2.HealthCheckResponse.SERVING


async def test_a_wrong_fingerprint_is_refused_before_any_call(tmp_path):
    certificate, other = ensure_certificate(tmp_path / "one"), ensure_certificate(tmp_path / "two")
    async with health_server(certificate) as address:
        with pytest.raises(CertificateMismatchError, match=other.fingerprint):
            await pinned_channel(address, other.fingerprint)


async def test_a_fingerprint_that_is_not_one_is_refused(tmp_path):
    with pytest.raises(ValueError, match="64 hex digits"):
        await pinned_channel("127.0.0.1:1", "md5:00")


async def test_a_plaintext_client_cannot_call_the_tls_listener(tmp_path):
    async with health_server(ensure_certificate(tmp_path)) as address:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _check(grpc.aio.insecure_channel(address))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_tls_client_against_a_plaintext_server_fails_clearly(tmp_path):
    async with health_server(None) as address:
        with pytest.raises(SandboxNotReachedError, match="does not speak TLS"):
            await pinned_channel(address, ensure_certificate(tmp_path).fingerprint)


async def test_a_certificate_swapped_after_the_fetch_fails_the_handshake(tmp_path):
    """The first connection (the fetch) reaches the pinned server, the next ones (the channel's)
    an impostor with another certificate for the same names."""
    pinned, impostor = ensure_certificate(tmp_path / "pinned"), ensure_certificate(tmp_path / "impostor")
    async with health_server(pinned) as real, health_server(impostor) as fake:
        targets = iter([real])

        async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            host, port = next(targets, fake).rsplit(":", 1)
            upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

        proxy = await asyncio.start_server(forward, "127.0.0.1", 0)
        try:
            address = f"127.0.0.1:{proxy.sockets[0].getsockname()[1]}"
            channel = await pinned_channel(address, pinned.fingerprint)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _check(channel)
        finally:
            proxy.close()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert next(targets, None) is None  # the fetch went to the pinned server


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()
