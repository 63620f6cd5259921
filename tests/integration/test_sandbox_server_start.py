"""What the real sandbox server loads: its start and a first command load no document
extractor (a cold sandbox's first command waits for the start); file and document operations
load what they need at their first call and work after a cold start.

The server runs on this host as a subprocess (:mod:`tests.sandbox_server`) with Python's import
log (``PYTHONPROFILEIMPORTTIME``) on its stderr, which names every module as it loads.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from protolink.execution.documents import DocumentLimits
from protolink.execution.process_types import ProcessSpec
from tests.sandbox_server import RunningServer, sandbox_server

pytestmark = pytest.mark.root

#: Modules of document extraction alone: none is needed to listen or to run a command.
DOCUMENT_MODULES = {"protolink.execution.documents", "protolink.execution.extract", "zipfile", "csv"}


class Silent:
    async def emit(self, type: str, **data: Any) -> None:
        return None


@pytest.fixture
def root() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="protolink-sandbox-start-test-")).resolve()
    base.chmod(0o755)  # the command user must reach the root (pytest's own tmp dirs are private)
    (base / "notes.csv").write_text("name,count\nalpha,1\n")
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
async def server(root: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[RunningServer]:
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # the server inherits it (workers started with exec do not)
    async with sandbox_server([(root, True)]) as running:
        yield running


def loaded(server: RunningServer) -> set[str]:
    """Every module the server's log says was imported so far."""
    lines = server.log.read_text(errors="replace").splitlines()
    return {line.rpartition("|")[2].strip() for line in lines if line.startswith("import time:")}


async def test_the_start_and_a_first_command_load_no_document_extractor(server: RunningServer, root: Path):
    result = await server.backend.execute(ProcessSpec(("/bin/true",), str(root), {"PATH": "/usr/bin:/bin"}, 30, 1024),
                                          Silent())
    assert result.exit_code == 0
    modules = loaded(server)
    assert "protolink_sandboxd.server" in modules  # the log is there
    assert not modules & DOCUMENT_MODULES


async def test_file_and_document_operations_work_after_a_cold_start(server: RunningServer, root: Path):
    listing = await server.backend.list_files(str(root), roots=[str(root)], pattern="*", recursive=False,
                                              max_results=10)
    assert [entry.path for entry in listing.items] == [str(root / "notes.csv")]
    assert "protolink.wire.operations" in loaded(server)  # loaded by the server, before it forked a worker

    extraction = await server.backend.read_document(str(root / "notes.csv"), roots=[str(root)],
                                                    limits=DocumentLimits())
    assert [section.cells for section in extraction.sections] == [("name", "count"), ("alpha", "1")]
