"""The behavioural suites run against every execution backend through these fixtures.

``backend`` yields an object implementing ExecutionBackend, WorkspaceBackend and
DocumentBackend. ``workspace`` is a fresh directory that the backend can see at the same
absolute path (for a sandbox: beneath a root mounted writable). ``backend_python`` is a Python
interpreter path valid where the backend runs commands.
"""

from __future__ import annotations

import itertools
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from protolink.execution.local import LocalExecutionBackend

BACKENDS = ["local"]
_counter = itertools.count()


@pytest.fixture(scope="session")
def workspace_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="protolink-tests-")).resolve()
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def workspace(workspace_root: Path) -> Path:
    path = workspace_root / f"ws-{next(_counter)}"
    path.mkdir()
    return path


@pytest.fixture(scope="session", params=BACKENDS)
def backend_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def backend(backend_kind: str) -> LocalExecutionBackend:
    return LocalExecutionBackend()


@pytest.fixture(scope="session")
def backend_python(backend_kind: str) -> str:
    return sys.executable
