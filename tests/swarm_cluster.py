"""A Docker Swarm cluster of real engines on this machine, for tests and ``bench/swarm.py``.

:class:`SwarmCluster` runs each node's ``dockerd`` in a container of the host engine:

- the image is made here (``docker import`` of a few directories and of symlinks into /usr;
  nothing is pulled) and the host's /usr is mounted read-only, so a node runs the host's own
  dockerd, containerd and runc;
- not ``--privileged`` (this machine refuses it) but every capability except SYS_RESOURCE,
  seccomp, AppArmor and system paths unconfined, a device cgroup rule for every device, the
  host's cgroup tree with a cgroup parent of the node's own, and a private data root
  (:data:`DATA_ROOT_OPTIONS`);
- one network for all nodes: macvlan on one end of a veth pair made for it (the host engine's
  ``FORWARD DROP`` blocks traffic between other bridges; Swarm's virtual IPs need IPVS, which
  this kernel lacks, so tasks are reached by their own addresses); the other end holds the
  network's gateway address, so the host reaches the nodes as a service's machine would;
- ``readonly`` host directories at their own paths on every node: this checkout and its Python,
  so that a node runs the product's gateway (:meth:`start_gateway`);
- each daemon runs with ``--bridge none`` (a task without networks gets only ``lo``) and
  advertises :data:`~protolink.sandbox.placements.swarm.SLOT_RESOURCE` slots; node 1 is the
  manager, the others join it as workers; the host reaches each engine on a Unix socket in a host
  directory (:meth:`Node.client`);
- ``gvisor_nodes`` more workers whose daemon's default runtime is the host's ``runsc``
  (:data:`GVISOR_DAEMON`), labelled ``io.protolink.runtime=runsc`` as an operator labels them: only
  sandboxes configured with that runtime go there.

The host's own engine never enters swarm mode and its configuration is not changed. Everything
made (containers, network, veth pair, image, cgroups, work directory) carries the cluster's
labels or name and is removed by :meth:`close` (:func:`remove_cluster`), also when a step of
:meth:`start` fails; :func:`remove_orphans` removes the clusters of killed runs. Images reach
the nodes by ``docker save | docker load`` (:meth:`load_image`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors

from protolink.sandbox.leftovers import owner_gone, process_owner
from protolink.sandbox.placements.swarm import GVISOR_RUNTIME, RUNTIME_LABEL, SLOT_RESOURCE
from protolink.sandbox.service.config import NodeGateway
from protolink.sandbox.service.tls import CERTIFICATE_FILE
from protolink.sandbox.tls import fingerprint_of

T = TypeVar("T")
#: How long a node's engine may take to answer, and the cluster to see every node ready: hang
#: guards for a loaded machine, not expectations.
READY_TIMEOUT_SECONDS = 120
POLL_SECONDS = 0.05
#: Where a node's engine listens for the host, inside the node (a host directory is mounted there).
NODE_SOCKET_DIR = "/run/protolink-node"
#: The port a node's gateway listens on, at the node's address.
GATEWAY_PORT = 7443
SWARM_PORT = 2377
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: Labels on what a cluster makes on the host engine: its name, and the process that made it.
CLUSTER_LABEL = "io.protolink.swarm"
OWNER_LABEL = "io.protolink.swarm.owner"
#: A node's data root: a tmpfs of its own (overlay2 works on it, unlike on the node's overlay
#: root), gone with the node: removing a data root of extracted images from disk took 40 s.
DATA_ROOT_OPTIONS = "size=4g,mode=0711,exec,dev,suid"
#: A gVisor node's daemon configuration: the host's ``runsc`` as its default runtime, with the
#: arguments the host's engine gives it (scripts/gvisor-up.sh): only ``lo`` in the sandbox, and
#: the server's sockets made on the node (where its gateway reaches them).
GVISOR_PROGRAM = "/usr/bin/runsc"
GVISOR_DAEMON = {"runtimes": {GVISOR_RUNTIME: {"path": GVISOR_PROGRAM,
                                               "runtimeArgs": ["--network=none", "--host-uds=create"]}},
                 "default-runtime": GVISOR_RUNTIME}


@dataclass(frozen=True)
class Node:
    """One node: its container on the host engine, its address on the cluster's network, and the
    host path of its engine's socket."""

    container: str
    address: str
    socket: Path
    cgroup_parent: str
    gvisor: bool = False

    @property
    def labels(self) -> dict[str, str]:
        """The node labels it always carries: a gVisor node's runtime."""
        return {RUNTIME_LABEL: GVISOR_RUNTIME} if self.gvisor else {}

    def client(self, timeout: int = 60) -> docker.DockerClient:
        """A docker SDK client of this node's engine."""
        return docker.DockerClient(base_url=f"unix://{self.socket}", timeout=timeout)

    def cgroup(self, controller: str, container_id: str) -> Path:
        """The host path of a container's cgroup on this node, in ``controller`` (cgroup v1) or
        the one hierarchy (v2)."""
        hierarchy = CGROUP_ROOT / controller if (CGROUP_ROOT / controller).is_dir() else CGROUP_ROOT
        return hierarchy / self.cgroup_parent.lstrip("/") / container_id

    @property
    def files(self) -> Path:
        """The host directory the node holds at :data:`NODE_SOCKET_DIR` (its engine's socket, its
        gateway's token, state and log)."""
        return self.socket.parent

    def host_pids(self, container_id: str) -> list[int]:
        """The host's pids of a container's processes on this node (its ``/proc/PID/root`` is the
        container's root: how a gateway reaches the server's socket)."""
        return [int(pid) for pid in (self.cgroup("pids", container_id) / "cgroup.procs").read_text().split()]


