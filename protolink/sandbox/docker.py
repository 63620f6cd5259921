"""DockerSandbox: one locked-down container per sandbox, started and removed through the docker SDK.

::

    async with DockerSandbox(["/srv/repo"], writable=["/srv/repo/out"]) as backend:
        result = await backend.execute(spec, ctx)

The container runs the sandbox server (``python -m protolink_sandboxd``) of the image. Secure by default:
no network, every capability dropped except SETUID, SETGID and KILL (the server needs them to run
commands as an unprivileged uid and to kill them), ``no-new-privileges``, the seccomp profile in
``seccomp.json``, a read-only root file system with ``noexec`` tmpfs at /tmp and /dev/shm
bounded in size and entries, pids, memory (swap included) and CPU limits, bounded logs, never
privileged, never the Docker socket.
Roots are mounted at their own absolute paths, read-only unless declared writable; writable
roots share a disk budget (:mod:`protolink.sandbox.disk`). The host reaches the server through a
Unix socket in a directory only the host user can open, or, for remote engines, over TCP with a
token the server reads from a root-only file and deletes. The container is removed on every exit
path, cancellation included; containers left by a dead process are reaped at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import shutil
import signal
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from protolink.errors import SandboxEngineError, SandboxError, SandboxUnavailableError
from protolink.wire.roots import Root

from . import engine, reaper
from .disk import DiskWatch
from .engine import engine_error, engine_errors
from .hostdirs import private_subdir, write_private
from .provision import DEFAULT_IMAGE
from .writable_roots import check_writable

if TYPE_CHECKING:
    from .client import SandboxBackend

log = logging.getLogger(__name__)

T = TypeVar("T")

GiB = 1 << 30
MiB = 1 << 20
NOBODY = 65534
SOCKET_DIR = "/run/protolink"
SOCKET_PATH = f"{SOCKET_DIR}/sandbox.sock"
SECRET_DIR = "/run/protolink-secret"
TCP_PORT = 7000
#: Paths of the image a root may not hide: the server and the system it runs on.
RESERVED_PATHS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/opt/protolink", "/proc", "/run",
                  "/sbin", "/sys", "/usr", "/var/lib", "/var/run")
DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")
SHM_BYTES = 64 * MiB
#: A tmpfs holds at most one entry per this many bytes of its size. ``size=`` alone does not
#: bound entries: a flood of empty files fills the container's memory with inodes until the
#: OOM killer picks the largest process, the server.
TMPFS_BYTES_PER_ENTRY = 4096
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
#: Under gVisor a process that exhausts the container's memory gets the Sentry, that is the
#: whole sandbox, killed by the host's OOM killer (this gVisor has none of its own). Each command
#: and document worker is held to this share of the memory limit (RLIMIT_AS), so that one
#: runaway fails alone, as the kernel's OOM killer makes it fail under runc.
GVISOR_PROCESS_MEMORY_SHARE = 0.5


def _resolve_roots(roots: Iterable[str | os.PathLike[str] | Root], writable: Iterable[str | os.PathLike[str]]) -> tuple[Root, ...]:
    """Absolute, resolved, existing directories; refuses the system's paths and the Docker socket."""
    declared = [r if isinstance(r, Root) else Root(os.fspath(r)) for r in roots]
    declared += [Root(os.fspath(path), writable=True) for path in writable]
    resolved: dict[str, bool] = {}
    for root in declared:
        if not os.path.isabs(root.path):
            raise ValueError(f"sandbox root must be an absolute path: {root.path!r}")
        path = os.path.realpath(root.path)
        if not os.path.isdir(path):
            raise ValueError(f"sandbox root is not a directory: {root.path!r}")
        if path in ("/", "/tmp"):
            raise ValueError(f"sandbox root {path!r} is too broad: mount a directory beneath it")
        for reserved in RESERVED_PATHS:
            if path == reserved or path.startswith(reserved + "/") or reserved.startswith(path + "/"):
                raise ValueError(f"sandbox root {path!r} would hide or expose the system's {reserved}")
        for sock in (*DOCKER_SOCKETS, _docker_socket()):
            if sock and os.path.realpath(sock).startswith(path + "/"):
                raise ValueError(f"sandbox root {path!r} contains the Docker socket")
        resolved[path] = resolved.get(path, False) or root.writable
    return tuple(Root(path, writable) for path, writable in resolved.items())


