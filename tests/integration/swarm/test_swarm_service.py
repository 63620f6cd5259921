"""The sandbox service placing sandboxes on a real Swarm (three runc nodes, one gVisor node): a
client on the host asks the service only; the service creates a Swarm service per sandbox and
reaches its task through the node's gateway (TLS, token). A node that dies loses its sandbox,
typed and audited.

The node-loss test kills a node of the session's cluster, so it comes last in this module, and the
behaviour suites' ``swarm`` backend, which runs after it, takes a node still ready."""

from __future__ import annotations

import os
import signal
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import docker
import pytest

from protolink.errors import SandboxLostError, SandboxUnavailableError
from protolink.sandbox.config import Limits
from protolink.sandbox.leftovers import EXPIRY_LABEL, NODE_REAP_SECONDS
from protolink.sandbox.service import labels
from protolink.sandbox.service.client import connect
from protolink.sandbox.service.config import Template
from protolink.sandbox.service.process import remove_everything, start_service, stop_service
from protolink.sandbox.service.swarm import adopted_template
from tests.swarm_cluster import Node, eventually, wait_until

# Root: the cluster makes a veth pair and removes its nodes' cgroups.
pytestmark = [pytest.mark.docker, pytest.mark.root, pytest.mark.timeout(900)]
#: How long a gone sandbox's workspace volume may stay on its node: it settles for
#: WORKSPACE_SETTLE_SECONDS before a gateway's turn removes it; generous for a loaded machine.
VOLUMES_GONE_SECONDS = 300
#: The kernel gVisor's Sentry says it is (``dmesg``, which says "Starting gVisor...", is refused to
#: commands by the server's seccomp filter).
GVISOR_KERNEL = "Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016\n"


def _containers(nodes: list[Node]) -> list[str]:
    found = []
    for node in nodes:
        with closing(node.client()) as client:
            found += [f"{node.container}: {c['Names']}" for c in client.api.containers(all=True)]
    return found


def _task_of(service, sandbox_id: str) -> dict:
    """The sandbox's task, as the manager lists it."""
    with closing(service.cluster.manager.client()) as manager:
        (task,) = manager.api.tasks(filters={"service": service.swarm_service(sandbox_id)["ID"]})
    return task


def _node_of(service, sandbox_id: str) -> Node:
    """The node the sandbox's task runs on, as the manager says."""
    return service.cluster.node_of_task(_task_of(service, sandbox_id))


async def test_a_client_runs_commands_in_a_sandbox_on_a_node_and_deleting_it_leaves_nothing(swarm_service, run):
    sandbox = await swarm_service.client.create()
    node = _node_of(swarm_service, sandbox.id)
    assert node in swarm_service.cluster.nodes
    who = await run(sandbox.backend, ["/usr/bin/id", "-u"])
    held = await run(sandbox.backend, ["/bin/grep", "-E", "^(NoNewPrivs|Seccomp):", "/proc/self/status"])
    assert who.stdout == "65534\n"
    assert held.stdout.split() == ["NoNewPrivs:", "1", "Seccomp:", "2"]  # the server's own, Swarm drops both
    await sandbox.delete()
    cluster = swarm_service.cluster
    wait_until(lambda: not _containers(cluster.nodes), "every node to have no container left")
    with closing(cluster.manager.client()) as manager:
        assert manager.api.services() == []