@dataclass
class Figures:
    """What building the cluster took: seconds in all, seconds each worker's join took, and each
    node's memory (bytes, page cache left out) once the swarm formed."""

    build_seconds: float = 0.0
    join_seconds: list[float] = field(default_factory=list)
    node_memory: list[int] = field(default_factory=list)


class SwarmCluster:
    """``with SwarmCluster(host_client, prefix) as cluster:`` a swarm of ``nodes`` engines and
    ``gvisor_nodes`` more whose default runtime is ``runsc``, each advertising ``slots`` sandbox
    slots; ``shared`` host directories appear at their own paths on every node (a sandbox's
    roots). Names start with ``prefix``."""

    def __init__(self, host: docker.DockerClient, prefix: str, *, nodes: int = 3, gvisor_nodes: int = 0,
                 slots: int = 2, shared: Iterable[Path] = (), readonly: Iterable[Path] = ()) -> None:
        self.host = host
        self.name = f"{prefix}swarm-{secrets.token_hex(3)}"
        self.size = nodes + gvisor_nodes
        self.gvisor_size = gvisor_nodes
        self.slots = slots
        self.shared = tuple(shared)
        self.readonly = tuple(readonly)
        self.nodes: list[Node] = []
        self.figures = Figures()
        self._labels = {CLUSTER_LABEL: self.name, OWNER_LABEL: process_owner()}
        self._workdir: Path | None = None
        self._gateways: dict[str, tuple[str, str, str]] = {}  # each node's gateway: its exec's id, token, python

    def __enter__(self) -> SwarmCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def manager(self) -> Node:
        return self.nodes[0]

    @property
    def runc_nodes(self) -> list[Node]:
        """The nodes whose daemon's default runtime is runc: those sandboxes without a runtime go to."""
        return [node for node in self.nodes if not node.gvisor]

    @property
    def gvisor_nodes(self) -> list[Node]:
        """The nodes whose daemon's default runtime is ``runsc``, labelled for it."""
        return [node for node in self.nodes if node.gvisor]

    def start(self) -> None:
        """Make the image, the network and the nodes; form the swarm."""
        if self.gvisor_size and not Path(GVISOR_PROGRAM).is_file():
            # A node's dockerd refuses to start without its default runtime's program.
            raise RuntimeError(f"the gVisor nodes run this host's {GVISOR_PROGRAM}, which is missing: `make gvisor`")
        started = time.monotonic()
        self._workdir = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        image = self._image()
        network = self._network()
        for index in range(1, self.size + 1):
            self.nodes.append(self._node(index, image, network, gvisor=index > self.size - self.gvisor_size))
        for node in self.nodes:
            wait_until(lambda node=node: _answers(node), f"the engine of {node.container}")
        manager = self.manager.client()
        try:
            manager.swarm.init(advertise_addr=self.manager.address, listen_addr=f"0.0.0.0:{SWARM_PORT}")
            token = manager.swarm.attrs["JoinTokens"]["Worker"]
            for node in self.nodes[1:]:
                joined = time.monotonic()
                with closing(node.client()) as worker:
                    worker.swarm.join(remote_addrs=[f"{self.manager.address}:{SWARM_PORT}"], join_token=token,
                                      advertise_addr=node.address, listen_addr=f"0.0.0.0:{SWARM_PORT}")
                self.figures.join_seconds.append(time.monotonic() - joined)
            wait_until(lambda: _ready_nodes(manager) == self.size, f"{self.size} ready nodes in {self.name}")
        finally:
            manager.close()
        for node in self.gvisor_nodes:
            self.label(node, {})
        self.figures.build_seconds = time.monotonic() - started
        self.figures.node_memory = [self._memory(node) for node in self.nodes]

    def close(self) -> None:
        """Remove everything :meth:`start` made (:func:`remove_cluster`)."""
        self.nodes.clear()
        remove_cluster(self.host, self.name)

    def load_image(self, image: str) -> None:
        """``docker save`` of the host's ``image``, loaded on every node at once."""
        assert self._workdir is not None
        archive = self._workdir / "image.tar"
        with archive.open("wb") as out:
            for chunk in self.host.images.get(image).save(named=True):
                out.write(chunk)
        failures: list[BaseException] = []

        def load(node: Node) -> None:
            try:
                with closing(node.client(timeout=600)) as client, archive.open("rb") as data:
                    client.api.load_image(data)
            except BaseException as error:  # noqa: BLE001 - reported below
                failures.append(error)

        threads = [threading.Thread(target=load, args=(node,)) for node in self.nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        archive.unlink()
        if failures:
            raise failures[0]

    def start_gateway(self, node: Node, token: str, python: str) -> NodeGateway:
        """Run the product's gateway on ``node`` (as root in the node, with ``python``, which must
        be on a ``readonly`` path) taking ``token``; once it answers, its address and fingerprint.
        It ends with the node."""
        (node.files / "gateway-token").write_text(token)
        (node.files / "gateway-token").chmod(0o600)
        inside = f"{NODE_SOCKET_DIR}/gateway"
        command = (f"exec {python} -m protolink.sandbox.gateway --listen {node.address}:{GATEWAY_PORT} "
                   f"--token-file {NODE_SOCKET_DIR}/gateway-token --state-dir {inside} "
                   f"> {NODE_SOCKET_DIR}/gateway.log 2>&1")
        run = self.host.api.exec_create(node.container, ["/bin/sh", "-c", command],
                                        environment={"PYTHONDONTWRITEBYTECODE": "1"})
        self.host.api.exec_start(run["Id"], detach=True)
        self._gateways[node.container] = (run["Id"], token, python)
        certificate = node.files / "gateway" / CERTIFICATE_FILE
        wait_until(lambda: certificate.exists() and _listens(node.address, GATEWAY_PORT),
                   f"the gateway of {node.container} (log: {node.files / 'gateway.log'})")
        return NodeGateway(f"{node.address}:{GATEWAY_PORT}", fingerprint_of(certificate.read_bytes()))

    def stop_gateway(self, node: Node) -> None:
        """Kill the gateway :meth:`start_gateway` started on ``node`` (by its process id) and wait
        until its port is closed; :meth:`restart_gateway` starts it again."""
        pid = self.host.api.exec_inspect(self._gateways[node.container][0])["Pid"]
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not _listens(node.address, GATEWAY_PORT), f"the gateway of {node.container} to end")

    def restart_gateway(self, node: Node) -> NodeGateway:
        """Start ``node``'s gateway again as it was started: same token, same certificate."""
        _, token, python = self._gateways[node.container]
        return self.start_gateway(node, token, python)

    def label(self, node: Node, labels: dict[str, str]) -> None:
        """Give ``node`` exactly its own labels (:attr:`Node.labels`) and ``labels``
        (``docker node update --label-add``)."""
        with closing(self.manager.client()) as manager:
            found = next(each for each in manager.api.nodes() if each["Description"]["Hostname"] == node.container)
            manager.api.update_node(found["ID"], found["Version"]["Index"],
                                    {**found["Spec"], "Labels": {**labels, **node.labels}})

    def ready_workers(self) -> list[Node]:
        """The runc nodes other than the manager that the manager sees ready (a killed one is down)."""
        with closing(self.manager.client()) as manager:
            ready = {each["Description"]["Hostname"] for each in manager.api.nodes()
                     if each["Status"]["State"] == "ready"}
        return [node for node in self.runc_nodes[1:] if node.container in ready]

    def node_of_task(self, task: dict[str, Any]) -> Node:
        """The node a task (as the manager lists it) runs on."""
        with closing(self.manager.client()) as manager:
            hostname = manager.nodes.get(task["NodeID"]).attrs["Description"]["Hostname"]
        return next(node for node in self.nodes if node.container == hostname)

    def _image(self) -> str:
        labels = " ".join(f'{key}="{value}"' for key, value in self._labels.items())
        self.host.api.import_image_from_data(_node_filesystem(), repository=self.name, tag="node",
                                             changes=[f"LABEL {labels}"])
        return f"{self.name}:node"

    def _network(self) -> str:
        veth = _veth(self.name)
        subprocess.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth[:-1]}b"], check=True)
        for end in (veth, f"{veth[:-1]}b"):
            subprocess.run(["ip", "link", "set", end, "up"], check=True)
        network = self.host.networks.create(self.name, driver="macvlan", options={"parent": veth},
                                            labels=self._labels)
        network.reload()
        (ipam,) = network.attrs["IPAM"]["Config"]
        prefix = ipam["Subnet"].split("/")[1]
        subprocess.run(["ip", "addr", "add", f"{ipam['Gateway']}/{prefix}", "dev", f"{veth[:-1]}b"], check=True)
        return network.name

    def _node(self, index: int, image: str, network: str, *, gvisor: bool) -> Node:
        assert self._workdir is not None
        name = f"{self.name}-{index}"
        sockets = self._workdir / f"socket-{index}"
        sockets.mkdir()
        daemon = sockets / "daemon.json"
        daemon.write_text(json.dumps(GVISOR_DAEMON if gvisor else {}))
        cgroup_parent = f"/{name}"
        binds = {"/usr": "/usr:ro", str(CGROUP_ROOT): f"{CGROUP_ROOT}:rw", str(sockets): f"{NODE_SOCKET_DIR}:rw", **{str(path): f"{path}:rw" for path in self.shared},
                 **{str(path): f"{path}:ro" for path in self.readonly}}
        host_config = self.host.api.create_host_config(
            binds=[f"{source}:{target}" for source, target in binds.items()],
            cap_add=["ALL"], cap_drop=["SYS_RESOURCE"], security_opt=["seccomp=unconfined", "apparmor=unconfined"],
            device_cgroup_rules=["a *:* rwm"], tmpfs={"/run": "", "/var/lib/docker": DATA_ROOT_OPTIONS}, network_mode=network)
        host_config |= {"MaskedPaths": [], "ReadonlyPaths": []}  # systempaths=unconfined; the SDK has no keyword
        created = self.host.api.create_container(
            image, name=name, hostname=name, host_config=host_config, labels=self._labels,
            command=["dockerd", "--host", "unix:///var/run/docker.sock", "--host",
                     f"unix://{NODE_SOCKET_DIR}/docker.sock", "--bridge", "none", "--cgroup-parent", cgroup_parent,
                     "--node-generic-resource", f"{SLOT_RESOURCE}={self.slots}",
                     "--config-file", f"{NODE_SOCKET_DIR}/{daemon.name}"])
        container = self.host.containers.get(created["Id"])
        container.start()
        container.reload()
        address = container.attrs["NetworkSettings"]["Networks"][network]["IPAddress"]
        return Node(name, address, sockets / "docker.sock", cgroup_parent, gvisor)

    def _memory(self, node: Node) -> int:
        stats = self.host.api.stats(node.container, stream=False)["memory_stats"]
        return stats["usage"] - stats.get("stats", {}).get("cache", 0)


