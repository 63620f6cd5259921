"""Sandboxes as Swarm services on a real Swarm cluster (three runc nodes, one gVisor node): where
they go, how they run, what they leave. The services are made from
:func:`~protolink.sandbox.placements.swarm.service_spec`."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import docker
import pytest

from protolink.sandbox.client import connect
from protolink.sandbox.config import Lease, SandboxConfig
from protolink.sandbox.placements.swarm import PlacementFacts, SwarmFacts, service_spec
from protolink.sandbox.service.config import SwarmConfig
from protolink.sandbox.service.swarm import SwarmPlacement
from protolink.wire.roots import Root
from tests.conftest import TEST_NAME_PREFIX
from tests.swarm_cluster import Node, SwarmCluster, wait_until

# Root: the cluster makes a veth pair and removes its nodes' cgroups.
pytestmark = [pytest.mark.docker, pytest.mark.root, pytest.mark.timeout(900)]

#: The capabilities the server keeps (SETUID 7, SETGID 6, KILL 5), as /proc/PID/status prints them.
SERVER_CAPABILITIES = f"{(1 << 7) | (1 << 6) | (1 << 5):016x}"


class Services:
    """Sandbox services made on the cluster; those left are removed at the end."""

    def __init__(self, cluster: SwarmCluster, manager: docker.DockerClient, image: str) -> None:
        self.cluster, self.manager, self.image = cluster, manager, image
        self.names: list[str] = []

    def create(self, *roots: Root) -> str:
        name = f"{TEST_NAME_PREFIX}swarm-sandbox-{secrets.token_hex(4)}"
        config = SandboxConfig(roots=roots, image=self.image, name=name, lease=Lease(expiry_seconds=3600))
        cpus = min(node.attrs["Description"]["Resources"]["NanoCPUs"] for node in self.manager.nodes.list()) // 10**9
        spec = service_spec(config, SwarmFacts(node_cpus=cpus), PlacementFacts(created=int(time.time())))
        self.manager.api.create_service(**spec.create_kwargs())
        self.names.append(name)
        return name

    def remove(self, name: str) -> None:
        self.manager.api.remove_service(name)
        self.names.remove(name)

    def task(self, name: str) -> dict[str, Any]:
        """The service's one task (restart policy none: never a second), once Swarm has made it:
        a service just created may have none for a moment."""
        tasks: list[dict[str, Any]] = []

        def made() -> bool:
            tasks[:] = self.manager.api.tasks(filters={"service": name})
            return bool(tasks)

        wait_until(made, f"Swarm to make the task of {name}")
        (task,) = tasks
        return task

    def running(self, name: str) -> dict[str, Any]:
        """The service's one task, once it runs."""
        wait_until(lambda: self.task(name)["Status"]["State"] == "running", f"the task of {name} to run")
        return self.task(name)

    def container(self, name: str) -> tuple[Node, Any]:
        """The node the service's task runs on, and its container there."""
        task = self.running(name)
        node = self.cluster.node_of_task(task)
        with closing(node.client()) as client:
            return node, client.containers.get(task["Status"]["ContainerStatus"]["ContainerID"])


@pytest.fixture
def services(swarm: SwarmCluster, docker_client, sandbox_image: str) -> Iterator[Services]:
    # By ID, as docker load keeps it: a node asks no registry for an image named so.
    image = docker_client.images.get(sandbox_image).id
    with closing(swarm.manager.client()) as manager:
        made = Services(swarm, manager, image)
        try:
            yield made
        finally:
            for name in list(made.names):
                made.remove(name)
            wait_until(lambda: not _leftovers(swarm), "every node to have no container left")


def _leftovers(cluster: SwarmCluster) -> list[str]:
    """The containers and volumes on any node."""
    found = []
    for node in cluster.nodes:
        with closing(node.client()) as client:
            # One listing each, never an inspection: a container may go between the two.
            found += [f"{node.container}: container {c['Names']}" for c in client.api.containers(all=True)]
            found += [f"{node.container}: volume {v['Name']}" for v in client.api.volumes()["Volumes"] or ()]
    return found


def _exec(container: Any, *argv: str) -> str:
    code, output = container.exec_run(list(argv))
    assert code == 0, output
    return output.decode()


def test_sandboxes_spread_over_the_nodes_by_their_slots_never_on_a_gvisor_node(services):
    first = [services.create() for _ in services.cluster.runc_nodes]
    nodes = {services.running(name)["NodeID"] for name in first}
    assert len(nodes) == 3  # one slot a node: one sandbox a node
    waiting = services.create()  # no runc node has a slot left; the gVisor node's is never its
    wait_until(lambda: "insufficient resources on 3 nodes" in services.task(waiting)["Status"].get("Err", ""),
               "the fourth sandbox to wait for a slot")
    assert "scheduling constraints not satisfied on 1 node" in services.task(waiting)["Status"]["Err"]
    assert services.task(waiting)["Status"]["State"] == "pending"
    freed = services.running(first[0])["NodeID"]
    services.remove(first[0])
    assert services.running(waiting)["NodeID"] == freed


