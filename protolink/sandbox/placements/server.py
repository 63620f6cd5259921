"""What every placement runs alike: the image's server, its arguments, where it finds the host.

Each placement (:mod:`.docker`, :mod:`.kubernetes`) starts the same server the same way: as uid 0
keeping only :data:`CAPABILITIES`, told by :func:`server_command` its name, its command user, its
roots and where it listens, with the host's private directory mounted at :func:`channel_mount`.
"""

from __future__ import annotations

from pathlib import Path
from typing import assert_never

from ..config import NoNetwork, PublishedPort, SandboxConfig
from ..hostdirs import write_private
from ..tls import fingerprint_of, new_certificate

#: Where the host's private directory is mounted for the server's Unix socket.
SOCKET_DIR = "/run/protolink"
SOCKET_NAME = "sandbox.sock"
SOCKET_PATH = f"{SOCKET_DIR}/{SOCKET_NAME}"
#: Where the host's private directory is mounted in TCP mode: it holds the token and the TLS
#: certificate and key (:data:`SECRET_FILES`), which the server (uid 0 in the container) reads
#: once and deletes; commands cannot open them.
SECRET_DIR = "/run/protolink-secret"
#: The files of :data:`SECRET_DIR`, by the server flag that names each.
SECRET_FILES = {"--token-file": "token", "--tls-cert-file": "tls-cert.pem", "--tls-key-file": "tls-key.pem"}
#: Where a sandbox given a CA file (``SandboxConfig.ca_file``) has the copy of it, read-only:
#: the server names it in every command's trust variables (:data:`~protolink.wire.trust.CA_VARIABLES`).
CA_NAME = "ca-certificates.pem"
CA_PATH = f"/run/protolink-ca/{CA_NAME}"
#: The server's port inside the container in TCP mode.
TCP_PORT = 7000
#: The loopback port of the egress relay inside the container (a sandbox with egress), which
#: the commands' proxy variables name.
EGRESS_PORT = 3128
#: The capabilities the server keeps: to run commands as another uid and to kill them.
CAPABILITIES = ("SETUID", "SETGID", "KILL")
#: Under gVisor a process that exhausts the container's memory gets the Sentry, that is the
#: whole sandbox, killed by the host's OOM killer (this gVisor has none of its own). Each command
#: and document worker is held to this share of the memory limit (RLIMIT_AS), so that one
#: runaway fails alone, as the kernel's OOM killer makes it fail under runc.
GVISOR_PROCESS_MEMORY_SHARE = 0.5


def write_secrets(directory: Path, token: str, subject: str) -> str:
    """Write a TCP-mode server's token and a new certificate and key for it (:data:`SECRET_FILES`)
    into ``directory``, each readable by its owner only; return the fingerprint clients pin."""
    certificate, key = new_certificate(subject)
    given = {"--token-file": token, "--tls-cert-file": certificate.decode(), "--tls-key-file": key.decode()}
    for flag, text in given.items():
        write_private(directory / SECRET_FILES[flag], text)
    return fingerprint_of(certificate)


def server_command(config: SandboxConfig, *, gvisor: bool) -> tuple[str, ...]:
    """The arguments of the image's server: its name, the command user, the roots, under gVisor
    the address-space share of each process (:data:`GVISOR_PROCESS_MEMORY_SHARE`), where it listens,
    with egress the relay's port, with a CA file :data:`CA_PATH`."""
    command = ["--boundary", config.name, "--command-uid", str(config.identity.uid),
               "--command-gid", str(config.identity.gid)]
    for root in config.roots:
        command += ["--root", f"{root.path}:{'rw' if root.writable else 'ro'}"]
    if gvisor:
        share = str(int(config.limits.memory * GVISOR_PROCESS_MEMORY_SHARE))
        command += ["--command-memory-bytes", share, "--worker-memory-bytes", share]
    match config.network:
        case PublishedPort():
            command += ["--listen", f"tcp://0.0.0.0:{TCP_PORT}"]
            for flag, name in SECRET_FILES.items():
                command += [flag, f"{SECRET_DIR}/{name}"]
        case NoNetwork():
            command += ["--listen", f"unix://{SOCKET_PATH}"]
        case _:
            assert_never(config.network)
    if config.egress is not None:
        command += ["--egress-port", str(EGRESS_PORT)]
    if config.ca_file is not None:
        command += ["--ca-file", CA_PATH]
    return tuple(command)


def channel_mount(config: SandboxConfig) -> str:
    """Where the host's private directory is mounted: :data:`SECRET_DIR` in TCP mode (the token
    and the TLS pair), else :data:`SOCKET_DIR` (the socket)."""
    return SECRET_DIR if isinstance(config.network, PublishedPort) else SOCKET_DIR
