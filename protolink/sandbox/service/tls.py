"""The service's TLS certificate: made at first use (:func:`ensure_certificate`) and kept, its
fingerprint printed by ``up``; clients pin it (:func:`protolink.sandbox.tls.pinned_channel`).
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from protolink.errors import SandboxError

from ..hostdirs import owner_only_dir
from ..tls import fingerprint_of, new_certificate

if TYPE_CHECKING:
    import grpc

CERTIFICATE_FILE = "service-cert.pem"
KEY_FILE = "service-key.pem"


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
    certificate_pem, key_pem = new_certificate(f"protolink sandbox service on {socket.gethostname()}")
    _write_new(key_path, key_pem)
    _write_new(certificate_path, certificate_pem)


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
