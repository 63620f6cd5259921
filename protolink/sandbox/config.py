"""The sandbox configuration: what a sandbox is, whatever places it.

::

    SandboxConfig
    ├── roots     tuple[Root, ...]   resolved host directories, read-only unless writable
    ├── image     str                an image reference; the built images by their short names too ("sandbox", "ci")
    ├── limits    Limits             memory (swap included), pids, cpus, /tmp, /dev/shm, disk budget, nofile
    ├── identity  Identity           the uid/gid commands run as (never 0)
    ├── runtime   str | None         the engine's runtime, e.g. "runsc" (gVisor); None: its default
    ├── network   NetworkPolicy      NoNetwork (Unix socket) | PublishedPort (TCP with a token)
    ├── egress    EgressPolicy|None  what commands may reach through the host's proxy (None: nothing,
    │                                and no proxy at all); only with NoNetwork
    ├── ca_file   str | None         a host CA bundle (PEM) every command trusts (a copy of it), or None
    ├── lease     Lease              owner, session, expiry: the labels the reaper reads
    └── name      str                the sandbox's name (its boundary, its container)

Every part is frozen and checked when it is made: a value no sandbox may have raises a
``ValueError`` that names the field. Roots are checked against this host's file system (they
must be resolved, existing directories, never a system path or one holding the Docker socket),
and so is the CA file (:func:`~protolink.sandbox.ca_file.read_ca_file`: a
:class:`~protolink.errors.CaFileError`);
:func:`resolve_roots` makes such roots from what a user gives. Nothing here asks an engine:
placements (:mod:`protolink.sandbox.placements`) translate a configuration into what one
orchestrator runs, and :class:`~protolink.sandbox.docker.DockerSandbox` runs it.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeAlias

from protolink.wire.roots import Root

from .ca_file import read_ca_file
from .egress.policy import EgressPolicy
from .leftovers import process_owner
from .images import DEFAULT_IMAGE, image_reference
from .records import NAME

MiB = 1 << 20
GiB = 1 << 30
#: The uid and gid commands run as unless told otherwise (nobody).
NOBODY = 65534
#: The largest uid or gid Linux gives a process ((uid_t) -1 means "unchanged").
MAX_ID = 2**32 - 2
#: Paths of the image a root may not hide: the server and the system it runs on.
RESERVED_PATHS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/opt/protolink", "/proc", "/run",
                  "/sbin", "/sys", "/usr", "/var/lib", "/var/run")
DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")


def _require(ok: bool, field_name: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"sandbox config: {field_name} {rule}, got {value!r}")


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return (_whole(value) or isinstance(value, float)) and math.isfinite(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Limits:
    """What the whole sandbox may use: ``memory`` in bytes, swap included (there is no swap
    beyond it); ``pids`` tasks; ``cpus`` (a whole number: that many CPUs of their own; a
    fraction: a CPU quota); ``tmpfs_bytes`` of /tmp and ``shm_bytes`` of /dev/shm;
    ``disk_bytes`` of growth of the writable roots, which is also the largest file a command
    may write; ``nofile`` open descriptors per process."""

    memory: int = 1 * GiB
    pids: int = 512
    cpus: float = 1.0
    tmpfs_bytes: int = 256 * MiB
    shm_bytes: int = 64 * MiB
    disk_bytes: int = 1 * GiB
    nofile: int = 8192

    def __post_init__(self) -> None:
        _require(_whole(self.memory) and self.memory >= 64 * MiB, "limits.memory",
                 "must be a whole number of bytes, at least 64 MiB", self.memory)
        _require(_whole(self.pids) and self.pids >= 16, "limits.pids", "must be a whole number, at least 16", self.pids)
        _require(_number(self.cpus) and self.cpus > 0, "limits.cpus", "must be a number above 0", self.cpus)
        for name in ("tmpfs_bytes", "shm_bytes"):
            value = getattr(self, name)
            _require(_whole(value) and value > 0, f"limits.{name}", "must be a whole number of bytes above 0", value)
        _require(_whole(self.disk_bytes) and self.disk_bytes >= 0, "limits.disk_bytes",
                 "must be a whole number of bytes, 0 or more", self.disk_bytes)
        _require(_whole(self.nofile) and self.nofile >= 1024, "limits.nofile", "must be a whole number, at least 1024",
                 self.nofile)


@dataclass(frozen=True)
class Identity:
    """The uid and gid sandbox commands run as (no other groups); never 0.

    Not the host user's uid even when it is not root: the socket directory belongs to the host
    user, and commands must not be able to open or replace the socket.
    """

    uid: int
    gid: int

    def __post_init__(self) -> None:
        for name in ("uid", "gid"):
            value = getattr(self, name)
            _require(value != 0, f"identity.{name}", "must not be 0: sandbox commands never run as uid or gid 0", value)
            _require(_whole(value) and 0 < value <= MAX_ID, f"identity.{name}",
                     f"must be a whole number from 1 to {MAX_ID}", value)

    @classmethod
    def of(cls, uid: int | None = None, gid: int | None = None) -> Identity:
        """``uid`` (65534, nobody, unless given) and ``gid`` (the uid's number unless given)."""
        uid = NOBODY if uid is None else uid
        return cls(uid, uid if gid is None else gid)


@dataclass(frozen=True)
class NoNetwork:
    """No network interface: commands reach nothing, and the host reaches the server over a Unix
    socket in a host directory only the host user can open."""


@dataclass(frozen=True)
class PublishedPort:
    """TCP mode, for remote engines: the server listens on a port the engine publishes on its host
    at ``host``:``port`` (port 0: one the engine picks) and requires a fresh token. The sandbox
    then has a network interface."""

    host: str = "127.0.0.1"
    port: int = 0

    def __post_init__(self) -> None:
        _require(isinstance(self.host, str) and self.host != "" and not any(c.isspace() for c in self.host),
                 "network.host", "must be an address without spaces", self.host)
        _require(_whole(self.port) and 0 <= self.port <= 65535, "network.port", "must be a port from 0 to 65535",
                 self.port)

    @classmethod
    def parse(cls, text: str) -> PublishedPort:
        """``HOST:PORT``; without a host, 127.0.0.1; without a port, 0."""
        host, _, port = text.rpartition(":")
        _require(port == "" or (port.isascii() and port.isdigit()), "tcp", "must be HOST:PORT", text)
        return cls(host or cls.host, int(port or 0))


#: How the host reaches the sandbox's server. What commands may reach is ``SandboxConfig.egress``.
NetworkPolicy: TypeAlias = NoNetwork | PublishedPort


@dataclass(frozen=True)
class Lease:
    """Who a sandbox belongs to and how long it may live: what the reaper reads from its labels.

    ``owner`` defaults to this process (the sandbox is reaped once the process is gone);
    ``session`` is fresh for every sandbox; the reaper removes the sandbox ``expiry_seconds``
    after it is created (None: never, for an appliance, whose owner is not a process).
    """

    owner: str = field(default_factory=process_owner)
    session: str = field(default_factory=lambda: secrets.token_hex(8))
    expiry_seconds: float | None = 24 * 3600

    def __post_init__(self) -> None:
        for name in ("owner", "session"):
            value = getattr(self, name)
            _require(isinstance(value, str) and value != "" and value.isprintable(), f"lease.{name}",
                     "must be printable text", value)
        _require(self.expiry_seconds is None or (_number(self.expiry_seconds) and self.expiry_seconds > 0),
                 "lease.expiry_seconds", "must be a number of seconds above 0, or None for no expiry",
                 self.expiry_seconds)


@dataclass(frozen=True)
class SandboxConfig:
    """One sandbox, as every placement runs it; see the module's docstring for its parts.

    ``name`` defaults to ``protolink-sandbox-<session>``. :meth:`from_options` builds one from
    the flat keywords :class:`~protolink.sandbox.docker.DockerSandbox` takes.
    """

    roots: tuple[Root, ...] = ()
    image: str = DEFAULT_IMAGE
    limits: Limits = field(default_factory=Limits)
    identity: Identity = field(default_factory=Identity.of)
    runtime: str | None = None
    network: NetworkPolicy = field(default_factory=NoNetwork)
    lease: Lease = field(default_factory=Lease)
    name: str = ""
    egress: EgressPolicy | None = None
    ca_file: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", f"protolink-sandbox-{self.lease.session}")
        _require(isinstance(self.name, str) and NAME.fullmatch(self.name) is not None, "name",
                 "must be letters, digits, '_', '.' and '-', a letter or digit first", self.name)
        _require(isinstance(self.image, str) and self.image.strip() == self.image != "", "image",
                 "must be an image reference", self.image)
        object.__setattr__(self, "image", image_reference(self.image))
        _require(self.runtime is None or (isinstance(self.runtime, str) and self.runtime.strip() == self.runtime != ""),
                 "runtime", "must be a runtime's name, or None for the engine's default", self.runtime)
        for name, kind in (("limits", Limits), ("identity", Identity), ("network", NetworkPolicy), ("lease", Lease)):
            _require(isinstance(getattr(self, name), kind), name, f"must be a {_named(kind)}", getattr(self, name))
        _require(self.egress is None or isinstance(self.egress, EgressPolicy), "egress",
                 "must be an EgressPolicy, or None for no egress", self.egress)
        _require(self.egress is None or isinstance(self.network, NoNetwork), "egress",
                 "must go with the Unix socket (NoNetwork): a PublishedPort sandbox has a network interface of its own",
                 self.network)
        _require(self.ca_file is None or (isinstance(self.ca_file, str) and os.path.isabs(self.ca_file)), "ca_file",
                 "must be an absolute path, or None for the image's certificate authorities alone", self.ca_file)
        if self.ca_file is not None:
            read_ca_file(self.ca_file)
        _require(isinstance(self.roots, tuple), "roots", "must be a tuple of Root", self.roots)
        seen: set[str] = set()
        for root in self.roots:
            _require(isinstance(root, Root), "roots", "must hold Root values", root)
            _check_root(root.path)
            _require(root.path not in seen, "roots", "must name each directory once", root.path)
            seen.add(root.path)

    @property
    def writable_roots(self) -> tuple[str, ...]:
        """The paths of the roots mounted read-write."""
        return tuple(root.path for root in self.roots if root.writable)

    @classmethod
    def from_options(
        cls,
        roots: Iterable[str | os.PathLike[str] | Root] = (),
        *,
        writable: Iterable[str | os.PathLike[str]] = (),
        image: str = DEFAULT_IMAGE,
        memory: int = Limits.memory,
        pids: int = Limits.pids,
        cpus: float = Limits.cpus,
        tmpfs_bytes: int = Limits.tmpfs_bytes,
        disk_bytes: int = Limits.disk_bytes,
        runtime: str | None = None,
        command_uid: int | None = None,
        command_gid: int | None = None,
        expiry_seconds: float | None = Lease.expiry_seconds,
        owner: str | None = None,
        name: str | None = None,
        tcp: str | None = None,
        egress: EgressPolicy | Iterable[str] | None = None,
        ca_file: str | os.PathLike[str] | None = None,
    ) -> SandboxConfig:
        """The configuration the flat keywords describe: ``roots`` (paths or :class:`Root`) and
        ``writable`` paths are resolved (:func:`resolve_roots`); ``tcp="HOST:PORT"`` is TCP mode
        (:class:`PublishedPort`), none a Unix socket; ``egress`` is a policy or its rule texts
        (:meth:`EgressPolicy.parse <protolink.sandbox.egress.policy.EgressPolicy.parse>`; an
        empty list allows nothing, yet starts the proxy, so that a live sandbox can be opened
        later); ``ca_file`` is made absolute; ``owner`` defaults to this process and ``name`` to
        ``protolink-sandbox-<session>``."""
        return cls(
            roots=resolve_roots(roots, writable),
            image=image,
            limits=Limits(memory=memory, pids=pids, cpus=cpus, tmpfs_bytes=tmpfs_bytes, disk_bytes=disk_bytes),
            identity=Identity.of(command_uid, command_gid),
            runtime=runtime,
            network=PublishedPort.parse(tcp) if tcp else NoNetwork(),
            lease=Lease(owner=owner, expiry_seconds=expiry_seconds) if owner else Lease(expiry_seconds=expiry_seconds),
            name=name or "",
            egress=egress if egress is None or isinstance(egress, EgressPolicy) else EgressPolicy.parse(egress),
            ca_file=None if ca_file is None else os.path.abspath(ca_file),
        )


def resolve_roots(roots: Iterable[str | os.PathLike[str] | Root],
                  writable: Iterable[str | os.PathLike[str]] = ()) -> tuple[Root, ...]:
    """Roots as a configuration holds them: ``roots`` (read-only unless a :class:`Root` says
    otherwise) and ``writable`` paths, each resolved through symlinks; a directory named twice is
    one root, writable if either says so. Relative paths are refused. Reads the file system."""
    declared = [r if isinstance(r, Root) else Root(os.fspath(r)) for r in roots]
    declared += [Root(os.fspath(path), writable=True) for path in writable]
    resolved: dict[str, bool] = {}
    for root in declared:
        if not os.path.isabs(root.path):
            raise ValueError(f"sandbox root must be an absolute path: {root.path!r}")
        path = os.path.realpath(root.path)
        resolved[path] = resolved.get(path, False) or root.writable
    return tuple(Root(path, writable) for path, writable in resolved.items())


def _named(kind: object) -> str:
    return " or ".join(part.__name__ for part in getattr(kind, "__args__", (kind,)))


def _check_root(path: str) -> None:
    """Refuse a root that is not a resolved, existing directory, or would hide or expose the system."""
    if not os.path.isabs(path):
        raise ValueError(f"sandbox root must be an absolute path: {path!r}")
    if os.path.realpath(path) != path:
        raise ValueError(f"sandbox root {path!r} is not resolved (it leads to {os.path.realpath(path)!r}): "
                         "make roots with resolve_roots")
    if not os.path.isdir(path):
        raise ValueError(f"sandbox root is not a directory: {path!r}")
    if path in ("/", "/tmp"):
        raise ValueError(f"sandbox root {path!r} is too broad: mount a directory beneath it")
    for reserved in RESERVED_PATHS:
        if path == reserved or path.startswith(reserved + "/") or reserved.startswith(path + "/"):
            raise ValueError(f"sandbox root {path!r} would hide or expose the system's {reserved}")
    for sock in (*DOCKER_SOCKETS, _docker_socket()):
        if sock and os.path.realpath(sock).startswith(path + "/"):
            raise ValueError(f"sandbox root {path!r} contains the Docker socket")


def _docker_socket() -> str | None:
    """The Unix socket ``DOCKER_HOST`` names, if any: the engine's URL (docker-py's syntax, whose
    bare ``unix://`` is the default socket), not a sandbox's address (:mod:`.addresses`)."""
    host = os.environ.get("DOCKER_HOST", "")
    return host.removeprefix("unix://") if host.startswith("unix://") else None