def remove_cluster(host: docker.DockerClient, name: str) -> None:
    """Remove what the cluster ``name`` made, whatever of it exists: node containers (every process
    of a node's pid namespace ends with it), their cgroups, the network, the veth pair, the image
    and the work directory. Every step runs even if one fails; then the first failure is raised."""
    errors: list[Exception] = []

    def attempt(step: Callable[[], object]) -> None:
        try:
            step()
        except docker.errors.NotFound:
            pass
        except Exception as error:  # noqa: BLE001 - the rest must still be removed
            errors.append(error)

    by_label = {"label": f"{CLUSTER_LABEL}={name}"}
    for container in host.api.containers(all=True, filters=by_label):
        attempt(lambda container=container: host.api.remove_container(container["Id"], force=True))
    for hierarchy in (CGROUP_ROOT, *(path for path in CGROUP_ROOT.iterdir() if path.is_dir())):
        for parent in hierarchy.glob(f"{name}-*"):
            attempt(lambda parent=parent: _remove_cgroup_tree(parent))
    for network in host.api.networks(filters=by_label):
        attempt(lambda network=network: host.api.remove_network(network["Id"]))
    if (Path("/sys/class/net") / _veth(name)).exists():
        attempt(lambda: subprocess.run(["ip", "link", "del", _veth(name)], check=True))
    for image in host.api.images(filters=by_label):
        attempt(lambda image=image: host.api.remove_image(image["Id"], force=True))
    for workdir in Path(tempfile.gettempdir()).glob(f"{name}-*"):
        attempt(lambda workdir=workdir: shutil.rmtree(workdir))
    if errors:
        raise errors[0]