async def test_a_managed_workspace_lives_on_the_tasks_node_takes_transfers_and_goes_with_it(
        swarm_service, run, tmp_path: Path):
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "run.sh").write_text("#!/bin/sh\necho ran > out.txt\n")
    (tmp_path / "tree" / "run.sh").chmod(0o755)
    sandbox = await swarm_service.client.create(workspace=True)
    workspace = sandbox.status.workspace
    assert workspace and not Path(workspace).exists()  # on the node, not on the host
    sent = await sandbox.upload(tmp_path / "tree", f"{workspace}/tree")
    assert sent.files == 1
    ran = await run(sandbox.backend, [f"{workspace}/tree/run.sh"], cwd=f"{workspace}/tree")
    assert ran.exit_code == 0, ran.stderr
    owner = await run(sandbox.backend, ["/usr/bin/stat", "-c", "%u %a", workspace])
    assert owner.stdout == "65534 700\n"  # the command user's, as on the host's engine
    mounted = await run(sandbox.backend, ["/bin/grep", f" {workspace} ", "/proc/self/mounts"])
    assert f"size={Limits.disk_bytes >> 10}k" in mounted.stdout  # bounded: the disk budget
    await sandbox.download(f"{workspace}/tree", tmp_path / "back")
    assert (tmp_path / "back" / "out.txt").read_text() == "ran\n"
    own = f"{swarm_service.swarm_service(sandbox.id)['Spec']['Name']}-workspace"
    node = _node_of(swarm_service, sandbox.id)
    assert f"{node.container}: {own}" in _volumes([node])  # its own, on its node
    await sandbox.delete()
    cluster = swarm_service.cluster
    wait_until(lambda: not _containers(cluster.nodes) and not _volumes(cluster.nodes),
               "every node to have no container and no volume left", timeout=VOLUMES_GONE_SECONDS)


def _volumes(nodes: list[Node]) -> list[str]:
    found = []
    for node in nodes:
        with closing(node.client()) as client:
            found += [f"{node.container}: {v['Name']}" for v in client.api.volumes()["Volumes"] or []]
    return found


async def test_a_restarted_service_adopts_its_swarm_sandboxes(swarm_service, run):
    kept = await swarm_service.client.create(labels={"job": "adopted"})
    assert (await run(kept.backend, ["/bin/sh", "-c", "echo kept > /tmp/mark"])).exit_code == 0
    await kept.backend.aclose()
    await swarm_service.stop()
    client = await swarm_service.start()
    (status,) = await client.list()
    assert (status.id, status.state, status.labels) == (kept.id, "running", {"job": "adopted"})
    again = await client.open(kept.id)
    assert (await run(again.backend, ["/bin/cat", "/tmp/mark"])).stdout == "kept\n"  # the same task
    await again.delete()


async def test_a_sandbox_whose_gateway_does_not_answer_fails_typed_and_is_reached_again_later(
        swarm_service, gateways, run):
    _, by_node = gateways
    cluster = swarm_service.cluster
    kept = await swarm_service.client.create()
    assert (await run(kept.backend, ["/bin/sh", "-c", "echo kept > /tmp/mark"])).exit_code == 0
    node = _node_of(swarm_service, kept.id)
    await kept.backend.aclose()
    await swarm_service.stop()
    cluster.stop_gateway(node)
    try:  # adopted while its gateway is down: its task runs, so it is not lost
        client = await swarm_service.start()
        assert [(status.id, status.state) for status in await client.list()] == [(kept.id, "running")]
        with pytest.raises(SandboxUnavailableError, match=f"answers at {by_node[node.container].address}") as refused:
            await client.open(kept.id)  # its first call, Info, is refused typed
        assert not isinstance(refused.value, SandboxLostError)
    finally:
        assert cluster.restart_gateway(node) == by_node[node.container]
    again = await client.open(kept.id)  # reached at this call
    assert (await run(again.backend, ["/bin/cat", "/tmp/mark"])).stdout == "kept\n"
    cluster.stop_gateway(node)  # now while the service holds a connection through it
    try:
        with pytest.raises(SandboxUnavailableError) as failed:
            await run(again.backend, ["/bin/true"])
        assert not isinstance(failed.value, SandboxLostError)
    finally:
        cluster.restart_gateway(node)
    assert (await run(again.backend, ["/bin/cat", "/tmp/mark"])).stdout == "kept\n"
    await again.delete()


