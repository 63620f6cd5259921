"""The sandbox service on Docker Swarm against the same service on the host's engine, and how
long a node's death takes to reach a client as a lost sandbox.

Needs root, a Docker Engine and the sandbox image (built when missing)::

    sudo .venv/bin/python bench/swarm.py [--runs 10]

It builds a three-node Swarm on this machine (``tests/swarm_cluster.py``: each node the host's own
dockerd in a container, ``--slots`` sandboxes each), starts the product's gateway on each node, and two sandbox services as ``up`` starts them (detached processes, in a
temporary runtime directory): one placing on the host's engine, one with ``--swarm FILE``. Then,
in one run:

1. create -> first command's result (``/bin/true``) -> delete, through each service, in turns:
   medians of ``--runs`` and their ratio (Swarm / local); create -> first result apart;
   then the round trip of ``/bin/true`` through each service to one sandbox each, the Swarm one on
   a worker node (not the manager), in turns: medians of ``--calls``; then
   creates from a template with a warm pool of one (each create waits until the pool is
   full again): the create alone (on Swarm: a pool member on a remote node), and -> first result;
2. a sandbox on a worker node, the node killed (its container, as a power cut): the time until
   the manager reports the node down, and until the service reports the sandbox ``lost`` to its
   client (``Get``), medians of ``--deaths`` (each kills one more worker; at most 2).

Everything is removed at the end (``down``'s own :func:`remove_everything` for each service, the
cluster by its context manager).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path

import docker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests.swarm_cluster

from protolink.errors import SandboxUnavailableError  # noqa: E402
from protolink.execution.process_types import ProcessSpec  # noqa: E402
from protolink.sandbox.provision import ensure_image  # noqa: E402
from protolink.sandbox.service.client import Sandbox, ServiceClient, connect  # noqa: E402
from protolink.sandbox.service.files import ServiceFiles  # noqa: E402
from protolink.sandbox.service.process import remove_everything, start_service, stop_service  # noqa: E402
from tests.swarm_cluster import Node, SwarmCluster, remove_orphans  # noqa: E402

TRUE = ProcessSpec(("/bin/true",), "/tmp", {"PATH": "/usr/bin:/bin"}, 30, 1 << 16)
CHECKOUT = Path(__file__).resolve().parents[1]
PREFIX = "protolink-bench-"
#: The template with a warm pool of one.
POOLED = "pooled"


class _Silent:
    async def emit(self, type: str, **data: object) -> None:
        return None


def row(label: str, *cells: str) -> None:
    print(f"{label:<52}" + "".join(f"{cell:>14}" for cell in cells), flush=True)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def ms_tenths(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


async def in_turns(clients: dict[str, ServiceClient], runs: int,
                   measure: Callable[[ServiceClient], Awaitable[tuple[float, float]]],
                   ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """``runs`` of ``measure`` on each side in turns: its two figures, each side's apart."""
    first: dict[str, list[float]] = {side: [] for side in clients}
    second: dict[str, list[float]] = {side: [] for side in clients}
    for _ in range(runs):
        for side, client in clients.items():
            one, two = await measure(client)
            first[side].append(one)
            second[side].append(two)
    return first, second


def compared(label: str, figures: dict[str, list[float]], shown: Callable[[float], str] = ms) -> None:
    """One row: each side's median and their ratio (Swarm / local)."""
    ours, theirs = statistics.median(figures["local"]), statistics.median(figures["swarm"])
    row(label, shown(ours), shown(theirs), f"{theirs / ours:.2f}x")


def load() -> str:
    return "load average: " + " ".join(f"{value:.2f}" for value in os.getloadavg())


async def lifecycle(client: ServiceClient) -> tuple[float, float]:
    """create -> first command's result, and -> deleted: seconds of each."""
    started = time.perf_counter()
    sandbox = await client.create()
    result = await sandbox.backend.execute(TRUE, _Silent())
    first = time.perf_counter() - started
    assert result.exit_code == 0, result
    await sandbox.delete()
    return first, time.perf_counter() - started


