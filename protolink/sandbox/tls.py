"""Transport security for TCP listeners (the sandbox service's, a node's gateway's, a sandbox's
in TCP mode): self-signed certificates that clients pin by fingerprint.

A server presents a certificate made for it (:func:`new_certificate`); its fingerprint
(:func:`fingerprint_of`) reaches clients out of band (``up`` prints it), and a client connects
with :func:`pinned_channel`, which refuses any other certificate. There is no certificate
authority: trust is the fingerprint.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from protolink.errors import SandboxNotReachedError

from .digests import SERVER_NAME, check_pinned, der_fingerprint, pinning_context, sha256_digest

if TYPE_CHECKING:
    import grpc
    import grpc.aio

VALIDITY = datetime.timedelta(days=3650)


def fingerprint_of(certificate_pem: bytes) -> str:
    """``sha256:`` and the lowercase hex SHA-256 of the DER form of ``certificate_pem``."""
    return der_fingerprint(ssl.PEM_cert_to_DER_cert(certificate_pem.decode("ascii")))


def new_certificate(subject_name: str) -> tuple[bytes, bytes]:
    """A new ECDSA P-256 key and a self-signed certificate for it (both PEM: certificate, key)
    for ``localhost``, 127.0.0.1, ::1 and this host's name, valid for ten years, that signs
    nothing: clients pin it by :func:`fingerprint_of`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(SERVER_NAME), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                     x509.IPAddress(ipaddress.ip_address("::1"))]
    host = socket.gethostname()
    if host and host != SERVER_NAME:
        names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)  # it signs nothing
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return (certificate.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


async def pinned_channel(address: str, fingerprint: str, *, options: Sequence[tuple[str, Any]] = (),
                         connect_seconds: float = 10.0,
                         call_metadata: Sequence[tuple[str, str]] = ()) -> grpc.aio.Channel:
    """A channel to the server at ``address`` (``HOST:PORT``: the service, a node's gateway, a
    sandbox in TCP mode) that trusts exactly the certificate whose fingerprint is
    ``fingerprint`` (``sha256:HEX``, as ``up`` prints it).

    The server's certificate is fetched first, without verification, and its fingerprint
    compared in constant time: CertificateMismatchError when it differs. The channel then
    trusts that certificate alone (its root is the certificate, which may sign nothing else),
    so a server that presents another one at the handshake fails the first call. ``options``
    go to the channel, and ``call_metadata`` to every call on it (the service's token and the
    task a node's gateway forwards to); SandboxNotReachedError when nothing answers with TLS at
    ``address`` within ``connect_seconds``.
    """
    import grpc

    sha256_digest(fingerprint)  # ValueError before anything is sent
    certificate_der = await _fetch_certificate(address, connect_seconds)
    check_pinned(certificate_der, fingerprint, address)
    credentials = grpc.ssl_channel_credentials(root_certificates=ssl.DER_cert_to_PEM_cert(certificate_der).encode())
    if call_metadata:
        credentials = grpc.composite_channel_credentials(credentials, grpc.metadata_call_credentials(
            _FixedMetadata(tuple(call_metadata)), name="protolink"))
    return grpc.aio.secure_channel(address, credentials,
                                   options=[("grpc.ssl_target_name_override", SERVER_NAME), *options])


class _FixedMetadata:
    """Call credentials that add the same metadata to every call (grpc.AuthMetadataPlugin)."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata

    def __call__(self, context: Any, callback: Any) -> None:
        callback(self.metadata, None)


async def _fetch_certificate(address: str, timeout: float) -> bytes:
    """The certificate (DER) the TLS server at ``address`` presents, unverified."""
    host, _, port = address.rpartition(":")
    if not (host and port.isascii() and port.isdigit()):
        raise ValueError(f"a TCP address is HOST:PORT, not {address!r}")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(
            host.strip("[]"), int(port), ssl=pinning_context(), server_hostname=SERVER_NAME), timeout)
    except ssl.SSLError as error:
        raise SandboxNotReachedError(f"the server at {address} does not speak TLS (a plaintext listener, or "
                                     f"another protocol): {error.reason or error}") from None
    except (OSError, asyncio.TimeoutError) as error:
        raise SandboxNotReachedError(f"nothing answers at {address}: {error or 'timed out'}") from None
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.transport.abort()  # no TLS close: the server waits for HTTP/2 and would not answer it
    if not der:
        raise SandboxNotReachedError(f"the server at {address} presented no certificate")
    return der