async def test_a_templates_node_labels_choose_the_node_its_sandboxes_run_on(swarm_service, run):
    cluster = swarm_service.cluster
    chosen = cluster.runc_nodes[-1]
    cluster.label(chosen, {"zone": "labelled"})
    try:
        zoned = await swarm_service.client.create("zoned")
        placement = swarm_service.swarm_service(zoned.id)["Spec"]["TaskTemplate"]["Placement"]
        assert placement["Constraints"] == ["node.labels.zone==labelled", "node.labels.io.protolink.runtime!=runsc"]
        recorded = adopted_template(Template("zoned", ""), swarm_service.swarm_service(zoned.id))
        assert recorded.node_labels == (("zone", "labelled"),)  # what a restarted service reads back
        assert _node_of(swarm_service, zoned.id) == chosen
        assert (await run(zoned.backend, ["/bin/echo", "zoned"])).stdout == "zoned\n"
        await zoned.delete()
    finally:
        cluster.label(chosen, {})
    assert _swarm_services(swarm_service) == []


async def test_a_template_whose_node_labels_no_ready_node_carries_is_refused_at_once(swarm_service):
    with pytest.raises(SandboxUnavailableError, match=r"its constraints: \['node\.labels\.zone==labelled'"):
        await swarm_service.client.create("zoned")  # no node is labelled: none could ever run it
    assert _swarm_services(swarm_service) == []


async def test_a_gvisor_templates_sandbox_runs_under_gvisor_on_the_gvisor_node(swarm_service, run):
    (gvisor,) = swarm_service.cluster.gvisor_nodes
    sandbox = await swarm_service.client.create("isolated")
    placement = swarm_service.swarm_service(sandbox.id)["Spec"]["TaskTemplate"]["Placement"]
    assert placement["Constraints"] == ["node.labels.io.protolink.runtime==runsc"]
    assert _node_of(swarm_service, sandbox.id) == gvisor
    kernel = await run(sandbox.backend, ["/bin/cat", "/proc/version"])  # through the service and the node's gateway
    assert kernel.stdout == GVISOR_KERNEL != Path("/proc/version").read_text()  # gVisor's, not the host's
    assert (await run(sandbox.backend, ["/usr/bin/id", "-u"])).stdout == "65534\n"
    channel = f"{swarm_service.swarm_service(sandbox.id)['Spec']['Name']}-channel"
    assert _volumes([gvisor]) == [f"{gvisor.container}: {channel}"]  # the server's sockets, on the node
    await sandbox.delete()
    wait_until(lambda: not _containers([gvisor]) and not _volumes([gvisor]),
               "the gVisor node to have no container and no volume left", timeout=VOLUMES_GONE_SECONDS)


def _swarm_services(service) -> list[str]:
    with closing(service.cluster.manager.client()) as manager:
        return [found["Spec"]["Name"] for found in
                manager.api.services(filters={"label": f"{labels.SERVICE}={service.name}"})]


async def test_down_removes_the_swarm_services_of_a_service_that_up_started_with_a_swarm_file(swarm_service):
    await swarm_service.stop()  # the same service, now detached as `up --swarm FILE` starts it
    name, files, runtime = swarm_service.name, swarm_service.files, swarm_service.runtime
    await start_service(name, ["--config", str(runtime / "service.toml"), "--swarm", str(runtime / "swarm.toml")])
    try:
        client = await connect(files.address, files.default_token.read_text(), timeout=30.0)
        try:
            made = [(await client.create()).id, (await client.create()).id]
        finally:
            await client.aclose()
        assert sorted(found.rsplit("-", 1)[1] for found in _swarm_services(swarm_service)) == sorted(made)
    finally:
        assert await stop_service(name)
    with closing(docker.from_env()) as host:
        assert remove_everything(name, host) == 2
    assert _swarm_services(swarm_service) == [] and not files.swarm.exists()
    wait_until(lambda: not _containers(swarm_service.cluster.nodes), "every node to have no container left")


