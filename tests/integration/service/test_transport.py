"""TCP only with TLS: a service refuses to listen in clear, and a plaintext client gets nowhere."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import subprocess
from pathlib import Path

import grpc
import pytest

from protolink.errors import CertificateMismatchError, SandboxUnavailableError
from protolink.sandbox.client import channel_options
from protolink.sandbox.service.client import ServiceClient, connect
from protolink.sandbox.service.tls import KEY_FILE

pytestmark = pytest.mark.docker

#: How often a backend's channel pings (protolink.sandbox.client.channel_options).
KEEPALIVE_SECONDS = dict(channel_options())["grpc.keepalive_time_ms"] / 1000


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1 and its key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "protolink-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_half_a_tls_configuration_is_refused_at_start(make_service, tmp_path):
    cert, _ = self_signed(tmp_path)
    service = make_service("--tcp", "127.0.0.1:0", "--tls-cert", str(cert), start=False)
    ended = subprocess.run(service.command(), capture_output=True, text=True, timeout=120,
                           env={"PROTOLINK_RUNTIME_DIR": str(service.runtime), "PATH": "/usr/bin:/bin"})
    assert ended.returncode == 2
    assert "--tls-cert and --tls-key go together" in ended.stderr
    assert not service.files.socket.exists()


async def test_a_tcp_service_has_a_certificate_of_its_own_that_clients_pin(make_service):
    service = make_service("--tcp", "127.0.0.1:0")
    address = next(where for where in service.record["addresses"] if not where.startswith("unix://"))
    fingerprint = service.record["fingerprint"]
    assert fingerprint.startswith("sha256:") and (service.files.tls / KEY_FILE).stat().st_mode & 0o777 == 0o600
    token = service.token("remote")
    pinned = await connect(address, token, fingerprint=fingerprint, timeout=30.0)
    try:
        assert await pinned.list() == []
    finally:
        await pinned.aclose()
    wrong = "sha256:" + "0" * 64
    with pytest.raises(CertificateMismatchError):
        await connect(address, token, fingerprint=wrong, timeout=30.0)
    plain = ServiceClient(grpc.aio.insecure_channel(address), token)
    try:
        with pytest.raises(SandboxUnavailableError):
            await plain.list()
    finally:
        await plain.aclose()
    service.stop()
    service.start()  # restarted, it keeps its certificate: the pinned fingerprint still holds
    assert service.record["fingerprint"] == fingerprint


async def test_tls_clients_are_served_and_plaintext_ones_refused(make_service, tmp_path):
    cert, key = self_signed(tmp_path)
    service = make_service("--tcp", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key))
    address = next(where for where in service.record["addresses"] if not where.startswith("unix://"))
    token = service.token("remote")
    secure = await connect(address, token, credentials=grpc.ssl_channel_credentials(cert.read_bytes()),
                           timeout=30.0)
    try:
        assert await secure.list() == []
    finally:
        await secure.aclose()
    with pytest.raises(ValueError, match="TCP"):
        await connect(address, token)  # the client will not send a token in clear
    plain = ServiceClient(grpc.aio.insecure_channel(address), token)
    try:
        with pytest.raises(SandboxUnavailableError):
            await plain.list()
    finally:
        await plain.aclose()


async def test_the_service_keeps_a_connection_that_pings_as_a_backend_does(service):
    """A backend pings every 2 s while calls run (and a slow create is such a call). Were the
    service to take that as abuse, it would close the connection (GOAWAY "too many pings") and
    fail the calls on it; here the client pings even between calls, for long enough to strike out."""
    options = [*channel_options(), ("grpc.keepalive_permit_without_calls", 1)]
    client = ServiceClient(grpc.aio.insecure_channel(service.files.address, options=options), service.token("pinger"))
    try:
        assert await client.list() == []
        await asyncio.sleep(4 * KEEPALIVE_SECONDS)  # time for four pings: two past gRPC's default tolerance
        assert client.channel.get_state() == grpc.ChannelConnectivity.READY
        assert await client.list() == []
    finally:
        await client.aclose()