async def on_a_worker(client: ServiceClient, cluster: SwarmCluster) -> tuple[Sandbox, list[Sandbox]]:
    """A new sandbox on a node other than the manager, and those made on the manager meanwhile."""
    held = []
    while _node_of(cluster, (sandbox := await client.create()).id) == cluster.manager:
        held.append(sandbox)
    return sandbox, held


async def round_trips(sandboxes: dict[str, Sandbox], calls: int) -> dict[str, list[float]]:
    """Seconds of each ``/bin/true`` through each sandbox's backend, in turns."""
    seconds: dict[str, list[float]] = {side: [] for side in sandboxes}
    for _ in range(calls):
        for side, sandbox in sandboxes.items():
            started = time.perf_counter()
            result = await sandbox.backend.execute(TRUE, _Silent())
            seconds[side].append(time.perf_counter() - started)
            assert result.exit_code == 0, result
    return seconds


async def pooled(client: ServiceClient) -> tuple[float, float]:
    """Once template ``pooled``'s pool is full: create from it, and -> first command's result:
    seconds of each."""
    while (await client.pool_ready()).get(POOLED) != 1:
        await asyncio.sleep(0.05)
    started = time.perf_counter()
    sandbox = await client.create(POOLED)
    created = time.perf_counter() - started
    result = await sandbox.backend.execute(TRUE, _Silent())
    first = time.perf_counter() - started
    assert sandbox.status.pooled and result.exit_code == 0, (sandbox.status, result)
    await sandbox.delete()
    return created, first


async def node_death(client: ServiceClient, cluster: SwarmCluster, host: docker.DockerClient,
                     spared: set[str]) -> tuple[float, float, Node]:
    """Kill the node of a new sandbox (not the manager, nor one in ``spared``): seconds until
    the manager says the node is down, and until the client sees the sandbox lost."""
    held = []
    while True:
        sandbox = await client.create()
        held.append(sandbox)
        node = _node_of(cluster, sandbox.id)
        if node != cluster.manager and node.container not in spared:
            break
    killed = time.perf_counter()
    host.containers.get(node.container).kill()
    down = lost = 0.0
    while not (down and lost):
        if not down and _down(cluster, node):
            down = time.perf_counter() - killed
        if not lost and (await client.get(sandbox.id)).state == "lost":
            lost = time.perf_counter() - killed
        await asyncio.sleep(0.05)
    for each in held:
        await each.delete()
    return down, lost, node


def _node_of(cluster: SwarmCluster, sandbox_id: str) -> Node:
    with closing(cluster.manager.client()) as manager:
        (service,) = manager.api.services(filters={"label": f"io.protolink.service.sandbox={sandbox_id}"})
        (task,) = manager.api.tasks(filters={"service": service["ID"]})
    return cluster.node_of_task(task)


def _down(cluster: SwarmCluster, node: Node) -> bool:
    with closing(cluster.manager.client()) as manager:
        return any(found["Description"]["Hostname"] == node.container and found["Status"]["State"] != "ready"
                   for found in manager.api.nodes())


async def started(name: str, arguments: list[str]) -> ServiceClient:
    await start_service(name, arguments)
    files = ServiceFiles.of(name)
    return await connect(files.address, files.default_token.read_text(), timeout=60)


