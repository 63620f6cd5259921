"""A sandbox as one Docker Engine container: :func:`container_spec`.

A pure function from a :class:`~protolink.sandbox.config.SandboxConfig`, what the engine
reports (:class:`EngineFacts`) and what the host prepared (:class:`HostFacts`) to the keywords
of the docker SDK's ``containers.create`` (:class:`ContainerSpec`). What it makes of them:

- the image's server (``python -m protolink_sandboxd``) as uid 0 with every capability dropped but
  SETUID, SETGID and KILL, ``no-new-privileges``, the seccomp profile, never privileged, an
  empty environment, a private IPC namespace;
- a read-only root file system; /tmp and /dev/shm as ``noexec,nosuid,nodev`` tmpfs bounded in
  bytes and in entries (:data:`TMPFS_BYTES_PER_ENTRY`);
- memory with swap bounded by the same figure, pids, CPUs (:func:`cpu_limit`), open files, no
  core dumps, ``RLIMIT_NICE`` 0 (commands cannot raise their priority), ``RLIMIT_FSIZE`` of
  the disk budget when a root is writable, 1 MiB of logs;
- roots bind-mounted at their own paths, read-only unless writable; the host's private
  directory at :data:`~.server.SOCKET_DIR` (Unix socket) or :data:`~.server.SECRET_DIR` (TCP mode's token);
  with a CA file, the copy the host made of it in that directory at :data:`~.server.CA_PATH`, read-only;
- no network (``network_mode="none"``), or in TCP mode the server's port published on the
  engine's host; with egress, the server's relay on loopback :data:`~.server.EGRESS_PORT` (the host
  dials in through the channel directory; still no network); the labels of
  :func:`~protolink.sandbox.leftovers.labels`;
- under gVisor (the runtime's program is ``runsc``), the tuning of the ``GVISOR_*`` figures.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, assert_never

from docker.types import LogConfig, Mount, Ulimit

from .. import leftovers
from ..config import MiB, NoNetwork, PublishedPort, SandboxConfig
from .server import CA_NAME, CA_PATH, CAPABILITIES, SOCKET_NAME, TCP_PORT, channel_mount, server_command

#: A tmpfs holds at most one entry per this many bytes of its size (and at least
#: :data:`MIN_TMPFS_ENTRIES`). ``size=`` alone does not bound entries: a flood of empty files
#: fills the container's memory with inodes until the OOM killer picks the largest process, the server.
TMPFS_BYTES_PER_ENTRY = 4096
MIN_TMPFS_ENTRIES = 1024
#: Host tasks the container's pids cgroup is given per task of a gVisor sandbox. The cgroup
#: counts the host threads of runsc (on the ptrace platform each task costs about six: a stub
#: and the Sentry's threads that run and trace it), not the sandbox's own tasks; a cgroup sized
#: for those crashes the Sentry, and every call with it. The sandbox's tasks are bounded per
#: user by RLIMIT_NPROC instead, which gVisor enforces inside.
GVISOR_HOST_TASKS_PER_TASK = 8
#: Host memory a gVisor task costs beyond its own pages: RLIMIT_NPROC is kept to what the memory
#: limit can hold, since past it the host's OOM killer ends the Sentry, that is the whole
#: sandbox. (Measured: 192 idle processes fit in 768 MiB; beside the server, 4 MiB a task did not.)
GVISOR_BYTES_PER_TASK = 8 * MiB
#: The log driver and its options: 1 MiB of the server's output, in one file.
LOG_DRIVER = "json-file"
LOG_OPTIONS = {"max-size": "1m", "max-file": "1"}


@dataclass(frozen=True)
class EngineFacts:
    """What the Docker Engine reports about itself, as far as the container depends on it:
    its CPUs (``NCPU``), whether the configuration's runtime runs gVisor's ``runsc``, and
    whether it accepts a cpuset (False once it refused one: "Requested CPUs are not available")."""

    cpus: int
    gvisor: bool = False
    cpuset_allowed: bool = True


@dataclass(frozen=True)
class HostFacts:
    """What the host prepared for one container: its private directory (only the host user can
    open it; it gets the server's socket, or TCP mode's token, and the copy of the CA file,
    :data:`~.server.CA_NAME`), the time it is created (Unix seconds, for its labels), and the
    seccomp profile's JSON."""

    channel_dir: Path
    created: int
    seccomp_profile: str


@dataclass(frozen=True)
class ContainerSpec:
    """Exactly the keywords the docker SDK's ``containers.create`` receives; :meth:`create_kwargs`."""

    image: str
    command: tuple[str, ...]
    name: str
    hostname: str
    labels: Mapping[str, str]
    user: str
    mounts: tuple[Mount, ...]
    read_only: bool
    tmpfs: Mapping[str, str]
    cap_drop: tuple[str, ...]
    cap_add: tuple[str, ...]
    security_opt: tuple[str, ...]
    privileged: bool
    pids_limit: int
    mem_limit: int
    memswap_limit: int
    ulimits: tuple[Ulimit, ...]
    ipc_mode: str
    log_config: LogConfig
    runtime: str | None
    environment: Mapping[str, str]
    network_mode: str | None = None
    ports: Mapping[str, tuple[str, int]] | None = None
    cpuset_cpus: str | None = None
    nano_cpus: int | None = None

    def create_kwargs(self) -> dict[str, Any]:
        """The keywords for ``containers.create``, as lists and dicts; those that are None are
        left out (the SDK's default)."""
        kwargs: dict[str, Any] = {}
        for spec_field in fields(self):
            value = getattr(self, spec_field.name)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping) and not isinstance(value, LogConfig):
                value = dict(value)
            if value is not None:
                kwargs[spec_field.name] = value
        return kwargs