def _docker_socket() -> str | None:
    host = os.environ.get("DOCKER_HOST", "")
    return host.removeprefix("unix://") if host.startswith("unix://") else None


def command_identity(uid: int | None = None, gid: int | None = None) -> tuple[int, int]:
    """The uid/gid commands run as: 65534 (nobody) unless given; never 0.

    Not the host user's uid even when it is not root: the socket directory belongs to the
    host user, and commands must not be able to open or replace the socket.
    """
    uid = NOBODY if uid is None else uid
    gid = (NOBODY if uid == NOBODY else uid) if gid is None else gid
    if uid == 0 or gid == 0:
        raise ValueError("sandbox commands never run as uid or gid 0")
    return uid, gid


def seccomp_profile() -> str:
    """The default seccomp profile (JSON), stricter than Docker's own."""
    return resources.files(__package__).joinpath("seccomp.json").read_text()


async def _uncancellable(awaitable: Awaitable[T]) -> T:
    """Await to completion even when cancelled; the cancellation is re-raised afterwards.

    Used for starting and removing containers: a container must never be created behind our
    back, or left half-removed, because the caller was cancelled.
    """
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


def _in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Awaitable[T]:
    return _uncancellable(asyncio.to_thread(fn, *args, **kwargs))


#: How many CPUs each engine (``DOCKER_HOST``) has, asked once.
_engine_cpus: dict[str, int] = {}


def cpu_limit(cpus: float, engine_cpus: int, name: str) -> dict[str, Any]:
    """The container options that hold it to ``cpus`` CPUs of an engine with ``engine_cpus``.

    A whole number below the engine's count is a cpuset: the container runs on that many CPUs
    (which ones follows from ``name``, so that sandboxes spread over the engine's CPUs), and
    within them the scheduler's priorities hold: commands at nice 19 yield to the server.
    Only a fraction takes a CFS quota: a command that spends the quota (a fork bomb) stalls the
    server with it until the next period, for seconds at a time (SECURITY.md, "CPU sharing").
    As many CPUs as the engine has, or more, needs no limit.
    """
    if cpus >= engine_cpus:
        return {}
    if not float(cpus).is_integer():
        return {"nano_cpus": int(cpus * 1e9)}
    first = zlib.crc32(name.encode()) % engine_cpus
    chosen = sorted((first + offset) % engine_cpus for offset in range(int(cpus)))
    return {"cpuset_cpus": ",".join(map(str, chosen))}