def remove_orphans(host: docker.DockerClient) -> list[str]:
    """Remove the clusters whose owner process is gone (a test run that was killed); their names."""
    owners: dict[str, str] = {}
    for found in (*host.api.containers(all=True, filters={"label": CLUSTER_LABEL}),
                  *host.api.networks(filters={"label": CLUSTER_LABEL}),
                  *host.api.images(filters={"label": CLUSTER_LABEL})):
        labels = found.get("Labels") or {}
        owners[labels[CLUSTER_LABEL]] = labels.get(OWNER_LABEL, "")
    orphans = sorted(name for name, owner in owners.items() if owner_gone(owner))
    for name in orphans:
        remove_cluster(host, name)
    return orphans


def _veth(name: str) -> str:
    """The host end of the cluster's veth pair (at most 15 characters; the other ends in ``b``)."""
    return f"plk{name[-6:]}a"


def _node_filesystem() -> bytes:
    """A tar of a node's root: empty directories, and links into /usr (mounted from the host)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name in ("usr", "etc", "etc/alternatives", "var", "var/run", "var/lib", "var/lib/docker", "run",
                     "proc", "sys", "dev", "root", "tmp"):
            entry = tarfile.TarInfo(name)
            entry.type, entry.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(entry)
        links = {name: f"usr/{name}" for name in ("bin", "sbin", "lib", "lib64")}
        alternatives = Path("/etc/alternatives")
        links |= {f"etc/alternatives/{item.name}": os.readlink(item) for item in alternatives.iterdir()
                  if item.is_symlink()}
        for name, target in links.items():
            entry = tarfile.TarInfo(name)
            entry.type, entry.linkname = tarfile.SYMTYPE, target
            tar.addfile(entry)
        for name, text in (("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"), ("etc/group", b"root:x:0:\n")):
            entry = tarfile.TarInfo(name)
            entry.size, entry.mode = len(text), 0o644
            tar.addfile(entry, io.BytesIO(text))
    return out.getvalue()


def _listens(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=5):
            return True
    except OSError:
        return False


def _answers(node: Node) -> bool:
    if not node.socket.exists():
        return False
    try:
        with closing(node.client(timeout=5)) as client:
            return client.ping()
    except (docker.errors.DockerException, OSError):
        return False


def _ready_nodes(manager: docker.DockerClient) -> int:
    return sum(node.attrs["Status"]["State"] == "ready" for node in manager.nodes.list())


def wait_until(done: Callable[[], bool], what: str, timeout: float = READY_TIMEOUT_SECONDS) -> None:
    """Return once ``done()``; TimeoutError naming ``what`` after ``timeout`` seconds (a hang guard)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {what}")
        time.sleep(POLL_SECONDS)


async def eventually(check: Callable[[], Awaitable[T]], what: str, timeout: float = READY_TIMEOUT_SECONDS) -> T:
    """:func:`wait_until` for an async ``check``; returns what it answered."""
    deadline = time.monotonic() + timeout
    while not (found := await check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {what}")
        await asyncio.sleep(POLL_SECONDS)
    return found


def _remove_cgroup_tree(top: Path) -> None:
    """Remove a node's cgroup parent, deepest first (empty once the node's processes are gone)."""
    for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        wait_until(lambda path=path: _rmdir(path), f"the empty cgroup {path}")
    wait_until(lambda: _rmdir(top), f"the empty cgroup {top}")


def _rmdir(path: Path) -> bool:
    """Remove a cgroup; False while it is busy (the last processes of a killed node still exiting)."""
    try:
        path.rmdir()
    except OSError as error:
        if error.errno != errno.EBUSY:
            raise
        return False
    return True
