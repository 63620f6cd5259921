"""A sandbox as one Kubernetes Pod and its NetworkPolicy: :func:`pod_manifest`, :func:`network_policy`.

Pure functions from a :class:`~protolink.sandbox.config.SandboxConfig`, what the cluster offers
(:class:`ClusterFacts`) and what the node prepared (:class:`NodeFacts`) to manifests as plain
dicts (``kubectl apply -f`` takes them as JSON or YAML; :func:`manifests` gives the two). The same
server as on Docker (:mod:`.server`), held the same way where Kubernetes can say it:

- the container's ``securityContext``: uid 0 with every capability dropped but
  :data:`~.server.CAPABILITIES`, ``allowPrivilegeEscalation: false`` (no_new_privs), never
  privileged, a read-only root, and the product's seccomp profile as a ``Localhost`` profile.
  The operator installs ``protolink/wire/seccomp.json`` on every node at
  ``/var/lib/kubelet/seccomp/`` + :data:`SECCOMP_PROFILE` (the kubelet's seccomp root); a Pod
  whose profile is missing does not start. ``RuntimeDefault`` is not the same rules. The
  deprecated annotation ``container.seccomp.security.alpha.kubernetes.io/sandbox`` says the same,
  for what reads only it (podman 4.3's ``kube play``); Kubernetes 1.25 and later warn about it and
  read the field;
- no service account token, no service links, no host network, PID or IPC namespace;
- memory and CPUs as requests equal to limits (the Guaranteed class: with the kubelet's static
  CPU manager a whole number of CPUs is a set of the node's CPUs, as Docker's cpuset);
- /tmp and /dev/shm as memory-backed ``emptyDir`` volumes of the configured sizes, named after
  the sandbox (:func:`scratch_volume`): podman's ``kube play`` makes a volume of each name, which
  Pods played at once would otherwise share;
- roots as ``hostPath`` directories at their own paths, read-only unless writable, and the
  node's private directory (the socket, or TCP mode's token) at :func:`~.server.channel_mount`;
- under gVisor, the RuntimeClass that runs ``runsc`` (:attr:`ClusterFacts.runtime_class`);
- a NetworkPolicy that denies every connection in and out: in TCP mode the server's port is
  open to the cluster (TLS, and the token guards it). Egress rules naming hosts cannot be expressed (a
  NetworkPolicy knows addresses only): they go through the egress relay and the host-side proxy,
  as on Docker. Network rules (``CIDR[:PORTS]``) become ``ipBlock`` rules without the networks
  the policy's address rules deny and without :attr:`ClusterFacts.cluster_networks`; those
  connections bypass the proxy, its limits and its log.

What Docker says and a Pod cannot (the node's container runtime and kubelet decide it):

- the tmpfs mount options: no inode count (``nr_inodes``: a flood of empty files fills the
  memory limit instead), no ``noexec``; swap (bounded only when the node runs without swap);
- a pids limit per Pod (the kubelet's ``podPidsLimit`` bounds every Pod alike);
- ulimits: ``RLIMIT_NOFILE``, ``RLIMIT_CORE``, ``RLIMIT_NICE``, ``RLIMIT_NPROC`` (Docker's under
  gVisor) and ``RLIMIT_FSIZE`` (the disk budget) are the runtime's defaults. The server sets
  ``no_new_privs`` and, per command, ``RLIMIT_CORE`` 0, ``RLIMIT_CPU`` and under gVisor
  ``RLIMIT_AS`` itself, on every placement; not the others yet;
- a private network namespace without interfaces: a Pod always has one, and only a network
  plugin that enforces NetworkPolicy makes it reach nothing;
- log size (the kubelet's ``containerLogMaxSize``).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import leftovers
from ..config import PublishedPort, SandboxConfig
from ..egress.policy import CidrRule
from .server import CAPABILITIES, TCP_PORT, channel_mount, server_command

#: The seccomp profile's path below the kubelet's seccomp root (``/var/lib/kubelet/seccomp``): a
#: file name alone, since podman 4.3 reads only the annotation's first path component.
SECCOMP_PROFILE = "protolink-seccomp.json"
#: The server's arguments naming what the cluster holds where the server cannot see it
#: (``--held-elsewhere``): a Pod always has a network interface (the NetworkPolicy isolates it),
#: and its pids limit is the kubelet's ``podPidsLimit``, set on the Pod's cgroup above the container's.
HELD_BY_THE_CLUSTER = ("--held-elsewhere", "network", "--held-elsewhere", "pids_limit")
#: The container's name in the Pod.
CONTAINER = "sandbox"
#: The label that names the sandbox; the NetworkPolicy selects its Pod by it.
SANDBOX_LABEL = "io.protolink.sandbox"
#: What Kubernetes accepts as a Pod's name that is also a label's value (a DNS-1123 label).
_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class ClusterFacts:
    """What the cluster offers: the seccomp profile's path on its nodes (below the kubelet's
    seccomp root), the RuntimeClass that runs the configuration's runtime (None: one of the
    runtime's own name) and whether that is gVisor's ``runsc``, and the networks of the cluster
    itself (nodes, Pods, services; CIDR text) that network egress rules never open."""

    seccomp_profile: str = SECCOMP_PROFILE
    runtime_class: str | None = None
    gvisor: bool = False
    cluster_networks: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeFacts:
    """What the node prepared for one Pod: its private directory (only the host user can open it;
    it gets the server's socket, or TCP mode's token and TLS pair), the time it is created (Unix seconds, for
    its annotations), and the node's name (None: wherever the scheduler puts it, then the
    directory must exist on every node)."""

    channel_dir: Path
    created: int
    node: str | None = None


def manifests(config: SandboxConfig, cluster: ClusterFacts, node: NodeFacts) -> list[dict[str, Any]]:
    """The Pod and its NetworkPolicy, in the order to apply them (the policy first)."""
    return [network_policy(config, cluster), pod_manifest(config, cluster, node)]


def pod_manifest(config: SandboxConfig, cluster: ClusterFacts, node: NodeFacts) -> dict[str, Any]:
    """The Pod that runs ``config`` on a cluster of ``cluster`` with what ``node`` prepared; a
    configuration with a CA file is refused (its copy is made on the Docker placement's host)."""
    _check_name(config)
    if config.ca_file is not None:
        raise ValueError("kubernetes placement: ca_file is not placed (the Docker placement's host makes its copy)")
    profile = {"type": "Localhost", "localhostProfile": cluster.seccomp_profile}
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": config.image,
        "args": [*server_command(config, gvisor=cluster.gvisor), *HELD_BY_THE_CLUSTER],
        "securityContext": {
            "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False, "privileged": False,
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": list(CAPABILITIES)}, "seccompProfile": profile,
        },
        "resources": {"requests": _resources(config), "limits": _resources(config)},
        "volumeMounts": _volume_mounts(config),
    }
    if isinstance(config.network, PublishedPort):
        port: dict[str, Any] = {"name": "server", "containerPort": TCP_PORT, "protocol": "TCP"}
        if config.network.port:
            port |= {"hostPort": config.network.port, "hostIP": config.network.host}
        container["ports"] = [port]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostname": "sandbox",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False, "hostPID": False, "hostIPC": False,
        "containers": [container],
        "volumes": _volumes(config, node.channel_dir),
    }
    if config.runtime is not None:
        spec["runtimeClassName"] = cluster.runtime_class or config.runtime
    if node.node is not None:
        spec["nodeName"] = node.node
    annotations = leftovers.labels(config.lease.owner, config.lease.session, config.lease.expiry_seconds,
                                   [node.channel_dir], now=node.created)
    annotations[f"container.seccomp.security.alpha.kubernetes.io/{CONTAINER}"] = f"localhost/{cluster.seccomp_profile}"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": config.name, "labels": {SANDBOX_LABEL: config.name}, "annotations": annotations},
            "spec": spec}


