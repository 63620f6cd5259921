"""The variables that make common tools trust a certificate authority file, as both sides use them.

A sandbox given a CA file (``SandboxConfig.ca_file``) has its server add them to every command's
environment; the CI runner sets them for a job's setup phase only (``CiJob.ca_file``).
"""

from __future__ import annotations

#: ``SSL_CERT_FILE`` (OpenSSL: Python, curl), ``PIP_CERT``, ``REQUESTS_CA_BUNDLE``,
#: ``CURL_CA_BUNDLE``, ``NODE_EXTRA_CA_CERTS`` (Node and npm) and ``GIT_SSL_CAINFO``. All but
#: Node's replace the tool's own list of authorities: the file must be a whole bundle. npm trusts
#: it through Node's ``NODE_EXTRA_CA_CERTS``, read once when Node starts, and not through its own
#: ``cafile``: npm passes that bundle with each connection, which makes Node parse it again for
#: every TLS handshake (4-5 s of CPU over domhandler's 128 requests).
CA_VARIABLES = ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
                "GIT_SSL_CAINFO")


def ca_environment(path: str) -> dict[str, str]:
    """Every one of :data:`CA_VARIABLES` naming the CA file at ``path``."""
    return dict.fromkeys(CA_VARIABLES, path)
