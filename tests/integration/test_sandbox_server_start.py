"""What the real sandbox server loads: its start and a first command load no document
extractor, no OpenSSL, ``shutil`` or ``platform`` (a cold sandbox's first command waits for the
start), and the image's interpreter starts without setuptools' hook; file, document and upload
calls load what they need at their first call and work as a cold sandbox's first call.

A server on this host (:mod:`tests.sandbox_server`) runs with Python's import log
(``PYTHONPROFILEIMPORTTIME``) on its stderr, which names every module as it loads; a
``DockerSandbox`` of this checkout's image runs the calls where its workers drop their ids.
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
from protolink.sandbox import SandboxBackend
from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.transfer import upload
from tests.sandbox_server import RunningServer, sandbox_server

#: Modules of document extraction alone: none is needed to listen or to run a command.
DOCUMENT_MODULES = {"protolink.execution.documents", "protolink.execution.extract", "zipfile", "csv"}
#: What the server's start does without: OpenSSL (asyncio loads with ``ssl`` blocked, whose
#: attempt the log still names), ``shutil`` with its compressors (argparse's terminal width)
#: ``platform`` (the seccomp filter's machine name) and ``secrets`` with ``random`` (the command
#: channel's keys come from ``os.urandom``).
NOT_AT_START = {"_ssl", "shutil", "bz2", "lzma", "platform", "secrets", "random"}


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


@pytest.mark.root
async def test_the_start_and_a_first_command_load_only_what_they_use(server: RunningServer, root: Path):
    result = await server.backend.execute(ProcessSpec(("/bin/true",), str(root), {"PATH": "/usr/bin:/bin"}, 30, 1024),
                                          Silent())
    assert result.exit_code == 0
    modules = loaded(server)
    assert "protolink_sandboxd.server" in modules and "asyncio" in modules  # the log is there
    assert not modules & DOCUMENT_MODULES and not modules & NOT_AT_START


@pytest.mark.docker
def test_the_images_interpreter_starts_without_pip_or_setuptools(docker_client, sandbox_image: str):
    found = docker_client.containers.run(
        sandbox_image, ["-I", "-c", "import importlib.util as u, sys; print(sorted(sys.modules)); "
                                    "print([m for m in ('pip', 'setuptools', 'pkg_resources') if u.find_spec(m)])"],
        entrypoint=["/opt/protolink/bin/python"], network_mode="none", remove=True).decode().splitlines()
    assert "_distutils_hack" not in found[0]  # setuptools' .pth hook, run at every start
    assert found[1] == "[]"


@pytest.mark.root
async def test_file_and_document_operations_work_after_a_cold_start(server: RunningServer, root: Path):
    listing = await server.backend.list_files(str(root), roots=[str(root)], pattern="*", recursive=False,
                                              max_results=10)
    assert [entry.path for entry in listing.items] == [str(root / "notes.csv")]
    assert "protolink.wire.operations" in loaded(server)  # loaded by the server, before it forked a worker

    extraction = await server.backend.read_document(str(root / "notes.csv"), roots=[str(root)],
                                                    limits=DocumentLimits())
    assert [section.cells for section in extraction.sections] == [("name", "count"), ("alpha", "1")]


async def _listing(backend: SandboxBackend, root: Path) -> None:
    listing = await backend.list_files(str(root), roots=[str(root)], pattern="*.csv", recursive=False, max_results=10)
    assert [entry.path for entry in listing.items] == [str(root / "notes.csv")]


async def _document(backend: SandboxBackend, root: Path) -> None:
    extraction = await backend.read_document(str(root / "notes.csv"), roots=[str(root)], limits=DocumentLimits())
    assert extraction.sections[1].cells == ("alpha", "1")


async def _upload(backend: SandboxBackend, root: Path) -> None:
    source = Path(tempfile.mkdtemp(prefix="protolink-upload-")) / "sent.txt"
    source.write_text("sent\n")
    try:
        await upload(backend, source, str(root / "sent.txt"))
    finally:
        shutil.rmtree(source.parent)
    assert (root / "sent.txt").read_text() == "sent\n"


CALLS = {"listing": _listing, "document": _document, "upload": _upload}


@pytest.mark.docker
@pytest.mark.parametrize("first", list(CALLS))
async def test_each_kind_of_call_works_as_a_cold_sandboxs_first(sandbox_image: str, root: Path, first: str):
    root.chmod(0o777)  # the command user (nobody) writes the upload
    async with DockerSandbox(writable=[root], image=sandbox_image) as backend:
        order = [first, *(name for name in CALLS if name != first)]
        for name in order:
            await CALLS[name](backend, root)
