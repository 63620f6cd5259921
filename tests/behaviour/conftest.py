"""The behavioural suites run against every execution backend through these fixtures.

``backend`` yields an object implementing ExecutionBackend, WorkspaceBackend and
DocumentBackend. ``workspace`` is a fresh directory that the backend can see at the same
absolute path (for a sandbox: beneath a root mounted writable). ``backend_python`` is a Python
interpreter path valid where the backend runs commands.

The ``sandbox`` backend is one DockerSandbox for the whole session (its image is built first when
needed), with its workspace root mounted writable; its tests carry the ``docker`` marker.

The ``swarm`` backend is a sandbox that a sandbox service on this host created on a node of the
session's Swarm cluster other than the manager (:mod:`tests.swarm_fixtures`): a client on the host
runs the calls in a sandbox on another machine. Its workspace root is beneath a host directory
every node holds at the same path. Only the shell, git and file suites run on it (what issue 18
asks a remote sandbox to do); its tests carry the ``docker`` and ``root`` markers (the cluster
makes a veth pair and cgroups) and run last, once, on one cluster.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, closing
from pathlib import Path

import pytest

from protolink.execution.local import LocalExecutionBackend
from protolink.sandbox import posix_acl
from tests import swarm_fixtures

BACKENDS = ["local", pytest.param("sandbox", marks=pytest.mark.docker)]
SANDBOX_PYTHON = "/opt/protolink/bin/python"
# "server": the sandbox server as a subprocess on this host (no Docker), through SandboxBackend;
# it runs commands as a uid of their own, which needs root.
BACKENDS.append(pytest.param("server", marks=pytest.mark.root))
BACKENDS.append(pytest.param("swarm", marks=[pytest.mark.docker, pytest.mark.root, pytest.mark.timeout(900)]))
#: The suites the ``swarm`` backend runs: the shell, git and file calls.
SWARM_MODULES = {"test_shell.py", "test_git.py", "test_filesystem.py"}
_counter = itertools.count()


def _progress(line: str) -> None:
    print(line, file=sys.__stderr__, flush=True)  # a first image build takes minutes: show it


def pytest_configure(config: pytest.Config) -> None:
    swarm_fixtures.load(config)


def _kind(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else callspec.params.get("backend_kind")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``contained`` check what a sandbox promises beyond the spec: descendants that
    left the command's process group or session die with it. The host backend kills the group
    only (the spec), so those tests are not collected for it. The ``swarm`` backend runs the
    shell, git and file suites only (:data:`SWARM_MODULES`): the others are the sandbox's, which
    the ``sandbox`` backend runs on this host's engine."""
    dropped = [item for item in items if (item.get_closest_marker("contained") and _kind(item) == "local")
               or (_kind(item) == "swarm" and item.path.name not in SWARM_MODULES)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]


@pytest.fixture(scope="session")
def workspace_root(backend_kind: str, request: pytest.FixtureRequest) -> Iterator[Path]:
    # On Swarm: beneath the directory every node holds at the same path.
    under = request.getfixturevalue("shared_dir") if backend_kind == "swarm" else None
    root = Path(tempfile.mkdtemp(prefix=f"protolink-tests-{backend_kind}-", dir=under)).resolve()
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def workspace(workspace_root: Path, command_uid: int | None) -> Path:
    path = workspace_root / f"ws-{next(_counter)}"
    path.mkdir()
    if command_uid is not None:
        os.chown(path, command_uid, command_uid)  # a user's workspace is the user's (git checks)
    return path


@pytest.fixture(scope="session")
def command_uid(backend_kind: str) -> int | None:
    """The uid the backend runs commands as, when it differs from the test process's."""
    if backend_kind == "server":
        from tests.sandbox_server import unused_uid

        return unused_uid()
    if backend_kind in ("sandbox", "swarm"):
        from protolink.sandbox.config import Identity

        return Identity.of().uid
    return None


@pytest.fixture(scope="session", params=BACKENDS)
def backend_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
async def backend(backend_kind: str, workspace_root: Path, command_uid: int | None,
                  request: pytest.FixtureRequest) -> AsyncIterator[object]:
    if backend_kind == "local":
        yield LocalExecutionBackend()
        return
    if backend_kind == "swarm":
        assert command_uid is not None
        posix_acl.grant(str(workspace_root), {command_uid: 7})
        async with _swarm_sandbox(request, workspace_root) as sandbox_backend:
            yield sandbox_backend
        return
    if backend_kind == "server":
        from tests.sandbox_server import sandbox_server

        assert command_uid is not None
        posix_acl.grant(str(workspace_root), {command_uid: 7})
        async with sandbox_server([(workspace_root, True)], uid=command_uid) as server:
            yield server.backend
        return
    from protolink.sandbox.docker import DockerSandbox
    from protolink.sandbox.provision import ensure_image

    assert command_uid is not None
    image = await asyncio.to_thread(ensure_image, progress=_progress)
    # The test process (root) makes the files; the sandbox's commands (another uid) must be
    # able to change them, as a user's own files would be.
    posix_acl.grant(str(workspace_root), {command_uid: 7})
    async with DockerSandbox(writable=[workspace_root], image=image, command_uid=command_uid) as sandbox_backend:
        yield sandbox_backend


@asynccontextmanager
async def _swarm_sandbox(request: pytest.FixtureRequest, workspace_root: Path) -> AsyncIterator[object]:
    """The backend of a sandbox on a worker of the session's cluster (its template's node labels
    choose it), created through a service on this host, ``workspace_root`` mounted writable."""
    from protolink.wire.roots import Root

    cluster = request.getfixturevalue("swarm")
    image_id = request.getfixturevalue("docker_client").images.get(request.getfixturevalue("sandbox_image")).id
    remote = cluster.ready_workers()[0]
    cluster.label(remote, {"zone": "labelled"})
    try:
        async with swarm_fixtures.swarm_service(cluster, request.getfixturevalue("gateways"), image_id,
                                                allowed_roots=(workspace_root,)) as service:
            assert service.client is not None
            sandbox = await service.client.create("zoned", roots=[Root(str(workspace_root), writable=True)])
            try:
                with closing(cluster.manager.client()) as manager:
                    (task,) = manager.api.tasks(filters={"service": service.swarm_service(sandbox.id)["ID"]})
                assert cluster.node_of_task(task) == remote  # another machine than the manager
                yield sandbox.backend
            finally:
                await sandbox.delete()
    finally:
        cluster.label(remote, {})


@pytest.fixture(scope="session")
def backend_python(backend_kind: str) -> str:
    if backend_kind == "server":
        from tests.sandbox_server import HOST_PYTHON

        return HOST_PYTHON
    return sys.executable if backend_kind == "local" else SANDBOX_PYTHON  # sandbox and swarm: the image's
