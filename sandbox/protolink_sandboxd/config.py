"""The server's command line: ``python3 -m protolink_sandboxd --listen ADDRESS --root PATH:rw|ro ...``."""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass

from protolink.wire.egress import SOCKET_NAME
from protolink.wire.protections import HELD_ELSEWHERE
from protolink.wire.roots import Root

from .spawner import PROGRAM

MiB = 1024 * 1024
NOBODY = 65534
#: The width ``--help`` is formatted to. argparse asks ``shutil.get_terminal_size`` when given none,
#: for every argument added: importing ``shutil`` (and ``bz2``, ``lzma``) would delay every start.
HELP_WIDTH = 100
#: The most read of a token, certificate or key file.
MAX_SECRET_FILE_BYTES = 64 * 1024


@dataclass(frozen=True)
class ServerConfig:
    """Everything the server needs to know; see :func:`parse_args` for the flags."""

    listen: str
    roots: tuple[Root, ...]
    boundary: str
    command_uid: int = NOBODY
    command_gid: int = NOBODY
    token: str | None = None
    #: The TLS certificate and key (PEM) a tcp:// listener serves with; None for a Unix socket.
    tls_certificate: bytes | None = None
    tls_key: bytes | None = None
    max_concurrency: int = 256
    max_message_bytes: int = 32 * MiB
    #: The output a command may keep. The server keeps none of it (it streams it, holding a
    #: few MiB of each command at most): this bounds what one command makes the client hold.
    max_output_bytes: int = 1024 * MiB
    max_workers: int = 8
    worker_memory_bytes: int = 1024 * MiB
    #: Address-space limit of every command (RLIMIT_AS); 0: none (the container's memory limit alone).
    command_memory_bytes: int = 0
    max_document_seconds: float = 300.0
    operation_seconds: float = 300.0
    #: The compiled spawner (sandbox/spawner.c) that starts commands.
    spawner_program: str = PROGRAM
    #: The loopback port of the egress relay (:mod:`protolink_sandboxd.egress_relay`); 0: no egress.
    egress_port: int = 0
    #: The CA file every command trusts (its path in the container, named in
    #: :data:`~protolink.wire.trust.CA_VARIABLES`); None: the image's authorities alone.
    ca_file: str | None = None
    #: Serve even when a protection is missing, logging it (:mod:`protolink_sandboxd.protections`).
    serve_unprotected: bool = False
    #: Protections the placement holds where the server cannot see them, which it does not
    #: look for (names of :data:`~protolink.wire.protections.HELD_ELSEWHERE`).
    held_elsewhere: frozenset[str] = frozenset()

    @property
    def tcp(self) -> bool:
        return self.listen.startswith("tcp://")

    @property
    def address(self) -> str:
        """The address in gRPC's own syntax."""
        return self.listen.removeprefix("tcp://")

    @property
    def socket_path(self) -> str:
        """The path of the server's Unix socket (meaningless for a TCP server)."""
        return self.listen.removeprefix("unix://")

    @property
    def egress_socket(self) -> str:
        """Where the host dials in for egress: ``egress.sock`` beside the server's Unix socket."""
        return os.path.join(os.path.dirname(self.socket_path), SOCKET_NAME)


