"""The behavioural suites run against every execution backend through these fixtures.

``backend`` yields an object implementing ExecutionBackend, WorkspaceBackend and
DocumentBackend. ``workspace`` is a fresh directory that the backend can see at the same
absolute path (for a sandbox: beneath a root mounted writable). ``backend_python`` is a Python
interpreter path valid where the backend runs commands.

The ``sandbox`` backend is one DockerSandbox for the whole session (its image is built first when
needed), with its workspace root mounted writable; its tests carry the ``docker`` marker.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from protolink.execution.local import LocalExecutionBackend
from protolink.sandbox import posix_acl

BACKENDS = ["local", pytest.param("sandbox", marks=pytest.mark.docker)]
SANDBOX_PYTHON = "/opt/protolink/bin/python"
# "server": the sandbox server as a subprocess on this host (no Docker), through SandboxBackend;
# it runs commands as a uid of their own, which needs root.
BACKENDS.append(pytest.param("server", marks=pytest.mark.root))
_counter = itertools.count()


def _progress(line: str) -> None:
    print(line, file=sys.__stderr__, flush=True)  # a first image build takes minutes: show it


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``contained`` check what a sandbox promises beyond the spec: descendants that
    left the command's process group or session die with it. The host backend kills the group
    only (the spec), so those tests are not collected for it."""
    dropped = [item for item in items if item.get_closest_marker("contained")
               and getattr(item, "callspec", None) is not None and item.callspec.params.get("backend_kind") == "local"]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]


@pytest.fixture(scope="session")
def workspace_root(backend_kind: str) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix=f"protolink-tests-{backend_kind}-")).resolve()
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
    if backend_kind == "sandbox":
        from protolink.sandbox.config import Identity

        return Identity.of().uid
    return None


@pytest.fixture(scope="session", params=BACKENDS)
def backend_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
async def backend(backend_kind: str, workspace_root: Path, command_uid: int | None) -> AsyncIterator[object]:
    if backend_kind == "local":
        yield LocalExecutionBackend()
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


@pytest.fixture(scope="session")
def backend_python(backend_kind: str) -> str:
    if backend_kind == "server":
        from tests.sandbox_server import HOST_PYTHON

        return HOST_PYTHON
    return sys.executable if backend_kind == "local" else SANDBOX_PYTHON
