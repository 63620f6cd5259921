"""SHA-256 digests as they are shown (audit heads, certificate fingerprints) and the check of a
certificate a TLS server presents against the fingerprint a client pins.

Standard library only: ``exec``, which is timed, checks a TCP appliance's certificate with it.
"""

from __future__ import annotations

import hashlib
import hmac

from protolink.errors import CertificateMismatchError


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