class DockerSandbox:
    """One sandbox container; ``async with`` it to get its :class:`SandboxBackend`.

    ``memory`` (bytes, swap included), ``pids`` and ``cpus`` bound the whole container (a whole
    number of CPUs is a cpuset, a fraction a CFS quota: see :func:`cpu_limit`);
    ``tmpfs_bytes`` bounds /tmp; ``disk_bytes`` bounds how much the writable roots may grow.
    Commands run as ``command_uid``/``command_gid`` (default 65534, nobody; never 0): a writable
    root they cannot write is refused when the sandbox starts (RootNotWritableError, with the
    command that fixes it), unless ``chown_writable`` asks to hand such a root to that user
    (chown; nothing changes owner otherwise). ``runtime="runsc"`` runs the container under gVisor.
    ``tcp="HOST:PORT"`` publishes the server on the engine's host (port 0 picks one) instead of
    a Unix socket, with a fresh token, for remote engines: the container then has a network.
    ``expiry_seconds`` bounds how long the reaper lets the container live; ``owner`` defaults
    to this process, so the container is reaped once the process is gone.
    """

    def __init__(
        self,
        roots: Iterable[str | os.PathLike[str] | Root] = (),
        *,
        writable: Iterable[str | os.PathLike[str]] = (),
        image: str = DEFAULT_IMAGE,
        memory: int = 1 * GiB,
        pids: int = 512,
        cpus: float = 1.0,
        tmpfs_bytes: int = 256 * MiB,
        disk_bytes: int = 1 * GiB,
        runtime: str | None = None,
        command_uid: int | None = None,
        command_gid: int | None = None,
        expiry_seconds: float | None = 24 * 3600,
        owner: str | None = None,
        name: str | None = None,
        tcp: str | None = None,
        start_timeout: float = 30.0,
        chown_writable: bool = False,
    ) -> None:
        if memory < 64 * MiB or pids < 16 or cpus <= 0 or tmpfs_bytes <= 0 or disk_bytes < 0:
            raise ValueError("sandbox limits: memory >= 64 MiB, pids >= 16, cpus > 0, tmpfs_bytes > 0, disk_bytes >= 0")
        self.roots = _resolve_roots(roots, writable)
        self.command_uid, self.command_gid = command_identity(command_uid, command_gid)
        self.image = image
        self.memory, self.pids, self.cpus = memory, pids, cpus
        self.tmpfs_bytes, self.disk_bytes = tmpfs_bytes, disk_bytes
        self.runtime = runtime
        self.expiry_seconds = expiry_seconds
        self.owner = owner or reaper.process_owner()
        self.session = secrets.token_hex(8)
        self.name = name or f"protolink-sandbox-{self.session}"
        self.tcp = tcp
        self.start_timeout = start_timeout
        self.chown_writable = chown_writable
        self.address: str | None = None
        self.reaped: list[reaper.Reaped] = []
        self._token = secrets.token_urlsafe(32) if tcp else None
        self._state = "new"
        self._docker: Any = None
        self._container: Any = None
        self._host_dirs: list[Path] = []
        self._backend: SandboxBackend | None = None
        self._watch: DiskWatch | None = None
        self._gvisor = False  # the runtime is gVisor's runsc (set when the engine's runtimes are checked)

    @property
    def boundary(self) -> str:
        return f"sandbox:{self.name}"

    @property
    def container_id(self) -> str | None:
        return None if self._container is None else self._container.id

    @property
    def backend(self) -> SandboxBackend:
        """The running sandbox's backend (what ``async with`` yields)."""
        if self._backend is None or self._state != "running":
            raise RuntimeError("the sandbox is not running")
        return self._backend

    @property
    def token(self) -> str | None:
        """The TCP mode's token (None for a Unix socket)."""
        return self._token

    async def __aenter__(self) -> SandboxBackend:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    def check_roots(self) -> list[str]:
        """Refuse a writable root the command user cannot write, or hand it over with
        ``chown_writable`` (see :func:`~protolink.sandbox.writable_roots.check_writable`); the paths handed
        over. :meth:`start` calls it; call it first to fail before anything slow. Blocking."""
        return check_writable(self.roots, self.command_uid, self.command_gid, hand_over=self.chown_writable)

    async def start(self) -> SandboxBackend:
        """Start the container, wait until its server answers, and return the backend."""
        if self._state != "new":
            raise RuntimeError("a DockerSandbox starts once; make a new one")
        self._state = "starting"
        try:
            await asyncio.to_thread(self.check_roots)
            with engine_errors(f"start sandbox container {self.name}"):
                self._docker = await _in_thread(engine.client)
                if self.runtime is not None:
                    await _in_thread(self._check_runtime)
                if self.tcp:  # its port is published through the bridge: "network bridge not found" says it is missing
                    await _in_thread(self._docker.api.inspect_network, "bridge")
                self.reaped = await _in_thread(reaper.reap, self._docker)
                for gone in self.reaped:
                    log.warning("reaped sandbox container %s (%s): %s", gone.name, gone.container_id, gone.reason)
                await _in_thread(self._run_container)
                self._backend = await self._wait_ready()
            writable = [root.path for root in self.roots if root.writable]
            if writable:
                self._watch = DiskWatch(writable, self.disk_bytes, self._stop_commands)
                await self._watch.start()
        except BaseException:
            await self.aclose()
            raise
        self._state = "running"
        return self._backend

    async def aclose(self) -> None:
        """Close the backend and remove the container and its host directories. Idempotent."""
        if self._state in ("closed", "detached"):
            return
        self._state = "closed"
        await _uncancellable(self._teardown(remove=True))

    async def detach(self) -> str:
        """Leave the running container to outlive this object (an appliance); returns its address.

        The host-side disk watch stops with this object: a detached sandbox's writable roots
        keep only the per-file limit. ``protolink-sandbox down`` removes it.
        """
        if self._state != "running" or self.address is None:
            raise RuntimeError("only a running DockerSandbox can be detached")
        self._state = "detached"
        await _uncancellable(self._teardown(remove=False))
        return self.address

    async def _teardown(self, *, remove: bool) -> None:
        if self._watch is not None:
            await self._watch.aclose()
        if self._backend is not None:
            try:
                await self._backend.aclose()
            except Exception:
                log.exception("closing the sandbox backend failed")
        failure = None
        if remove and self._container is not None:
            failure = await asyncio.to_thread(self._remove_container)
        if remove:
            for path in self._host_dirs:
                await asyncio.to_thread(shutil.rmtree, path, True)
        if self._docker is not None:
            await asyncio.to_thread(self._docker.close)
        if failure is not None:
            raise failure

    def _remove_container(self) -> SandboxUnavailableError | None:
        """Remove the container; the error to raise once the rest is cleaned up if the engine is gone."""
        import docker.errors

        try:
            self._container.remove(force=True, v=True)
        except docker.errors.NotFound:
            pass
        except (docker.errors.DockerException, OSError) as error:  # requests' errors are OSErrors
            failure = engine_error(error, f"remove sandbox container {self.name}")
            return SandboxEngineError(f"{failure}; the reaper removes it once this process has exited or its "
                                      "expiry has passed")
        return None

    def _cpu_limit(self) -> dict[str, Any]:
        host = os.environ.get("DOCKER_HOST", "")
        if host not in _engine_cpus:
            _engine_cpus[host] = int(self._docker.info()["NCPU"])
        return cpu_limit(self.cpus, _engine_cpus[host], self.name)

    def _check_runtime(self) -> None:
        runtimes = self._docker.info().get("Runtimes") or {}
        if self.runtime not in runtimes:
            raise SandboxEngineError(f"could not start sandbox container {self.name}: {engine.no_runtime(self.runtime)} "
                                     f"(it has: {', '.join(sorted(runtimes)) or 'none'})")
        self._gvisor = os.path.basename(runtimes[self.runtime].get("path") or "") == "runsc"

    def _server_command(self) -> list[str]:
        command = ["--boundary", self.name, "--command-uid", str(self.command_uid),
                   "--command-gid", str(self.command_gid)]
        for root in self.roots:
            command += ["--root", f"{root.path}:{'rw' if root.writable else 'ro'}"]
        if self._gvisor:  # see GVISOR_PROCESS_MEMORY_SHARE
            share = str(int(self.memory * GVISOR_PROCESS_MEMORY_SHARE))
            command += ["--command-memory-bytes", share, "--worker-memory-bytes", share]
        if self.tcp:
            command += ["--listen", f"tcp://0.0.0.0:{TCP_PORT}", "--token-file", f"{SECRET_DIR}/token"]
        else:
            command += ["--listen", f"unix://{SOCKET_PATH}"]
        return command

    def _mounts(self) -> list[Any]:
        from docker.types import Mount

        mounts = [Mount(root.path, root.path, type="bind", read_only=not root.writable) for root in self.roots]
        host_dir = private_subdir(f"{self.name}-")
        self._host_dirs.append(host_dir)
        if self.tcp:
            # Read once by the server (uid 0 in the container) and deleted; commands cannot open it.
            write_private(host_dir / "token", self._token or "")
            mounts.append(Mount(SECRET_DIR, str(host_dir), type="bind"))
        else:
            mounts.append(Mount(SOCKET_DIR, str(host_dir), type="bind"))
        return mounts

    def _labels(self) -> dict[str, str]:
        return reaper.labels(self.owner, self.session, self.expiry_seconds, self._host_dirs)

    def _run_container(self) -> None:
        """Create and start the container (blocking). It is recorded the moment it exists, so
        a cancelled start still removes it."""
        import docker.errors
        from docker.types import LogConfig, Ulimit

        ulimits = [Ulimit(name="nofile", soft=8192, hard=8192), Ulimit(name="core", soft=0, hard=0),
                   Ulimit(name="nice", soft=0, hard=0)]  # commands cannot raise their priority
        if any(root.writable for root in self.roots):
            ulimits.append(Ulimit(name="fsize", soft=self.disk_bytes, hard=self.disk_bytes))
        pids_limit = self.pids
        if self._gvisor:  # see GVISOR_HOST_TASKS_PER_TASK and GVISOR_BYTES_PER_TASK
            tasks = min(self.pids, self.memory // GVISOR_BYTES_PER_TASK)
            ulimits.append(Ulimit(name="nproc", soft=tasks, hard=tasks))
            pids_limit = self.pids * GVISOR_HOST_TASKS_PER_TASK
        options: dict[str, Any] = {}
        if self.tcp:
            host, _, port = self.tcp.rpartition(":")
            options["ports"] = {f"{TCP_PORT}/tcp": (host or "127.0.0.1", int(port or 0))}
        else:
            options["network_mode"] = "none"
        mounts = self._mounts()
        create = functools.partial(
            self._docker.containers.create,
            self.image,
            self._server_command(),
            name=self.name,
            hostname="sandbox",
            labels=self._labels(),
            user="0:0",
            mounts=mounts,
            read_only=True,
            tmpfs={"/tmp": _tmpfs_options(self.tmpfs_bytes), "/dev/shm": _tmpfs_options(SHM_BYTES)},
            cap_drop=["ALL"],
            cap_add=["SETUID", "SETGID", "KILL"],
            security_opt=["no-new-privileges", f"seccomp={seccomp_profile()}"],
            privileged=False,
            pids_limit=pids_limit,
            mem_limit=self.memory,
            memswap_limit=self.memory,
            ulimits=ulimits,
            ipc_mode="private",
            log_config=LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
            runtime=self.runtime,
            environment={},
            **options,
        )
        cpus = self._cpu_limit()
        try:
            container = create(**cpus)
        except docker.errors.APIError as error:
            # An engine confined to some of its CPUs refuses others ("Requested CPUs are not
            # available"): the limit falls back to a quota.
            if "cpuset_cpus" not in cpus or "CPUs are not available" not in str(error):
                raise
            log.warning("sandbox %s: the engine refused CPUs %s (%s); using a CPU quota instead",
                        self.name, cpus["cpuset_cpus"], error)
            container = create(nano_cpus=int(self.cpus * 1e9))
        self._container = container
        try:
            container.start()
            self.address = self._published_address() if self.tcp else f"unix://{self._host_dirs[0] / 'sandbox.sock'}"
        except BaseException:
            container.remove(force=True)
            self._container = None
            raise

    def _published_address(self) -> str:
        self._container.reload()
        address = published_address(self._container)
        if address is None:
            raise self._exit_error() or SandboxEngineError(
                f"the engine published no port for sandbox container {self.name}: TCP mode needs the engine's "
                "bridge network (docker0)")
        return address

    async def _wait_ready(self) -> SandboxBackend:
        """Connect once the server answers its health check; fail fast if the container dies."""
        from .client import connect

        assert self.address is not None
        deadline = time.monotonic() + self.start_timeout
        next_check = time.monotonic() + 0.25
        socket_path = self.address.removeprefix("unix://") if not self.tcp else None
        last_error: BaseException | None = None
        while time.monotonic() < deadline:
            if socket_path is None or os.path.exists(socket_path):
                backend = None
                try:
                    # Short attempts on fresh channels: a channel that failed once backs off for a second.
                    backend = await connect(self.address, token=self._token, timeout=1.0)
                    if await backend.health():
                        return backend
                except SandboxError as error:
                    last_error = error
                if backend is not None:
                    await backend.aclose()
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + 0.25
                await self._raise_if_exited()
            await asyncio.sleep(0.002)
        await self._raise_if_exited()
        raise SandboxUnavailableError(
            f"sandbox {self.name} did not answer within {self.start_timeout:g} s" + (f": {last_error}" if last_error else "")
        )

    async def _raise_if_exited(self) -> None:
        await asyncio.to_thread(self._container.reload)
        failure = await asyncio.to_thread(self._exit_error)
        if failure is not None:
            raise failure

    def _exit_error(self) -> SandboxUnavailableError | None:
        """The error that says the container exited while starting, with its last lines; None while it runs."""
        if self._container.status not in ("exited", "dead"):
            return None
        logs = self._container.logs(tail=20)
        code = self._container.attrs["State"].get("ExitCode")
        return SandboxUnavailableError(
            f"sandbox container {self.name} exited (code {code}) while starting:\n" + logs.decode("utf-8", "replace").strip())

    def _stop_commands(self) -> None:
        """Kill every process of the command uid in the container (the disk budget is spent).

        From the host, through the container's cgroup, when this user may signal them (fast:
        no exec): the processes whose real and saved uids are the command user's. The command
        spawner keeps a saved uid of its own (commands cannot take it), so it is spared even in
        the instant it starts a command with the command user as its real uid. Otherwise by an
        exec of ``kill -KILL -1`` as the command uid, which can hit the spawner in that instant
        (it is then replaced; SECURITY.md). Under gVisor
        always by the exec: its cgroup holds runsc's processes, not the sandbox's, and the
        Sentry runs as nobody on the host (the default command uid), so the host would kill it.
        The exec's shell is started through setpriv: gVisor gives an exec'd process of any uid
        the container's capabilities, and kill(-1) with CAP_KILL would end PID 1 too.
        """
        if not self._gvisor:
            try:
                for pid in _cgroup_pids(self._container):
                    uids = _uids(pid)
                    if uids is not None and uids[0] == uids[2] == self.command_uid:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                return
            except (PermissionError, LookupError, OSError):
                pass
        self._container.exec_run(["/usr/bin/setpriv", "--inh-caps=-all", "/bin/sh", "-c", "kill -KILL -1"],
                                 user=f"{self.command_uid}:{self.command_gid}")

    async def disk_growth(self) -> int:
        """How many bytes the writable roots have grown since the sandbox started."""
        return 0 if self._watch is None else await self._watch.growth_bytes()


def published_address(container: Any) -> str | None:
    """HOST:PORT where the engine publishes the server's TCP port of ``container`` (a docker SDK
    object, as last loaded); None when it publishes none (a Unix socket)."""
    bindings = (container.attrs["NetworkSettings"]["Ports"] or {}).get(f"{TCP_PORT}/tcp")
    if not bindings:
        return None
    host = bindings[0]["HostIp"]
    return f"{host if host not in ('', '0.0.0.0', '::') else '127.0.0.1'}:{bindings[0]['HostPort']}"


def _tmpfs_options(size: int) -> str:
    entries = max(1024, size // TMPFS_BYTES_PER_ENTRY)
    return f"size={size},nr_inodes={entries},mode=1777,noexec,nosuid,nodev"


def _cgroup_pids(container: Any) -> list[int]:
    """Host pids of every process in the container, read from its pids (or unified) cgroup."""
    container.reload()
    init = container.attrs["State"]["Pid"]
    with open(f"/proc/{init}/cgroup") as cgroups:
        for line in cgroups:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "pids" in controllers.split(",") or controllers == "":
                base = "/sys/fs/cgroup/pids" if controllers else "/sys/fs/cgroup"
                with open(f"{base}{path}/cgroup.procs") as procs:
                    return [int(pid) for pid in procs.read().split()]
    raise LookupError(f"no pids cgroup for container {container.name}")


def _uids(pid: int) -> tuple[int, ...] | None:
    """The real, effective, saved and file-system uids of ``pid`` (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("Uid:"):
                    return tuple(int(uid) for uid in line.split()[1:])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def roots_from_env(value: str | None = None) -> list[Root]:
    """Roots from ``PROTOLINK_SANDBOX_ROOTS`` (``PATH[:rw|:ro]`` separated by ``,``)."""
    value = os.environ.get("PROTOLINK_SANDBOX_ROOTS", "") if value is None else value
    return [Root.parse(item.strip()) for item in value.split(",") if item.strip()]