def network_policy(config: SandboxConfig, cluster: ClusterFacts) -> dict[str, Any]:
    """The NetworkPolicy of ``config``'s Pod: nothing in but TCP mode's port, nothing out but
    the egress policy's network rules (see the module)."""
    _check_name(config)
    ingress = [{"ports": [{"protocol": "TCP", "port": TCP_PORT}]}] if isinstance(config.network, PublishedPort) else []
    rules = config.egress.allow if config.egress is not None else ()
    denied = (*(config.egress.addresses.denied_networks() if config.egress is not None else ()),
              *map(ipaddress.ip_network, cluster.cluster_networks))
    egress = [rule for rule in (_egress_rule(cidr, denied) for cidr in rules if isinstance(cidr, CidrRule)) if rule]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": config.name, "labels": {SANDBOX_LABEL: config.name}},
            "spec": {"podSelector": {"matchLabels": {SANDBOX_LABEL: config.name}},
                     "policyTypes": ["Ingress", "Egress"], "ingress": ingress, "egress": egress}}


def cpu_quantity(cpus: float) -> str:
    """``cpus`` as a Kubernetes quantity: whole CPUs as a number, a fraction in millicpus (at least 1m)."""
    return str(int(cpus)) if float(cpus).is_integer() else f"{max(1, round(cpus * 1000))}m"