def parse_args(argv: list[str] | None = None) -> ServerConfig:
    """Parse and check the command line; reads, then deletes, the token file."""
    parser = argparse.ArgumentParser(prog="python3 -m protolink_sandboxd", description="The ProtoLink sandbox server.",
                                     formatter_class=_FixedWidthHelp)
    parser.add_argument("--listen", required=True, help="unix:///abs/path.sock or tcp://HOST:PORT")
    parser.add_argument("--root", action="append", default=[], type=_root, metavar="PATH:rw|ro",
                        help="a mounted root; repeat for several")
    parser.add_argument("--boundary", default=socket.gethostname(), help="names the sandbox: sandbox:NAME")
    parser.add_argument("--command-uid", type=int, default=NOBODY)
    parser.add_argument("--command-gid", type=int, default=NOBODY)
    parser.add_argument("--token-file", help="required with tcp://; read at startup, then deleted")
    parser.add_argument("--tls-cert-file", help="required with tcp://: the certificate (PEM) it serves TLS with; "
                                                "read at startup, then deleted")
    parser.add_argument("--tls-key-file", help="required with tcp://: the certificate's key (PEM); read at startup, "
                                               "then deleted")
    parser.add_argument("--max-concurrency", type=_positive, default=ServerConfig.max_concurrency)
    parser.add_argument("--max-message-bytes", type=_positive, default=ServerConfig.max_message_bytes)
    parser.add_argument("--max-output-bytes", type=_positive, default=ServerConfig.max_output_bytes)
    parser.add_argument("--max-workers", type=_positive, default=ServerConfig.max_workers)
    parser.add_argument("--worker-memory-bytes", type=_positive, default=ServerConfig.worker_memory_bytes)
    parser.add_argument("--command-memory-bytes", type=int, default=ServerConfig.command_memory_bytes,
                        help="RLIMIT_AS of every command; 0 for none")
    parser.add_argument("--max-document-seconds", type=float, default=ServerConfig.max_document_seconds)
    parser.add_argument("--operation-seconds", type=float, default=ServerConfig.operation_seconds)
    parser.add_argument("--spawner-program", default=ServerConfig.spawner_program,
                        help="the compiled spawner (default: where the image installs it)")
    parser.add_argument("--egress-port", type=_port, default=0, metavar="PORT",
                        help="relay commands' proxy connections from 127.0.0.1:PORT to the host, which dials in "
                             f"at {SOCKET_NAME} beside the Unix socket; commands get the proxy variables")
    parser.add_argument("--ca-file", default=None, metavar="PATH",
                        help="a CA bundle every command trusts: commands get SSL_CERT_FILE, PIP_CERT and the other "
                             "trust variables naming it, unless they set one themselves")
    parser.add_argument("--serve-unprotected", action="store_true",
                        help="serve even when a protection the server checks is missing, logging what is: for a "
                             "server run outside any container (a development host); a sandbox never passes it")
    parser.add_argument("--held-elsewhere", action="append", default=[], choices=HELD_ELSEWHERE, metavar="NAME",
                        help="a protection the placement holds where the server cannot see it, not looked for: "
                             f"one of {', '.join(HELD_ELSEWHERE)}; repeat for several (a Kubernetes Pod: network, "
                             "isolated by a NetworkPolicy, and pids_limit, the kubelet's on the Pod's cgroup)")
    args = parser.parse_args(argv)
    if not args.listen.startswith(("unix:///", "tcp://")):
        parser.error("--listen must be unix:///ABSOLUTE/PATH or tcp://HOST:PORT")
    if args.command_uid == 0 or args.command_gid == 0:
        parser.error("commands never run as uid or gid 0")
    if args.listen.startswith("tcp://") and not (args.token_file and args.tls_cert_file and args.tls_key_file):
        parser.error("tcp:// listening requires --token-file, --tls-cert-file and --tls-key-file")
    if not os.path.isabs(args.spawner_program):
        parser.error("--spawner-program must be an absolute path")
    if args.egress_port and not args.listen.startswith("unix://"):
        parser.error("--egress-port needs a unix:// listening socket (the host dials in beside it)")
    if args.ca_file is not None and not os.path.isabs(args.ca_file):
        parser.error("--ca-file must be an absolute path")
    if args.command_memory_bytes < 0:
        parser.error("--command-memory-bytes must be 0 (none) or a positive number of bytes")
    for name in ("max_document_seconds", "operation_seconds"):
        if not 0 < getattr(args, name) < float("inf"):
            parser.error(f"--{name.replace('_', '-')} must be a positive number of seconds")
    return ServerConfig(
        listen=args.listen,
        roots=tuple(args.root),
        boundary=f"sandbox:{args.boundary}",
        command_uid=args.command_uid,
        command_gid=args.command_gid,
        token=_take_token(args.token_file) if args.token_file else None,
        tls_certificate=_take_file(args.tls_cert_file, "certificate") if args.tls_cert_file else None,
        tls_key=_take_file(args.tls_key_file, "key") if args.tls_key_file else None,
        max_concurrency=args.max_concurrency,
        max_message_bytes=args.max_message_bytes,
        max_output_bytes=args.max_output_bytes,
        max_workers=args.max_workers,
        worker_memory_bytes=args.worker_memory_bytes,
        command_memory_bytes=args.command_memory_bytes,
        max_document_seconds=args.max_document_seconds,
        operation_seconds=args.operation_seconds,
        spawner_program=args.spawner_program,
        egress_port=args.egress_port,
        ca_file=args.ca_file,
        serve_unprotected=args.serve_unprotected,
        held_elsewhere=frozenset(args.held_elsewhere),
    )


class _FixedWidthHelp(argparse.HelpFormatter):
    """argparse's formatter at :data:`HELP_WIDTH` columns, whatever the terminal's."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=HELP_WIDTH)


def _root(text: str) -> Root:
    root = Root.parse(text)
    if not text.endswith((":ro", ":rw")) or not root.path.startswith("/") or os.path.normpath(root.path) != root.path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected /CANONICAL/PATH:rw or /CANONICAL/PATH:ro")
    return root


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} must be a port from 1 to 65535")
    return value


def _take_token(path: str) -> str:
    """The token in the file ``path`` (:func:`_take_file`), at least 16 characters."""
    return _token_text(_take_file(path, "token", _check_token))


def _token_text(data: bytes) -> str:
    return data.decode("utf-8", "replace").strip()


def _check_token(data: bytes) -> None:
    if len(_token_text(data)) < 16:
        raise SystemExit("the token must be at least 16 characters")


def _take_file(path: str, what: str, check: Callable[[bytes], None] | None = None) -> bytes:
    """What the regular file ``path`` holds (at most 64 KiB), which ``check`` accepts (it raises
    SystemExit otherwise); the file is then removed (best effort).

    Anything else (a device such as /dev/null, a symlink, a directory) is refused and left alone.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise SystemExit(f"cannot read the {what} file {path}: {error.strerror}") from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise SystemExit(f"the {what} file {path} is not a regular file")
        data = os.read(fd, MAX_SECRET_FILE_BYTES)
    finally:
        os.close(fd)
    if check is not None:
        check(data)
    with contextlib.suppress(OSError):  # a read-only mount: the file stays, readable by root alone
        current = os.lstat(path)
        if (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino):
            os.unlink(path)
    return data