async def test_a_swarm_template_with_a_pool_serves_a_create_from_it_refills_and_a_restart_adopts_the_claim(
        swarm_service, run):
    client = await _with_pool(swarm_service)

    async def one_ready() -> bool:
        return (await client.pool_ready()).get("default") == 1

    await eventually(one_ready, "one pooled sandbox ready on the Swarm")
    (waiting,) = _swarm_services(swarm_service)
    claimed = await client.create()
    assert claimed.status.pooled and waiting.endswith(f"-{claimed.id}")
    assert _node_of(swarm_service, claimed.id) in swarm_service.cluster.nodes
    assert (await run(claimed.backend, ["/bin/sh", "-c", "echo claimed > /tmp/mark"])).exit_code == 0
    await eventually(one_ready, "the pool refilled")
    assert len(_swarm_services(swarm_service)) == 2
    await claimed.backend.aclose()
    await swarm_service.stop()  # the claim is in the Swarm service's labels: its owner survives
    owner = swarm_service.swarm_service(claimed.id)["Spec"]["Labels"][labels.TENANT]
    assert owner and _swarm_services(swarm_service) == [waiting]  # the refilled member is removed
    client = await swarm_service.start()
    (status,) = await client.list()
    assert (status.id, status.state, status.pooled) == (claimed.id, "running", True)
    again = await client.open(claimed.id)
    assert (await run(again.backend, ["/bin/cat", "/tmp/mark"])).stdout == "claimed\n"  # the same task
    await again.delete()
    await swarm_service.stop()
    cluster = swarm_service.cluster
    assert _swarm_services(swarm_service) == []
    wait_until(lambda: not _containers(cluster.nodes), "every node to have no container left")


async def test_a_pool_member_whose_task_is_lost_is_replaced_and_never_handed_out(swarm_service, run):
    client = await _with_pool(swarm_service)

    async def one_ready() -> bool:
        return (await client.pool_ready()).get("default") == 1

    await eventually(one_ready, "one pooled sandbox ready on the Swarm")
    (doomed,) = _swarm_services(swarm_service)
    doomed_id = doomed.rsplit("-", 1)[1]
    task = _task_of(swarm_service, doomed_id)
    with closing(swarm_service.cluster.node_of_task(task).client()) as node:
        node.api.remove_container(task["Status"]["ContainerStatus"]["ContainerID"], force=True)

    async def replaced() -> bool:  # gone from Swarm first: it left the pool before, so a ready member is new
        return doomed not in _swarm_services(swarm_service) and await one_ready()

    await eventually(replaced, "the lost pool member replaced")
    fresh = await client.create()
    assert fresh.status.pooled and fresh.id != doomed_id
    assert (await run(fresh.backend, ["/bin/echo", "fresh"])).stdout == "fresh\n"
    assert not [record for record in swarm_service.audit() if record["kind"] == "sandbox.lost"]  # no one held it
    await fresh.delete()


async def test_a_killed_services_pool_member_is_removed_by_its_next_run_which_adopts_the_claim(
        swarm_service, run):
    await swarm_service.stop()  # the same service, detached, to be killed
    name, runtime = swarm_service.name, swarm_service.runtime
    record = await start_service(name, ["--config", str(runtime / "service.toml"), "--swarm",
                                        str(runtime / "swarm.toml"), "--pool", "1"])
    try:
        client = await connect(swarm_service.files.address, swarm_service.files.default_token.read_text(),
                               timeout=30.0)

        async def one_ready() -> bool:
            return (await client.pool_ready()).get("default") == 1

        await eventually(one_ready, "one pooled sandbox ready on the Swarm")
        claimed = await client.create()
        await eventually(one_ready, "the pool refilled")
        wait_until(lambda: swarm_service.swarm_service(claimed.id)["Spec"]["Labels"][labels.TENANT],
                   "the claim recorded in the Swarm service's labels")
        (leftover,) = [found for found in _swarm_services(swarm_service) if not found.endswith(claimed.id)]
        await claimed.backend.aclose()
        await client.aclose()
    finally:
        os.kill(record["pid"], signal.SIGKILL)
        os.waitpid(record["pid"], 0)  # start_service's child: reaped here
    client = await _with_pool(swarm_service)
    assert leftover not in _swarm_services(swarm_service)  # removed at start, before anything is served
    assert [(status.id, status.pooled) for status in await client.list()] == [(claimed.id, True)]
    again = await client.open(claimed.id)
    assert (await run(again.backend, ["/bin/echo", "adopted"])).stdout == "adopted\n"
    await again.delete()