def scratch_volume(sandbox: str, purpose: str) -> str:
    """The name of sandbox ``sandbox``'s ``purpose`` (``tmp``, ``shm``) ``emptyDir``, its own: the
    start of the sandbox's name and a digest of all of it, a DNS-1123 label."""
    digest = hashlib.sha256(sandbox.encode()).hexdigest()[:8]
    return f"{sandbox[:40]}-{digest}-{purpose}"


def _check_name(config: SandboxConfig) -> None:
    if _DNS_LABEL.fullmatch(config.name) is None:
        raise ValueError(f"sandbox config: name must be at most 63 lower-case letters, digits and '-', a letter or "
                         f"digit at both ends, for a Kubernetes Pod and its label, got {config.name!r}")


def _resources(config: SandboxConfig) -> dict[str, str]:
    return {"memory": str(config.limits.memory), "cpu": cpu_quantity(config.limits.cpus)}


def _volume_mounts(config: SandboxConfig) -> list[dict[str, Any]]:
    roots = [{"name": f"root-{index}", "mountPath": root.path, "readOnly": not root.writable}
             for index, root in enumerate(config.roots)]
    # /tmp before the roots: a root below it (a test's directory) stays visible.
    return [{"name": scratch_volume(config.name, "tmp"), "mountPath": "/tmp"},
            {"name": scratch_volume(config.name, "shm"), "mountPath": "/dev/shm"}, *roots,
            {"name": "channel", "mountPath": channel_mount(config)}]


def _volumes(config: SandboxConfig, channel_dir: Path) -> list[dict[str, Any]]:
    roots = [{"name": f"root-{index}", "hostPath": {"path": root.path, "type": "Directory"}}
             for index, root in enumerate(config.roots)]
    return [*roots, {"name": "channel", "hostPath": {"path": str(channel_dir), "type": "Directory"}},
            *({"name": scratch_volume(config.name, purpose), "emptyDir": {"medium": "Memory", "sizeLimit": str(size)}}
              for purpose, size in (("tmp", config.limits.tmpfs_bytes), ("shm", config.limits.shm_bytes)))]


def _egress_rule(rule: CidrRule, denied: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
                 ) -> dict[str, Any] | None:
    """``rule`` as a NetworkPolicy egress rule without the ``denied`` networks; None when they cover it."""
    network = rule.network
    inside = [other for other in denied if other.version == network.version and other.overlaps(network)]
    if any(network.subnet_of(other) for other in inside):  # type: ignore[arg-type]
        return None
    block: dict[str, Any] = {"cidr": str(network)}
    if inside:
        block["except"] = [str(other) for other in inside]
    return {"to": [{"ipBlock": block}], "ports": [{"protocol": "TCP", "port": port} for port in sorted(rule.ports)]}