def test_a_sandbox_runs_with_the_hardening_swarm_applies(services, shared_dir: Path):
    ro, rw = shared_dir / "hardening-ro", shared_dir / "hardening-rw"
    ro.mkdir()
    rw.mkdir()
    name = services.create(Root(str(ro)), Root(str(rw), writable=True))
    node, container = services.container(name)
    status = dict(line.split(":\t", 1) for line in _exec(container, "cat", "/proc/1/status").splitlines())
    for capabilities in ("CapPrm", "CapEff", "CapBnd"):
        assert status[capabilities].strip() == SERVER_CAPABILITIES, capabilities
    assert status["CapAmb"].strip() == status["CapInh"].strip() == f"{0:016x}"
    assert status["Uid"].split() == ["0"] * 4
    assert status["Seccomp"].strip() == "2"  # Docker's default profile, not the sandbox's own
    assert status["NoNewPrivs"].strip() == "0"  # dropped by Swarm: the server sets it on what it starts
    limits = _exec(container, "cat", "/proc/1/limits")
    assert "Max open files            8192                 8192" in limits
    assert "Max core file size        0                    0" in limits
    mounts = {fields[1]: fields for fields in map(str.split, _exec(container, "cat", "/proc/mounts").splitlines())}
    assert "ro" in mounts["/"][3].split(",")
    assert "ro" in mounts[str(ro)][3].split(",") and "rw" in mounts[str(rw)][3].split(",")
    for scratch in ("/tmp", "/dev/shm", "/run/protolink"):
        assert mounts[scratch][2] == "tmpfs" and {"nosuid", "nodev", "noexec"} <= set(mounts[scratch][3].split(","))
    assert "mode=700" in mounts["/run/protolink"][3] and "size=262144k" in mounts["/tmp"][3]
    assert _exec(container, "ls", "/sys/class/net").split() == ["lo"]  # no network but loopback
    assert (node.cgroup("pids", container.id) / "pids.max").read_text().strip() == "512"
    assert (node.cgroup("memory", container.id) / "memory.limit_in_bytes").read_text().strip() == str(1 << 30)
    assert container.attrs["HostConfig"]["NanoCpus"] == 10**9
    assert container.attrs["HostConfig"]["IpcMode"] == "private"
    assert container.attrs["HostConfig"]["MemorySwap"] == 2 << 30  # Swarm's: swap up to the limit again


async def test_the_host_reaches_the_server_through_the_tasks_root(services, shared_dir: Path, run):
    rw = shared_dir / "reach-rw"
    rw.mkdir()
    rw.chmod(0o777)  # the command user writes there
    name = services.create(Root(str(rw), writable=True))
    node, container = services.container(name)
    address = f"unix:///proc/{node.host_pids(container.id)[0]}/root/run/protolink/sandbox.sock"
    backend = await connect(address, timeout=120)
    async with backend:
        assert backend.boundary == f"sandbox:{name}"
        who = await run(backend, ["/bin/sh", "-c", "id -u; echo written > written; touch /written"], cwd=str(rw))
        held = await run(backend, ["/bin/grep", "-E", "^(NoNewPrivs|Seccomp):", "/proc/self/status"], cwd=str(rw))
    assert who.stdout.split("\n")[0] == "65534"
    # Swarm dropped both (the server's own NoNewPrivs is 0 above); the server holds them itself.
    assert held.stdout.split() == ["NoNewPrivs:", "1", "Seccomp:", "2"]
    assert "Read-only file system" in who.stdout + who.stderr
    assert (rw / "written").read_text() == "written\n"


def test_removing_a_sandbox_leaves_nothing_on_any_node(services):
    name = services.create()
    services.running(name)
    assert _leftovers(services.cluster)
    services.remove(name)
    wait_until(lambda: not _leftovers(services.cluster), "every node to have no container left")
    with closing(services.cluster.manager.client()) as manager:
        assert [service.name for service in manager.services.list()] == []


async def test_one_look_at_the_tasks_finds_every_lost_sandbox(services, tmp_path: Path, caplog):
    names = [services.create() for _ in services.cluster.runc_nodes]
    tasks = {name: services.running(name)["ID"] for name in names}
    (tmp_path / "token").write_text("unused")  # no gateway is called
    placement = SwarmPlacement(SwarmConfig(f"unix://{services.cluster.manager.socket}", {}, tmp_path / "token"))
    await placement.open()
    try:
        with caplog.at_level(logging.DEBUG, logger="urllib3.connectionpool"):  # it logs every request it sends
            assert await placement.lost(tasks) == []
        asked = [record.getMessage() for record in caplog.records if " /v1." in record.getMessage()]
        assert [request for request in asked if "/tasks" in request] == [asked[-1]], asked  # one, for all three
        removed, stopped, replaced = names
        services.remove(removed)
        node, container = services.container(stopped)
        container.remove(force=True)  # behind Swarm's back, as a node's failure does
        wait_until(lambda: services.task(stopped)["Status"]["State"] != "running", "the task to stop")
        gone = await placement.lost({**tasks, replaced: "not-its-task", "no-such-service": "no-such-task"})
        assert sorted(gone) == sorted([removed, stopped, replaced, "no-such-service"])
    finally:
        await placement.close()