async def test_a_killed_services_swarm_sandboxes_outlive_their_lease_only_while_it_runs(swarm_service, run):
    await swarm_service.stop()  # the same service, detached, to be killed for good
    name, runtime = swarm_service.name, swarm_service.runtime
    leased = runtime / "leased.toml"
    leased.write_text((runtime / "swarm.toml").read_text().replace("[swarm]\n", "[swarm]\nlease_seconds = 3\n"))
    record = await start_service(name, ["--config", str(runtime / "service.toml"), "--swarm", str(leased)])
    try:
        client = await connect(swarm_service.files.address, swarm_service.files.default_token.read_text(),
                               timeout=30.0)
        sandbox = await client.create(workspace=True)

        def expiry() -> int:
            return int(swarm_service.swarm_service(sandbox.id)["Spec"]["Labels"][EXPIRY_LABEL])

        first = expiry()
        wait_until(lambda: expiry() > first + 2 * NODE_REAP_SECONDS, "the lease renewed, again and again")
        assert (await run(sandbox.backend, ["/bin/echo", "leased"])).stdout == "leased\n"  # renewed: kept
        await sandbox.backend.aclose()
        await client.aclose()
    finally:
        os.kill(record["pid"], signal.SIGKILL)
        os.waitpid(record["pid"], 0)  # start_service's child: reaped here
    nodes = swarm_service.cluster.nodes
    wait_until(lambda: not _swarm_services(swarm_service), "a manager's gateway to remove the expired Swarm service")
    wait_until(lambda: not _containers(nodes) and not _volumes(nodes),
               "every node to have no container and no volume left", timeout=VOLUMES_GONE_SECONDS)


async def _with_pool(service):
    """Start ``service`` again with a pool of one for its default template; its client."""
    await service.stop()
    templates = service.config.templates
    service.config = replace(service.config, templates={**templates, "default": replace(templates["default"], pool=1)})
    return await service.start()


async def test_a_sandbox_on_a_node_that_dies_is_lost_and_new_ones_go_to_the_nodes_left(swarm_service, run, docker_client):
    client, cluster = swarm_service.client, swarm_service.cluster
    held = [await client.create()]
    while _node_of(swarm_service, held[-1].id) == cluster.manager:  # the manager must stay: it is the only one
        held.append(await client.create())
    doomed = held[-1]
    victim = _node_of(swarm_service, doomed.id)
    assert (await run(doomed.backend, ["/bin/echo", "alive"])).stdout == "alive\n"
    docker_client.containers.get(victim.container).kill()

    async def lost() -> bool:
        return (await client.get(doomed.id)).state == "lost"

    await eventually(lost, "lost")
    with pytest.raises(SandboxLostError):
        await run(doomed.backend, ["/bin/true"])
    records = [record for record in swarm_service.audit() if record["fields"].get("sandbox") == doomed.id]
    assert [record["fields"]["node"] for record in records if record["kind"] == "sandbox.lost"] == [victim.container]
    fresh = await client.create()
    assert _node_of(swarm_service, fresh.id) != victim
    assert (await run(fresh.backend, ["/bin/echo", "fresh"])).stdout == "fresh\n"
    for sandbox in [*held, fresh]:
        await sandbox.delete()
    left = [node for node in cluster.nodes if node != victim]
    wait_until(lambda: not _containers(left), "the nodes left to have no container left")
