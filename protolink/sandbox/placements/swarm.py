"""A sandbox as one Docker Swarm service: :func:`service_spec`.

A pure function from a :class:`~protolink.sandbox.config.SandboxConfig`, what the cluster's
nodes report (:class:`SwarmFacts`) and what the service decided for this sandbox
(:class:`PlacementFacts`) to the keywords of the docker SDK's low-level
``APIClient.create_service`` (:class:`ServiceSpec`; the high-level ``services.create`` cannot
express ulimits or a pids limit). It reuses :mod:`.server`'s and :mod:`.docker`'s rules, so a
sandbox is the same on both engines as far as Swarm (API 1.41, Docker 20.10) lets it be:

- one replica, restart policy ``none``: a task that is lost (its node left, the server died) is
  never recreated with its state gone; the service reports it lost;
- the image's server as uid 0 with every capability dropped but :data:`~.server.CAPABILITIES`, a
  read-only root, the image's own init (tini, so Swarm's ``init`` is off), no environment;
- /tmp and /dev/shm as tmpfs of the configured sizes (Docker mounts them ``noexec,nosuid,nodev``);
  the server's socket directory :data:`~.server.SOCKET_DIR` as an owner-only tmpfs of the
  task's own: a node's gateway reaches the socket through the task's root
  (``/proc/PID/root/run/protolink/sandbox.sock``), so nothing is made on the node beforehand
  and nothing is left there afterwards;
- the pids limit, ulimits, CPU quota and log options of :mod:`.docker`; memory as limit and
  reservation (the scheduler never overcommits a node's memory); one generic resource
  :data:`SLOT_RESOURCE` per sandbox, so a node takes as many sandboxes as it advertises slots;
- roots bind-mounted at their own paths on the node, read-only unless writable (the node must
  hold them at the same paths); the managed workspace (:attr:`PlacementFacts.workspace`), a
  writable root besides them: a volume of the sandbox's own on its node, a tmpfs of
  ``disk_bytes`` owned by the command user (:func:`workspace_mount`; a service's own tmpfs
  mounts are ``noexec`` and root's);
- placement constraints: the node labels of the sandbox's template, and for a configured
  runtime ``node.labels.io.protolink.runtime==RUNTIME`` (a service cannot pick a runtime: the
  nodes whose daemon's default runtime it is carry the label); without one
  ``node.labels.io.protolink.runtime!=runsc``, which keeps it off gVisor nodes (a node without
  the label satisfies it);
- on a gVisor node (:attr:`SwarmFacts.gvisor`) the socket directory is a volume of the task's own
  (:func:`channel_mount`), not a tmpfs: gVisor keeps a tmpfs inside its sandbox, and the
  container's ``State.Pid`` is gVisor's, whose root is not the task's; the daemon's ``runsc``
  runs with ``--host-uds=create``, so the server's sockets are the node's, in that volume;
- no network attachment: Swarm refuses ``network none`` ("network none not found"), so the
  task joins its node's default bridge, and sandbox nodes run their daemon with
  ``"bridge": "none"``, which leaves the task only ``lo``. Only :class:`NoNetwork` is placed;
  TCP mode (:class:`~protolink.sandbox.config.PublishedPort`) needs a network and is refused, and
  so is a CA file (``ca_file``), whose copy only the Docker placement makes;
- the labels of :func:`~protolink.sandbox.leftovers.labels`, and the placement's own, on the
  service and on its container.

What Swarm drops of the Docker placement's protections, since a service spec cannot carry them
on this API: the seccomp profile and ``no-new-privileges`` (the task gets Docker's default
profile and NoNewPrivs 0; the server applies its own seccomp filter and ``no_new_privs`` to what
it starts, and refuses to serve without them), a swap limit (Docker's default applies: swap up
to the memory limit again), a cpuset (a CPU quota only, see :func:`~.docker.cpu_limit`), the
tmpfs entry counts (``nr_inodes``: a tmpfs is bounded in bytes only) and ``ipc_mode`` (the
daemon's default, ``private`` unless a node says otherwise). ``oom_score_adj``, refused below
API 1.46, is not set by the Docker placement either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from docker.types import (
    ContainerSpec,
    DriverConfig,
    Mount,
    Placement,
    Resources,
    RestartPolicy,
    ServiceMode,
    TaskTemplate,
)

from .. import leftovers
from ..config import MiB, NoNetwork, SandboxConfig
from .docker import LOG_DRIVER, LOG_OPTIONS, EngineFacts, cpu_limit, pids_limit, root_mounts, ulimits
from .server import CAPABILITIES, SOCKET_DIR, server_command

#: The generic resource a node advertises per sandbox it may run
#: (``dockerd --node-generic-resource protolink-slot=N``); each sandbox reserves one.
SLOT_RESOURCE = "protolink-slot"
#: The node label naming the default runtime of a node's daemon, which a service cannot choose.
RUNTIME_LABEL = "io.protolink.runtime"
#: gVisor's runtime: only sandboxes configured with it run on nodes labelled with it.
GVISOR_RUNTIME = "runsc"
#: The size of the task's own socket directory.
CHANNEL_BYTES = 1 * MiB


@dataclass(frozen=True)
class SwarmFacts:
    """What the nodes that may run the sandbox report, as far as the service depends on it: the
    fewest CPUs of such a node (``NCPU``), and whether their default runtime is gVisor's ``runsc``."""

    node_cpus: int
    gvisor: bool = False