async def main(args: argparse.Namespace) -> None:
    host = docker.from_env()
    image = args.image or await asyncio.to_thread(ensure_image)
    image_id = host.images.get(image).id
    runtime = Path(tempfile.mkdtemp(prefix="pl-bsw-"))  # short: a sandbox's socket path is at most 107 bytes
    os.environ["PROTOLINK_RUNTIME_DIR"] = str(runtime)
    shared = Path(tempfile.mkdtemp(prefix="pl-bsw-roots-"))
    names = [f"{PREFIX}l{secrets.token_hex(3)}", f"{PREFIX}s{secrets.token_hex(3)}"]
    remove_orphans(host)
    try:
        built = time.perf_counter()
        with SwarmCluster(host, PREFIX, nodes=3, slots=args.slots, shared=[shared],
                          readonly=[CHECKOUT, Path(sys.base_prefix)]) as cluster:
            cluster.load_image(image)
            print(f"sandbox image {image}; {os.cpu_count()} CPUs; cluster of 3 nodes ({args.slots} slots each) "
                  f"built and loaded in {time.perf_counter() - built:.0f} s; {load()}\n")
            token = secrets.token_urlsafe(24)
            python = str(CHECKOUT / ".venv" / "bin" / "python")
            gateways = {node.container: cluster.start_gateway(node, token, python) for node in cluster.nodes}
            (runtime / "gateway-token").write_text(token)
            (runtime / "gateway-token").chmod(0o600)
            template = f'image = "{image_id}"\nttl_seconds = 0\nidle_seconds = 0\n'
            (runtime / "service.toml").write_text(f'[templates.default]\n{template}[templates.{POOLED}]\n{template}'
                                                  f'pool = 1\n')
            (runtime / "swarm.toml").write_text(
                f'[swarm]\nmanager = "unix://{cluster.manager.socket}"\n'
                f'gateway_token_file = "{runtime / "gateway-token"}"\n' +
                "".join(f'[swarm.nodes."{node}"]\ngateway = "{gateway.address}"\n'
                        f'fingerprint = "{gateway.fingerprint}"\n' for node, gateway in gateways.items()))
            config = ["--config", str(runtime / "service.toml")]
            local = await started(names[0], config)
            swarm = await started(names[1], [*config, "--swarm", str(runtime / "swarm.toml")])
            await lifecycle(local)  # each side's first: imports, connections
            await lifecycle(swarm)
            firsts, wholes = await in_turns({"local": local, "swarm": swarm}, args.runs, lifecycle)
            row("", "local", "swarm", "swarm/local")
            compared(f"1. create -> first result (median of {args.runs})", firsts)
            compared("   create -> first result -> deleted", wholes)
            remote, on_manager = await on_a_worker(swarm, cluster)
            near = await local.create()
            await round_trips({"local": near, "swarm": remote}, 10)  # each side's first calls
            trips = await round_trips({"local": near, "swarm": remote}, args.calls)
            compared(f"   round trip of /bin/true (median of {args.calls})", trips, ms_tenths)
            for sandbox in (near, remote, *on_manager):
                await sandbox.delete()
            await pooled(local)  # each side's first claim
            await pooled(swarm)
            warm, warm_firsts = await in_turns({"local": local, "swarm": swarm}, args.runs, pooled)
            compared(f"   warm create from a pool (median of {args.runs})", warm, ms_tenths)
            compared("   warm create -> first result", warm_firsts, ms_tenths)
            print(f"   warm creates on Swarm (target <= 15 ms at the median): "
                  f"{', '.join(f'{each * 1000:.1f}' for each in warm['swarm'])} ms")
            print(load())
            downs, losts, spared = [], [], set()
            for _ in range(args.deaths):
                down, lost, node = await node_death(swarm, cluster, host, spared)
                spared.add(node.container)
                downs.append(down)
                losts.append(lost)
            row(f"2. node killed -> manager says down (median of {args.deaths})", "", ms(statistics.median(downs)))
            row("   node killed -> client sees the sandbox lost", "", ms(statistics.median(losts)))
            print(f"   each: down {', '.join(map(ms, downs))}; lost {', '.join(map(ms, losts))}")
            print(load())
            for client in (local, swarm):
                await client.aclose()
            for name in names:  # as `down` does, while the cluster is up
                await stop_service(name)
                remove_everything(name, host)
    finally:
        for name in names:  # after a failure: the cluster is gone, so is every Swarm service
            await stop_service(name)
            with contextlib.suppress(SandboxUnavailableError):
                remove_everything(name, host)
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(shared, ignore_errors=True)
        host.close()


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--calls", type=int, default=200, help="round trips of /bin/true a side")
    parser.add_argument("--deaths", type=int, default=1, choices=(1, 2), help="workers killed, one after another")
    parser.add_argument("--slots", type=int, default=4, help="sandbox slots each node advertises")
    parser.add_argument("--image", default=None)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(arguments()))