def container_spec(config: SandboxConfig, engine: EngineFacts, host: HostFacts) -> ContainerSpec:
    """The container that runs ``config`` on an engine of ``engine`` with what ``host`` prepared."""
    limits = config.limits
    return ContainerSpec(
        image=config.image,
        command=server_command(config, gvisor=engine.gvisor),
        name=config.name,
        hostname="sandbox",
        labels=leftovers.labels(config.lease.owner, config.lease.session, config.lease.expiry_seconds,
                             [host.channel_dir], now=host.created),
        user="0:0",
        mounts=_mounts(config, host.channel_dir),
        read_only=True,
        tmpfs={"/tmp": tmpfs_options(limits.tmpfs_bytes), "/dev/shm": tmpfs_options(limits.shm_bytes)},
        cap_drop=("ALL",),
        cap_add=CAPABILITIES,
        security_opt=("no-new-privileges", f"seccomp={host.seccomp_profile}"),
        privileged=False,
        pids_limit=pids_limit(config, engine),
        mem_limit=limits.memory,
        memswap_limit=limits.memory,
        ulimits=ulimits(config, engine),
        ipc_mode="private",
        log_config=LogConfig(type=LOG_DRIVER, config=LOG_OPTIONS),
        runtime=config.runtime,
        environment={},
        **_network(config),
        **cpu_limit(limits.cpus, engine.cpus, config.name, cpuset=engine.cpuset_allowed),
    )


def unix_address(channel_dir: Path) -> str:
    """The address the host reaches the server at through the Unix socket in ``channel_dir``."""
    return f"unix://{channel_dir / SOCKET_NAME}"


def cpu_limit(cpus: float, engine_cpus: int, name: str, *, cpuset: bool = True) -> dict[str, Any]:
    """The container options that hold it to ``cpus`` CPUs of an engine with ``engine_cpus``.

    A whole number below the engine's count is a cpuset: the container runs on that many CPUs
    (which ones follows from ``name``, so that sandboxes spread over the engine's CPUs), and
    within them the scheduler's priorities hold: commands at nice 19 yield to the server.
    Only a fraction, or an engine that refuses a cpuset (``cpuset=False``), takes a CFS quota:
    a command that spends the quota (a fork bomb) stalls the server with it until the next
    period, for seconds at a time (SECURITY.md, "CPU sharing").
    As many CPUs as the engine has, or more, needs no limit.
    """
    if cpus >= engine_cpus:
        return {}
    if not cpuset or not float(cpus).is_integer():
        return {"nano_cpus": int(cpus * 1e9)}
    first = zlib.crc32(name.encode()) % engine_cpus
    chosen = sorted((first + offset) % engine_cpus for offset in range(int(cpus)))
    return {"cpuset_cpus": ",".join(map(str, chosen))}


def tmpfs_options(size: int) -> str:
    """A ``noexec,nosuid,nodev`` tmpfs of ``size`` bytes holding one entry per :data:`TMPFS_BYTES_PER_ENTRY`."""
    entries = max(MIN_TMPFS_ENTRIES, size // TMPFS_BYTES_PER_ENTRY)
    return f"size={size},nr_inodes={entries},mode=1777,noexec,nosuid,nodev"


def pids_limit(config: SandboxConfig, engine: EngineFacts) -> int:
    """The sandbox's pids cgroup limit: its tasks, under gVisor runsc's host threads for each
    (:data:`GVISOR_HOST_TASKS_PER_TASK`)."""
    pids = config.limits.pids
    return pids * GVISOR_HOST_TASKS_PER_TASK if engine.gvisor else pids


def root_mounts(config: SandboxConfig) -> tuple[Mount, ...]:
    """The roots, bind-mounted at their own paths, read-only unless writable."""
    return tuple(Mount(root.path, root.path, type="bind", read_only=not root.writable) for root in config.roots)


def _mounts(config: SandboxConfig, channel_dir: Path) -> tuple[Mount, ...]:
    ca = () if config.ca_file is None else (Mount(CA_PATH, str(channel_dir / CA_NAME), type="bind", read_only=True),)
    return (*root_mounts(config), Mount(channel_mount(config), str(channel_dir), type="bind"), *ca)


def ulimits(config: SandboxConfig, engine: EngineFacts, *, more_writable: bool = False) -> tuple[Ulimit, ...]:
    """Open files, no core dumps, ``RLIMIT_NICE`` 0, with a writable root (of ``config``, or one
    the placement adds: ``more_writable``) ``RLIMIT_FSIZE`` of the disk budget, under gVisor
    ``RLIMIT_NPROC`` of what the memory holds."""
    limits = config.limits
    ulimits = [Ulimit(name="nofile", soft=limits.nofile, hard=limits.nofile), Ulimit(name="core", soft=0, hard=0),
               Ulimit(name="nice", soft=0, hard=0)]
    if config.writable_roots or more_writable:
        ulimits.append(Ulimit(name="fsize", soft=limits.disk_bytes, hard=limits.disk_bytes))
    if engine.gvisor:
        tasks = min(limits.pids, limits.memory // GVISOR_BYTES_PER_TASK)
        ulimits.append(Ulimit(name="nproc", soft=tasks, hard=tasks))
    return tuple(ulimits)


def _network(config: SandboxConfig) -> dict[str, Any]:
    match config.network:
        case PublishedPort(host=host, port=port):
            return {"ports": {f"{TCP_PORT}/tcp": (host, port)}}
        case NoNetwork():
            return {"network_mode": "none"}
        case _:
            assert_never(config.network)
