"""One Swarm cluster (three runc nodes and a gVisor node) for a whole test run
(:mod:`tests.swarm_cluster`), shared by tests/integration/swarm and the behaviour suites' ``swarm``
backend; the product's gateway on each node; and a sandbox service on the host placing sandboxes
on the cluster through them.

A pytest plugin, which the conftests that need it load (:func:`load`): session-scoped fixtures of
a conftest would be made once per conftest. The cluster holds about 1.5 GB while up, so the tests
that use it run last (:func:`pytest_collection_modifyitems`): it is built for them and removed at
the end of the session."""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import protolink
from protolink.sandbox.service import labels
from protolink.sandbox.service.client import ServiceClient, connect
from protolink.sandbox.service.config import NodeGateway, ServiceConfig
from protolink.sandbox.service.daemon import serve
from protolink.sandbox.service.files import ServiceFiles
from tests.conftest import TEST_NAME_PREFIX
from tests.swarm_cluster import SwarmCluster, eventually, remove_orphans

#: This checkout (with its .venv) and its Python, which each node holds read-only to run the gateway.
CHECKOUT = Path(protolink.__file__).resolve().parents[1]

#: Sandbox slots each node advertises: one, so that where sandboxes go shows the slots at work.
SLOTS = 1
#: Nodes whose daemon's default runtime is runc, and nodes whose is gVisor's runsc (one more
#: node, not one of the three: the tests spread runc sandboxes over three nodes).
RUNC_NODES, GVISOR_NODES = 3, 1


def load(config: pytest.Config) -> None:
    """Register this plugin once (call it from a conftest's ``pytest_configure``)."""
    if not config.pluginmanager.has_plugin(__name__):
        config.pluginmanager.register(sys.modules[__name__], __name__)


