"""Transport security for the service's TCP listener: a self-signed certificate that clients pin.

The service makes its certificate at first use (:func:`ensure_certificate`) and keeps it; ``up``
prints its fingerprint, and a client connects with :func:`pinned_channel`, which refuses any
other certificate. There is no certificate authority: trust is the fingerprint, carried from the
operator to the client out of band.
"""

from __future__ import annotations

import asyncio
import datetime
import fcntl
import hashlib
import hmac
import ipaddress
import os
import socket
import ssl
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from protolink.errors import CertificateMismatchError, SandboxError, SandboxNotReachedError

from ..hostdirs import owner_only_dir
from .audit import sha256_digest

if TYPE_CHECKING:
    import grpc
    import grpc.aio

CERTIFICATE_FILE = "service-cert.pem"
KEY_FILE = "service-key.pem"
#: The name the client checks the certificate against: always in its subject alternative names.
SERVER_NAME = "localhost"
VALIDITY = datetime.timedelta(days=3650)


@dataclass(frozen=True)
class ServiceCertificate:
    """The service's certificate (PEM), its private key (PEM; never shown by ``repr``), the
    files they live in, and the fingerprint clients pin (``sha256:`` and the hex SHA-256 of
    the certificate's DER)."""

    certificate_pem: bytes
    key_pem: bytes = field(repr=False)
    certificate_path: Path
    key_path: Path
    fingerprint: str


def fingerprint_of(certificate_pem: bytes) -> str:
    """``sha256:`` and the lowercase hex SHA-256 of the DER form of ``certificate_pem``."""
    return "sha256:" + hashlib.sha256(ssl.PEM_cert_to_DER_cert(certificate_pem.decode("ascii"))).hexdigest()


def ensure_certificate(directory: Path | str) -> ServiceCertificate:
    """The certificate in ``directory`` (made private when missing), generated at first use.

    A new one is an ECDSA P-256 key (file 0600) and a self-signed certificate for
    ``localhost``, 127.0.0.1, ::1 and this host's name, valid for ten years. SandboxError
    when the files there are not this user's, the key is open to others, or the two do not
    belong together (remove both to make a new pair: clients then need the new fingerprint).
    """
    directory = owner_only_dir(Path(directory), "the service's state directory", "the service's certificate directory")
    certificate_path, key_path = directory / CERTIFICATE_FILE, directory / KEY_FILE
    lock = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two services starting at once make one pair
        if not certificate_path.exists():  # the certificate is written last: without it, start over
            _generate(certificate_path, key_path)
        certificate_pem, key_pem = _read_private(certificate_path), _read_private(key_path)
    finally:
        os.close(lock)
    _check_pair(certificate_pem, key_pem, certificate_path, key_path)
    return ServiceCertificate(certificate_pem, key_pem, certificate_path, key_path, fingerprint_of(certificate_pem))


def _generate(certificate_path: Path, key_path: Path) -> None:
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
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"protolink sandbox service on {host}")])
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
    _write_new(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    _write_new(certificate_path, certificate.public_bytes(serialization.Encoding.PEM))


def _write_new(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (0600) through a temporary file, so it is whole or absent."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _read_private(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        raise SandboxError(f"cannot read the service's TLS file {path}: {error.strerror or error}") from None
    with os.fdopen(fd, "rb") as source:
        info = os.fstat(source.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise SandboxError(f"{path} must be a regular file of uid {os.getuid()} that only its owner can read "
                               f"(found uid {info.st_uid}, mode {stat.filemode(info.st_mode)})")
        return source.read()


def _check_pair(certificate_pem: bytes, key_pem: bytes, certificate_path: Path, key_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        certificate = x509.load_pem_x509_certificate(certificate_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError as error:
        raise SandboxError(f"the service's TLS files {certificate_path} and {key_path} cannot be read: {error}; "
                           f"remove both to make a new pair") from None
    public = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if certificate.public_key().public_bytes(*public) != key.public_key().public_bytes(*public):
        raise SandboxError(f"the key {key_path} does not belong to the certificate {certificate_path}; "
                           f"remove both to make a new pair")


def server_credentials(certificate: ServiceCertificate) -> grpc.ServerCredentials:
    """Credentials for ``server.add_secure_port``: TLS with ``certificate``, no client certificates."""
    import grpc

    return grpc.ssl_server_credentials([(certificate.key_pem, certificate.certificate_pem)])


async def pinned_channel(address: str, fingerprint: str, *, options: Sequence[tuple[str, Any]] = (),
                         connect_seconds: float = 10.0,
                         call_metadata: Sequence[tuple[str, str]] = ()) -> grpc.aio.Channel:
    """A channel to the service at ``address`` (``HOST:PORT``) that trusts exactly the
    certificate whose fingerprint is ``fingerprint`` (``sha256:HEX``, as ``up`` prints it).

    The server's certificate is fetched first, without verification, and its fingerprint
    compared in constant time: CertificateMismatchError when it differs. The channel then
    trusts that certificate alone (its root is the certificate, which may sign nothing else),
    so a server that presents another one at the handshake fails the first call. ``options``
    go to the channel, and ``call_metadata`` to every call on it (the service's token and the
    task a node's gateway forwards to); SandboxNotReachedError when nothing answers with TLS at
    ``address`` within ``connect_seconds``.
    """
    import grpc

    expected = "sha256:" + sha256_digest(fingerprint)
    certificate_pem = await _fetch_certificate(address, connect_seconds)
    presented = fingerprint_of(certificate_pem)
    if not hmac.compare_digest(presented.encode(), expected.encode()):
        raise CertificateMismatchError(f"the service at {address} presents the certificate {presented}, not the "
                                       f"pinned {expected}: another server answers there, or its certificate "
                                       f"was replaced (ask its operator for the fingerprint `up` prints)")
    credentials = grpc.ssl_channel_credentials(root_certificates=certificate_pem)
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
    """The certificate (PEM) the TLS server at ``address`` presents, unverified."""
    host, _, port = address.rpartition(":")
    if not (host and port.isascii() and port.isdigit()):
        raise ValueError(f"a service address is HOST:PORT, not {address!r}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # only read: the fingerprint is the check
    context.set_alpn_protocols(["h2"])
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port), ssl=context, server_hostname=SERVER_NAME), timeout)
    except ssl.SSLError as error:
        raise SandboxNotReachedError(f"the service at {address} does not speak TLS (a plaintext listener, or "
                                     f"another protocol): {error.reason or error}") from None
    except (OSError, asyncio.TimeoutError) as error:
        raise SandboxNotReachedError(f"no service answers at {address}: {error or 'timed out'}") from None
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.transport.abort()  # no TLS close: the server waits for HTTP/2 and would not answer it
    if not der:
        raise SandboxNotReachedError(f"the service at {address} presented no certificate")
    return ssl.DER_cert_to_PEM_cert(der).encode("ascii")