@dataclass(frozen=True)
class PlacementFacts:
    """What the service decided for one sandbox: the time it is created (Unix seconds, for its
    labels), the node labels its template requires, labels of its own for the service and its
    container (what a restarted service adopts it by), and the path of its managed workspace (a
    writable root of the task beside the config's, made on its node: nothing is at that path on
    the service's host; empty: none)."""

    created: int
    node_labels: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    workspace: str = ""


@dataclass(frozen=True)
class ServiceSpec:
    """The parts of one sandbox's service, named as in the API; :meth:`create_kwargs`."""

    name: str
    labels: Mapping[str, str]
    container: ContainerSpec
    resources: Resources
    placement: Placement
    restart_policy: RestartPolicy
    log_driver: DriverConfig
    mode: ServiceMode

    def create_kwargs(self) -> dict[str, Any]:
        """The keywords for the docker SDK's ``APIClient.create_service``."""
        task = TaskTemplate(self.container, resources=self.resources, restart_policy=self.restart_policy,
                            placement=self.placement, log_driver=self.log_driver)
        return {"task_template": task, "name": self.name, "labels": dict(self.labels), "mode": self.mode}


def service_spec(config: SandboxConfig, swarm: SwarmFacts, placement: PlacementFacts) -> ServiceSpec:
    """The service that runs ``config`` on the nodes ``swarm`` describes, as ``placement`` decided."""
    if not isinstance(config.network, NoNetwork):
        raise ValueError(f"swarm placement: network must be NoNetwork (a task has no network), got {config.network!r}")
    if config.ca_file is not None:
        raise ValueError("swarm placement: ca_file is not placed (the Docker placement's host makes its copy)")
    if placement.workspace and (not placement.workspace.startswith("/")
                                or any(root.path == placement.workspace for root in config.roots)):
        raise ValueError(f"swarm placement: the workspace {placement.workspace} must be an absolute path "
                         f"that is not one of the roots")
    engine = EngineFacts(cpus=swarm.node_cpus, gvisor=swarm.gvisor, cpuset_allowed=False)
    labels = {**placement.labels, **leftovers.labels(config.lease.owner, config.lease.session,
                                                     config.lease.expiry_seconds, [], now=placement.created)}
    return ServiceSpec(
        name=config.name,
        labels=labels,
        container=_container(config, engine, labels, placement.workspace),
        resources=_resources(config, engine),
        placement=Placement(constraints=constraints(config, placement.node_labels)),
        restart_policy=RestartPolicy(condition="none"),
        log_driver=DriverConfig(LOG_DRIVER, dict(LOG_OPTIONS)),
        mode=ServiceMode("replicated", replicas=1),
    )


def constraints(config: SandboxConfig, node_labels: Mapping[str, str]) -> list[str]:
    """The nodes that may run ``config``, as placement constraints: those carrying its
    :func:`wanted_labels` and none of its :func:`avoided_labels`."""
    return [*(f"node.labels.{key}=={value}" for key, value in sorted(wanted_labels(config, node_labels).items())),
            *(f"node.labels.{key}!={value}" for key, value in sorted(avoided_labels(config).items()))]


def wanted_labels(config: SandboxConfig, node_labels: Mapping[str, str]) -> dict[str, str]:
    """The labels a node needs to run ``config``: ``node_labels``, and its runtime's label."""
    wanted = dict(node_labels)
    if config.runtime is not None:
        wanted[RUNTIME_LABEL] = config.runtime
    return wanted


def avoided_labels(config: SandboxConfig) -> dict[str, str]:
    """The labels a node must not carry to run ``config``: gVisor's runtime label when ``config``
    names no runtime (a node daemon's default runtime is its own: runc's sandboxes never land on
    a gVisor node)."""
    return {RUNTIME_LABEL: GVISOR_RUNTIME} if config.runtime is None else {}