def uses_swarm(item: pytest.Item) -> bool:
    """Whether ``item`` needs the cluster: it asks for it, or runs on the behaviour suites' ``swarm`` backend."""
    callspec = getattr(item, "callspec", None)
    return "swarm" in getattr(item, "fixturenames", ()) or (
        callspec is not None and callspec.params.get("backend_kind") == "swarm")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the cluster run last, those that ask for it first: the behaviour suites'
    ``swarm`` backend holds a sandbox (a node's slot) until the session ends."""
    items[:] = sorted(items, key=lambda item: (uses_swarm(item), "swarm" not in getattr(item, "fixturenames", ())))


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A host directory every node holds at the same path: where sandbox roots are made."""
    return tmp_path_factory.mktemp("swarm-roots")


@pytest.fixture(scope="session")
def swarm(docker_client, sandbox_image: str, shared_dir: Path) -> Iterator[SwarmCluster]:
    """The cluster, with this checkout's sandbox image on every node; removed at the end, as are
    the clusters of test runs that were killed."""
    remove_orphans(docker_client)
    with SwarmCluster(docker_client, TEST_NAME_PREFIX, nodes=RUNC_NODES, gvisor_nodes=GVISOR_NODES, slots=SLOTS,
                      shared=[shared_dir], readonly=[CHECKOUT, Path(sys.base_prefix)]) as cluster:
        loading = time.monotonic()
        cluster.load_image(sandbox_image)
        figures = cluster.figures
        print(f"swarm: built in {figures.build_seconds:.1f} s, joins "
              f"{', '.join(f'{s:.2f} s' for s in figures.join_seconds)}, idle nodes "
              f"{', '.join(f'{b / 2**20:.0f} MiB' for b in figures.node_memory)}, image loaded in "
              f"{time.monotonic() - loading:.1f} s", file=sys.__stderr__, flush=True)
        yield cluster


@pytest.fixture(scope="session")
def gateways(swarm: SwarmCluster) -> tuple[str, dict[str, NodeGateway]]:
    """The gateways' token, and each node's gateway by hostname (they end with the nodes)."""
    token = secrets.token_urlsafe(24)
    python = str(CHECKOUT / ".venv" / "bin" / "python")
    return token, {node.container: swarm.start_gateway(node, token, python) for node in swarm.nodes}


@dataclass
class SwarmService:
    """A sandbox service on this host placing on the cluster, run in this process: its name,
    configuration, files, the cluster, the directory of its files (``service.toml`` and
    ``swarm.toml`` among them), and a client of its default token (while it runs)."""

    name: str
    config: ServiceConfig
    files: ServiceFiles
    cluster: SwarmCluster
    runtime: Path
    client: ServiceClient | None = None
    _stop: asyncio.Event | None = None
    _serving: asyncio.Task[None] | None = None

    async def start(self) -> ServiceClient:
        self.files.pid.unlink(missing_ok=True)  # a stopped service leaves it; this process would look running
        self._stop = asyncio.Event()
        self._serving = asyncio.create_task(serve(self.name, self.config, stop=self._stop))
        await eventually(self._started, "the service started")
        self.client = await connect(self.files.address, self.files.default_token.read_text(), timeout=30.0)
        return self.client

    async def stop(self) -> None:
        """Stop it as SIGTERM does: its sandboxes stay for the next run to adopt."""
        if self.client is not None:
            await self.client.aclose()
            self.client = None
        if self._stop is not None and self._serving is not None:
            self._stop.set()
            await self._serving
            self._stop = self._serving = None
            self.files.pid.unlink()  # it names this process, which runs on: `down` would end it

    async def _started(self) -> bool:
        assert self._serving is not None
        if self._serving.done():
            self._serving.result()  # raises what stopped it
            raise AssertionError("the service ended at start")
        return self.files.pid.exists()

    def swarm_service(self, sandbox_id: str) -> dict[str, Any]:
        """The Swarm service of one sandbox, as the manager lists it."""
        with closing(self.cluster.manager.client()) as manager:
            (found,) = manager.api.services(filters={"label": f"{labels.SANDBOX}={sandbox_id}"})
        return found

    def audit(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.files.audit.read_text().splitlines()]


@asynccontextmanager
async def swarm_service(cluster: SwarmCluster, gateways: tuple[str, dict[str, NodeGateway]], image_id: str,
                        *, allowed_roots: tuple[Path, ...] = ()) -> AsyncIterator[SwarmService]:
    """A started service whose ``[swarm]`` names the cluster's manager and gateways, with templates
    ``default``, ``zoned`` (only a node labelled ``zone=labelled`` runs it) and ``isolated`` (runtime
    ``runsc``: only a gVisor node runs it) of ``image_id``;
    stopped at the end, the Swarm services it left removed. Its files are beneath a fresh
    directory, which ``PROTOLINK_RUNTIME_DIR`` names until then."""
    runtime = Path(tempfile.mkdtemp(prefix="pl-sw-"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PROTOLINK_RUNTIME_DIR", str(runtime))
        token, by_node = gateways
        (runtime / "gateway-token").write_text(token)
        (runtime / "gateway-token").chmod(0o600)
        nodes = "".join(f'[swarm.nodes."{node}"]\ngateway = "{gateway.address}"\n'
                        f'fingerprint = "{gateway.fingerprint}"\n' for node, gateway in by_node.items())
        template = f'image = "{image_id}"\nttl_seconds = 0\nidle_seconds = 0\n'
        allowed = f"allowed_roots = {json.dumps([str(root) for root in allowed_roots])}\n"
        (runtime / "service.toml").write_text(f'{allowed}[templates.default]\n{template}\n[templates.zoned]\n{template}'
                                              f'node_labels = {{ zone = "labelled" }}\n'  # only such a node runs it
                                              f'\n[templates.isolated]\n{template}runtime = "runsc"\n')
        (runtime / "swarm.toml").write_text(f'[swarm]\nmanager = "unix://{cluster.manager.socket}"\n'
                                            f'gateway_token_file = "{runtime / "gateway-token"}"\n{nodes}')
        name = f"{TEST_NAME_PREFIX}sw-{secrets.token_hex(4)}"
        config = ServiceConfig.load(runtime / "service.toml", image=image_id, swarm=runtime / "swarm.toml")
        service = SwarmService(name, config, ServiceFiles.of(name), cluster, runtime)
        try:
            await service.start()
            yield service
        finally:
            await service.stop()
            with closing(cluster.manager.client()) as manager:
                for left in manager.api.services(filters={"label": f"{labels.SERVICE}={name}"}):
                    manager.api.remove_service(left["ID"])
            shutil.rmtree(runtime, ignore_errors=True)
