"""The service process: ``python -m protolink.sandbox.service`` (``protolink-sandbox serve``).

::

    python -m protolink.sandbox.service [--name NAME] [--config FILE] [--swarm FILE] [--image IMAGE]
                                        [--pool N] [--tcp HOST:PORT [--tls-cert PEM --tls-key PEM]]

It adopts the sandboxes a previous run left, serves until SIGTERM or SIGINT, then removes its
warm pools and leaves the other sandboxes for the next run (``protolink-sandbox down`` removes
them: :func:`.process.remove_everything`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import signal
from collections.abc import Iterable, Sequence
from pathlib import Path

import grpc

from protolink.errors import SandboxError

from ..hostdirs import write_private
from ..leftovers import process_owner
from ..images import DEFAULT_IMAGE
from .config import ServiceConfig
from .audit import AuditLog
from .events import Events, EventSink, Flattened
from .files import DEFAULT_NAME, ServiceFiles
from .manager import Manager
from .process import running
from .server import ServiceServer
from ..tls import fingerprint_of
from .tls import ensure_certificate, server_credentials
from .tokens import Tokens, ensure_default

log = logging.getLogger("protolink.sandbox.service")


async def serve(name: str, config: ServiceConfig, *, tcp: str | None = None,
                tcp_credentials: grpc.ServerCredentials | None = None, fingerprint: str | None = None,
                sinks: Iterable[EventSink] = (), stop: asyncio.Event | None = None) -> None:
    """Run service ``name`` until ``stop`` is set (or SIGTERM, SIGINT); every event goes to its
    audit log (:attr:`ServiceFiles.audit`) and to ``sinks``. ``fingerprint`` is the TCP
    listener's certificate's, recorded for ``up`` and ``service`` to show."""
    if (other := running(name)) is not None:
        raise ValueError(f"service {name} runs already (pid {other['pid']}): stop it first")
    files = ServiceFiles.of(name)
    tokens = Tokens(files.tokens)
    ensure_default(tokens, files.default_token)
    audit = AuditLog(files.audit)
    events = Events([Flattened(audit), *sinks], loop=asyncio.get_running_loop())
    manager = Manager(name, config, files, events)
    server = ServiceServer(manager, tokens, events, unix_path=str(files.socket), tcp=tcp,
                           tcp_credentials=tcp_credentials)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if config.swarm is not None:  # before any Swarm service exists: `down` finds them through it
        write_private(files.swarm, json.dumps({"manager": config.swarm.manager}))
    try:
        await manager.start()
        await server.start()
        write_private(files.pid, json.dumps({"pid": os.getpid(), "owner": process_owner(),
                                             "addresses": list(server.addresses), "fingerprint": fingerprint}))
        log.warning("service %s serving at %s", name, ", ".join(server.addresses))
        await stop.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await server.stop()
        await manager.close()
        events.flush()
        audit.close()
        files.socket.unlink(missing_ok=True)


def tls_credentials(cert: Path, key: Path) -> grpc.ServerCredentials:
    """Server credentials from a PEM certificate chain and its private key."""
    return grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])


def _tls(args: argparse.Namespace) -> tuple[grpc.ServerCredentials | None, str | None]:
    """The TCP listener's credentials and certificate fingerprint: the files given, or the
    service's own certificate (made at its first TCP start); none without ``--tcp``."""
    if args.tls_cert and args.tls_key:
        return tls_credentials(args.tls_cert, args.tls_key), fingerprint_of(args.tls_cert.read_bytes())
    if args.tls_cert or args.tls_key:
        raise ValueError("--tls-cert and --tls-key go together")
    if args.tcp is None:
        return None, None
    certificate = ensure_certificate(ServiceFiles.of(args.name).tls)
    return server_credentials(certificate), certificate.fingerprint


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="protolink-sandbox serve", description="The sandbox service, in the foreground.")
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default=DEFAULT_NAME)
    parser.add_argument("--config", type=Path, default=None, help="the service's TOML file: templates, allowed roots")
    parser.add_argument("--swarm", type=Path, default=None, metavar="FILE",
                        help="a TOML file whose [swarm] table (manager, gateway_token_file, nodes) places every "
                             "sandbox on that Swarm cluster; it replaces --config's: docs/swarm.md")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="a template's image unless it names one")
    parser.add_argument("--pool", type=int, default=None, help="warm sandboxes of the default template")
    parser.add_argument("--tcp", default=None, metavar="HOST:PORT",
                        help="also listen on TCP, with TLS: a certificate of its own (made at the first start; "
                             "clients pin its fingerprint), or --tls-cert and --tls-key")
    parser.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate chain of the TCP listener")
    parser.add_argument("--tls-key", type=Path, default=None, help="PEM private key of the TCP listener")


def run(args: argparse.Namespace) -> int:
    """Serve as ``args`` say; 2 for a configuration that cannot be used."""
    logging.basicConfig(format="%(asctime)s protolink-sandbox service: %(message)s", level=logging.WARNING)
    _most_descriptors()
    try:
        config = ServiceConfig.load(args.config, image=args.image, pool=args.pool, swarm=args.swarm)
        credentials, fingerprint = _tls(args)
        asyncio.run(serve(args.name, config, tcp=args.tcp, tcp_credentials=credentials, fingerprint=fingerprint))
    except (ValueError, OSError, SandboxError) as error:  # SandboxError: an audit log that cannot be continued
        log.error("%s", error)
        return 2
    return 0


def _most_descriptors() -> None:
    """Raise this process's limit of open descriptors to its hard limit: each sandbox and each
    local client's call holds a few (sockets, and the pipes a command's output is passed on in),
    and a desktop's soft limit of 1024 would refuse a busy service's calls before its quotas do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: Sequence[str] | None = None) -> int:
    return run(parser().parse_args(argv))
