"""DockerSandbox: one locked-down container per sandbox, started and removed through the docker SDK.

::

    async with DockerSandbox(["/srv/repo"], writable=["/srv/repo/out"]) as backend:
        result = await backend.execute(spec, ctx)

What runs is a :class:`~protolink.sandbox.config.SandboxConfig`, and the container is its pure
translation (:func:`~protolink.sandbox.placements.docker.container_spec`, where every security
default is spelled out). This module keeps the lifecycle: it asks the engine for its facts,
prepares the host's private directory (the server's Unix socket, or TCP mode's token, which the
server reads from a root-only file and deletes), creates and starts the container, waits until
the server answers, starts the sandbox's egress proxy when it has egress
(:mod:`protolink.sandbox.egress`), watches the writable roots' disk budget (:mod:`protolink.sandbox.disk`),
stops commands when it is spent, and removes the container on every exit path, cancellation
included; containers left by a dead process are reaped at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from protolink.errors import SandboxEngineError, SandboxError, SandboxProtectionError, SandboxUnavailableError
from protolink.wire.protections import REFUSED, parse_refusal, seccomp_profile
from protolink.wire.roots import Root

from . import engine, leftovers
from .addresses import socket_gone
from .ca_file import copy_ca_file
from .config import PublishedPort, SandboxConfig
from .disk import DiskWatch
from .egress.events import EgressEvent
from .egress.policy import EgressPolicy
from .egress.service import EgressService
from .engine import engine_error, engine_errors
from .hostdirs import private_subdir
from .placements.docker import (
    TCP_PORT,
    ContainerSpec,
    EngineFacts,
    HostFacts,
    container_spec,
    unix_address,
)
from .placements.server import CA_NAME, write_secrets
from .usage import pids_in
from .writable_roots import check_writable

if TYPE_CHECKING:
    from .client import SandboxBackend

log = logging.getLogger(__name__)

T = TypeVar("T")


async def _uncancellable(awaitable: Awaitable[T]) -> T:
    """Await to completion even when canceled; the cancellation is re-raised afterwards.

    Used for starting and removing containers: a container must never be created behind our
    back, or left half-removed, because the caller was canceled.
    """
    task = asyncio.ensure_future(awaitable)
    canceled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            canceled = True
    if canceled:
        raise asyncio.CancelledError
    return result


def _in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Awaitable[T]:
    return _uncancellable(asyncio.to_thread(fn, *args, **kwargs))


#: How many CPUs each engine (``DOCKER_HOST``) has, asked once.
_engine_cpus: dict[str, int] = {}


def engine_cpus(docker_client: Any | None = None, info: Mapping[str, Any] | None = None) -> int:
    """How many CPUs the engine (``DOCKER_HOST``) has, asked once per engine: told by ``info``
    (what it already said of itself), else asked of ``docker_client`` (default: a client made
    for the question). Blocking."""
    host = os.environ.get("DOCKER_HOST", "")
    if host not in _engine_cpus:
        if info is None:
            made = docker_client is None
            docker_client = engine.client() if made else docker_client
            try:
                info = docker_client.info()
            finally:
                if made:
                    docker_client.close()
        _engine_cpus[host] = int(info.get("NCPU") or 1)
    return _engine_cpus[host]


class DockerSandbox:
    """One sandbox container; ``async with`` it to get its :class:`SandboxBackend`.

    What runs is a :class:`~protolink.sandbox.config.SandboxConfig`: give it as ``config=``, or
    give the keywords of :meth:`SandboxConfig.from_options
    <protolink.sandbox.config.SandboxConfig.from_options>` (``roots``, ``writable``, ``image``,
    ``memory``, ``pids``, ``cpus``, ``tmpfs_bytes``, ``disk_bytes``, ``runtime``,
    ``command_uid``, ``command_gid``, ``expiry_seconds``, ``owner``, ``name``, ``tcp``,
    ``egress``, ``ca_file``), never both. ``memory`` (bytes, swap included), ``pids`` and
    ``cpus`` bound the whole container (a whole number of CPUs is a cpuset, a fraction a CFS quota: see
    :func:`~protolink.sandbox.placements.docker.cpu_limit`); ``tmpfs_bytes`` bounds /tmp;
    ``disk_bytes`` bounds how much the writable roots may grow. Commands run as
    ``command_uid``/``command_gid`` (default 65534, nobody; never 0): a writable root they
    cannot write is refused when the sandbox starts (RootNotWritableError, with the command that
    fixes it), unless ``chown_writable`` asks to hand such a root to that user (chown; nothing
    changes owner otherwise). ``runtime="runsc"`` runs the container under gVisor.
    ``tcp="HOST:PORT"`` publishes the server on the engine's host (port 0 picks one) instead of
    a Unix socket, for remote engines: the container then has a network. The server speaks TLS
    with a fresh self-signed certificate (its :attr:`fingerprint`, which clients pin) and
    wants a fresh :attr:`token` on every call.
    ``egress`` (an :class:`~protolink.sandbox.egress.policy.EgressPolicy` or its rule texts,
    such as ``["pypi.org:443", "*.pythonhosted.org:443"]``) gives commands a way out through a
    proxy on this host that belongs to this sandbox: the container keeps no network; commands
    get ``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY`` (and lower-case forms)
    naming a relay on the container's loopback, and every decision of the proxy goes to
    ``on_egress_event`` (an :class:`~protolink.sandbox.egress.events.EgressEvent`);
    :meth:`set_egress` changes the policy of the running sandbox. Without ``egress`` (the
    default) there is no proxy, no relay and no proxy variable.
    ``ca_file`` (a host path of a PEM bundle) makes every command trust it: the sandbox gets a
    copy taken when it starts, read-only at :data:`~protolink.sandbox.placements.server.CA_PATH`,
    and commands get :data:`~protolink.wire.trust.CA_VARIABLES` naming it (a variable the
    command sets itself keeps its value). A file that is missing, not a readable regular file,
    over 4 MiB or without a PEM certificate raises :class:`~protolink.errors.CaFileError` when the
    configuration is made.
    ``expiry_seconds`` bounds how long the reaper lets the container live; ``owner`` defaults
    to this process, so the container is reaped once the process is gone. ``start_timeout``
    bounds how long :meth:`start` waits for the server to answer.
    """

    def __init__(
        self,
        roots: Iterable[str | os.PathLike[str] | Root] = (),
        *,
        config: SandboxConfig | None = None,
        start_timeout: float = 30.0,
        chown_writable: bool = False,
        on_egress_event: Callable[[EgressEvent], None] | None = None,
        **options: Any,
    ) -> None:
        if config is None:
            config = SandboxConfig.from_options(roots, **options)
        elif roots or options:
            raise TypeError("DockerSandbox takes config= or the options a configuration is made of "
                            f"(roots, {', '.join(options) or 'memory'}, ...), not both")
        self.config = config
        self.start_timeout = start_timeout
        self.chown_writable = chown_writable
        self.on_egress_event = on_egress_event
        self.address: str | None = None
        self.reaped: list[leftovers.Reaped] = []
        self._tcp = isinstance(config.network, PublishedPort)
        self._token = secrets.token_urlsafe(32) if self._tcp else None
        self._fingerprint: str | None = None
        self._state = "new"
        self._docker: Any = None
        self._container: Any = None
        self._host_dirs: list[Path] = []
        self._backend: SandboxBackend | None = None
        self._watch: DiskWatch | None = None
        self._disk_budget_spent = False
        self._egress: EgressService | None = None
        self._engine: EngineFacts | None = None  # what the engine said about itself, once it was asked

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def session(self) -> str:
        return self.config.lease.session

    @property
    def roots(self) -> tuple[Root, ...]:
        return self.config.roots

    @property
    def command_uid(self) -> int:
        return self.config.identity.uid

    @property
    def command_gid(self) -> int:
        return self.config.identity.gid

    @property
    def boundary(self) -> str:
        return f"sandbox:{self.name}"

    @property
    def container_id(self) -> str | None:
        return None if self._container is None else self._container.id

    def host_pid(self) -> int:
        """The host pid of the running container's first process (its cgroups say what the
        container uses: :mod:`protolink.sandbox.usage`). Blocking."""
        if self._container is None or self._state != "running":
            raise RuntimeError("the sandbox is not running")
        self._container.reload()
        return int(self._container.attrs["State"]["Pid"])

    @property
    def backend(self) -> SandboxBackend:
        """The running sandbox's backend (what ``async with`` yields)."""
        if self._backend is None or self._state != "running":
            raise RuntimeError("the sandbox is not running")
        return self._backend

    @property
    def egress(self) -> EgressPolicy | None:
        """The egress policy in force while the sandbox runs (before and after: the configured
        one); None: the sandbox has no egress."""
        return self.config.egress if self._egress is None else self._egress.policy

    async def set_egress(self, policy: EgressPolicy | Iterable[str]) -> None:
        """Change what the running sandbox's commands may reach: new connections follow
        ``policy`` at once, and open connections it would not allow are closed at once (every
        one under :data:`~protolink.sandbox.egress.policy.DENY_ALL`). Only a sandbox started
        with egress (``DENY_ALL`` will do) has the relay to open later: RuntimeError otherwise."""
        if self._egress is None or self._state != "running":
            raise RuntimeError("set_egress needs a running sandbox started with egress= (its relay starts with it)")
        self._egress.set_policy(policy if isinstance(policy, EgressPolicy) else EgressPolicy.parse(policy))

    @property
    def token(self) -> str | None:
        """The TCP mode's token (None for a Unix socket)."""
        return self._token

    @property
    def fingerprint(self) -> str | None:
        """The TCP mode's certificate fingerprint (``sha256:HEX``), which ``connect`` pins; None
        for a Unix socket, and before :meth:`start`."""
        return self._fingerprint

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
                self._engine = await _in_thread(self._engine_facts)
                if self._tcp:  # its port is published through the bridge: "network bridge not found" says it is missing
                    await _in_thread(self._docker.api.inspect_network, "bridge")
                # Others' leftovers are removed while this container starts, not before.
                reaped, started = await asyncio.gather(_in_thread(leftovers.reap, self._docker),
                                                       _in_thread(self._run_container, self._engine),
                                                       return_exceptions=True)
                for outcome in (started, reaped):
                    if isinstance(outcome, BaseException):
                        raise outcome
                self.reaped = reaped
                for gone in self.reaped:
                    log.warning("reaped sandbox container %s (%s): %s", gone.name, gone.container_id, gone.reason)
                self._backend = await self._wait_ready()
            if self.config.egress is not None:
                self._egress = await self._start_egress(self.config.egress)
            if self.config.writable_roots:
                self._watch = DiskWatch(self.config.writable_roots, self.config.limits.disk_bytes, self._stop_commands)
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

        The host-side disk watch and egress proxy stop with this object: a detached sandbox's
        writable roots keep only the per-file limit, and its commands' proxied connections wait
        for a host that dials in (the appliance's egress daemon). ``protolink-sandbox down`` removes it.
        """
        if self._state != "running" or self.address is None:
            raise RuntimeError("only a running DockerSandbox can be detached")
        self._state = "detached"
        await _uncancellable(self._teardown(remove=False))
        return self.address

    async def _start_egress(self, policy: EgressPolicy) -> EgressService:
        """The host side of egress, dialed into the relay of the server that answers now."""
        try:
            return await EgressService.start(self._host_dirs[-1], policy, sandbox=self.name,
                                             on_event=self.on_egress_event)
        except ConnectionError as error:
            raise SandboxUnavailableError(f"sandbox {self.name}: {error}") from None

    async def _teardown(self, *, remove: bool) -> None:
        if self._egress is not None:
            await self._egress.aclose()
            self._egress = None
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
            engine.remove_container(self._docker, self._container.id, volumes=True)
        except (docker.errors.DockerException, OSError) as error:  # requests' errors are OSErrors
            failure = engine_error(error, f"remove sandbox container {self.name}")
            return SandboxEngineError(f"{failure}; the reaper removes it once this process has exited or its "
                                      "expiry has passed")
        return None

    def _engine_facts(self) -> EngineFacts:
        """What the engine says about itself: its CPUs (asked once per engine) and whether the
        configuration's runtime is gVisor's; a runtime it does not have is refused."""
        runtime = self.config.runtime
        info = self._docker.info() if runtime is not None else None
        cpus = engine_cpus(self._docker, info)
        if runtime is None:
            return EngineFacts(cpus=cpus)
        runtimes = info.get("Runtimes") or {}
        if runtime not in runtimes:
            raise SandboxEngineError(f"could not start sandbox container {self.name}: {engine.no_runtime(runtime)} "
                                     f"(it has: {', '.join(sorted(runtimes)) or 'none'})")
        gvisor = os.path.basename(runtimes[runtime].get("path") or "") == "runsc"
        return EngineFacts(cpus=cpus, gvisor=gvisor)

    def _spec(self, engine_facts: EngineFacts, host: HostFacts) -> ContainerSpec:
        return container_spec(self.config, engine_facts, host)

    def _run_container(self, engine_facts: EngineFacts) -> None:
        """Create and start the container (blocking). It is recorded the moment it exists, so
        a canceled start still removes it."""
        import docker.errors

        host_dir = private_subdir(self.name)
        self._host_dirs.append(host_dir)
        if self._token is not None:
            # Read once by the server (uid 0 in the container) and deleted; commands cannot open them.
            self._fingerprint = write_secrets(host_dir, self._token, f"protolink sandbox {self.name}")
        if self.config.ca_file is not None:
            copy_ca_file(self.config.ca_file, host_dir / CA_NAME)
        host = HostFacts(channel_dir=host_dir, created=int(time.time()), seccomp_profile=seccomp_profile())
        spec = self._spec(engine_facts, host)
        try:
            container = engine.create_container(self._docker, **spec.create_kwargs())
        except docker.errors.APIError as error:
            # An engine confined to some of its CPUs refuses others ("Requested CPUs are not
            # available"): the limit falls back to a quota.
            if spec.cpuset_cpus is None or "CPUs are not available" not in str(error):
                raise
            log.warning("sandbox %s: the engine refused CPUs %s (%s); using a CPU quota instead",
                        self.name, spec.cpuset_cpus, error)
            spec = self._spec(replace(engine_facts, cpuset_allowed=False), host)
            container = engine.create_container(self._docker, **spec.create_kwargs())
        self._container = container
        try:
            container.start()
            self.address = self._published_address() if self._tcp else unix_address(host_dir)
        except BaseException:
            engine.remove_container(self._docker, container.id)
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
        """Connect once the server answers (``connect`` returns once it has answered ``Info``,
        which it does only once it serves: no health check after it); fail fast if the
        container dies."""
        from .client import connect

        assert self.address is not None
        deadline = time.monotonic() + self.start_timeout
        next_check = time.monotonic() + 0.25
        last_error: BaseException | None = None
        while time.monotonic() < deadline:
            if not socket_gone(self.address):
                try:
                    # Short attempts on fresh channels: a channel that failed once backs off for a second.
                    return await connect(self.address, token=self._token, timeout=1.0,
                                         fingerprint=self._fingerprint)
                except SandboxError as error:
                    last_error = error
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
        """The error that says the container exited while starting, with its last lines (the
        server's refusal when a protection is missing); None while it runs."""
        if self._container.status not in ("exited", "dead"):
            return None
        logs = self._container.logs(tail=20).decode("utf-8", "replace").strip()
        code = self._container.attrs["State"].get("ExitCode")
        if code == REFUSED and (missing := parse_refusal(logs)) is not None:
            found = "; ".join(f"{name} ({detail})" for name, detail in sorted(missing.items()))
            return SandboxProtectionError(f"sandbox {self.name} refused to serve, protections missing: {found}",
                                          missing=missing)
        return SandboxUnavailableError(f"sandbox container {self.name} exited (code {code}) while starting:\n" + logs)

    @property
    def disk_budget_spent(self) -> bool:
        """Whether the writable roots grew past ``disk_bytes`` and the commands were killed for it."""
        return self._disk_budget_spent

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
        self._disk_budget_spent = True
        if self._engine is None or not self._engine.gvisor:
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


def published_address(container: Any) -> str | None:
    """HOST:PORT where the engine publishes the server's TCP port of ``container`` (a docker SDK
    object, as last loaded); None when it publishes none (a Unix socket)."""
    bindings = (container.attrs["NetworkSettings"]["Ports"] or {}).get(f"{TCP_PORT}/tcp")
    if not bindings:
        return None
    host = bindings[0]["HostIp"]
    return f"{host if host not in ('', '0.0.0.0', '::') else '127.0.0.1'}:{bindings[0]['HostPort']}"


def _cgroup_pids(container: Any) -> list[int]:
    """Host pids of every process in the container, read from its pids (or unified) cgroup."""
    container.reload()
    return pids_in(container.attrs["State"]["Pid"])


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

