"""SHA-256 digests as they are shown (audit heads, certificate fingerprints), and what a client
that pins a TLS server's certificate needs: the TLS context it connects with and the check of
the certificate the server presented against the pinned fingerprint.

Standard library only: ``exec``, which is timed, checks a TCP appliance's certificate with it.
"""

from __future__ import annotations

import hashlib
import hmac
import ssl

from protolink.errors import CertificateMismatchError

#: The name a pinning client asks for: always in the subject alternative names of the
#: certificates :func:`protolink.sandbox.tls.new_certificate` makes.
SERVER_NAME = "localhost"


def sha256_digest(text: str) -> str:
    """The 64 lowercase hex digits of a SHA-256 written as ``sha256:HEX`` or ``HEX`` (any case,
    colons between bytes allowed), as heads and fingerprints are shown; ValueError otherwise."""
    digits = text.strip().lower().removeprefix("sha256:").replace(":", "")
    if len(digits) != 64 or not all(c in "0123456789abcdef" for c in digits):
        raise ValueError(f"a SHA-256 is sha256: and 64 hex digits, not {text!r}")
    return digits


def der_fingerprint(certificate_der: bytes) -> str:
    """``sha256:`` and the lowercase hex SHA-256 of a certificate's DER form."""
    return "sha256:" + hashlib.sha256(certificate_der).hexdigest()


def check_pinned(certificate_der: bytes, fingerprint: str, address: str) -> None:
    """Compare (in constant time) the certificate the server at ``address`` presented with the
    pinned ``fingerprint``: CertificateMismatchError when it is another."""
    presented, expected = der_fingerprint(certificate_der), "sha256:" + sha256_digest(fingerprint)
    if not hmac.compare_digest(presented.encode(), expected.encode()):
        raise CertificateMismatchError(f"the server at {address} presents the certificate {presented}, not the "
                                       f"pinned {expected}: another server answers there, or its certificate "
                                       f"was replaced (ask its operator for the fingerprint `up` prints)")


def pinning_context() -> ssl.SSLContext:
    """A client's TLS context (HTTP/2 by ALPN) that verifies no chain and no name: the caller
    checks the presented certificate with :func:`check_pinned`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    return context