def hosting_cpus(nodes: Iterable[Mapping[str, Any]], config: SandboxConfig,
                 node_labels: Mapping[str, str]) -> int | None:
    """The fewest CPUs of a node in ``nodes`` (a manager's node listing) that may take
    ``config``'s task now: ready, active, and satisfying its :func:`constraints`; None when
    none may. Only those count: a node the constraints exclude never runs it."""
    wanted, avoided = wanted_labels(config, node_labels).items(), avoided_labels(config).items()
    cpus = [node["Description"]["Resources"]["NanoCPUs"] // 10**9 for node in nodes
            if node["Status"]["State"] == "ready" and node["Spec"].get("Availability") == "active"
            and wanted <= (labels := (node["Spec"].get("Labels") or {}).items()) and not avoided & labels]
    return min(cpus, default=None)


def workspace_mount(config: SandboxConfig, path: str) -> Mount:
    """The managed workspace at ``path``: the volume ``NAME-workspace`` of the local driver on the
    task's node, a tmpfs of ``disk_bytes`` owned by the command user (mode 0700), labelled
    :data:`~..leftovers.WORKSPACE_LABEL` for the node's gateway to remove once no container uses it
    (:func:`~..leftovers.reap_workspaces`). Its files count against the sandbox's memory too."""
    identity = config.identity
    options = f"size={config.limits.disk_bytes},uid={identity.uid},gid={identity.gid},mode=0700,nosuid,nodev"
    return _node_tmpfs(path, config, "workspace", options)


def channel_mount(config: SandboxConfig) -> Mount:
    """The server's socket directory on a gVisor node: the volume ``NAME-channel`` of the local
    driver on the task's node, a root-only tmpfs of :data:`CHANNEL_BYTES`, labelled as a
    workspace (:data:`~..leftovers.WORKSPACE_LABEL`) for the node's gateway to remove once no
    container uses it. The node's gateway reaches the server's socket at the volume's source."""
    return _node_tmpfs(SOCKET_DIR, config, "channel", f"size={CHANNEL_BYTES},mode=0700,nosuid,nodev,noexec")


def _node_tmpfs(path: str, config: SandboxConfig, part: str, options: str) -> Mount:
    """The volume ``NAME-PART`` of the local driver on the task's node at ``path``: a tmpfs mounted
    with ``options``, labelled for the node's gateway to remove once no container uses it."""
    return Mount(path, f"{config.name}-{part}", type="volume", labels={leftovers.WORKSPACE_LABEL: config.name},
                 driver_config=DriverConfig("local", {"type": "tmpfs", "device": "tmpfs", "o": options}))


def _container(config: SandboxConfig, engine: EngineFacts, labels: Mapping[str, str], workspace: str) -> ContainerSpec:
    limits = config.limits
    spec = ContainerSpec(
        config.image,
        args=[*server_command(config, gvisor=engine.gvisor), *(["--root", f"{workspace}:rw"] if workspace else [])],
        hostname="sandbox",
        user="0:0",
        labels=dict(labels),
        mounts=[*root_mounts(config), *([workspace_mount(config, workspace)] if workspace else []),
                channel_mount(config) if engine.gvisor else _tmpfs(SOCKET_DIR, CHANNEL_BYTES, 0o700),
                _tmpfs("/tmp", limits.tmpfs_bytes, 0o1777), _tmpfs("/dev/shm", limits.shm_bytes, 0o1777)],
        read_only=True,
        init=False,
        cap_drop=["ALL"],
        cap_add=list(CAPABILITIES),
    )
    # API 1.41; the SDK has no keyword
    spec["Ulimits"] = [dict(ulimit) for ulimit in ulimits(config, engine, more_writable=bool(workspace))]
    return spec


def _resources(config: SandboxConfig, engine: EngineFacts) -> Resources:
    limits = config.limits
    resources = Resources(cpu_limit=cpu_limit(limits.cpus, engine.cpus, config.name, cpuset=False).get("nano_cpus"),
                          mem_limit=limits.memory, mem_reservation=limits.memory,
                          generic_resources={SLOT_RESOURCE: 1})
    resources["Limits"]["Pids"] = pids_limit(config, engine)  # API 1.41; the SDK has no keyword
    return resources


def _tmpfs(target: str, size: int, mode: int) -> Mount:
    return Mount(target, None, type="tmpfs", tmpfs_size=size, tmpfs_mode=mode)
