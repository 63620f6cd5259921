"""Workers forked from the server's process when a call needs one, and retired when idle."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from protolink_sandboxd.worker_pool import WorkerPool

from protolink.wire._pb import workspace_pb2
from tests.sandbox_server import unused_uid

pytestmark = pytest.mark.root  # a worker takes the command uid as its file-system uid


@pytest.fixture
def directory() -> Iterator[Path]:
    """A directory the command user may list (pytest's own tmp dirs are private)."""
    made = Path(tempfile.mkdtemp(prefix="protolink-worker-pool-test-")).resolve()
    made.chmod(0o755)
    (made / "a.txt").write_text("a")
    yield made
    shutil.rmtree(made, ignore_errors=True)


def listing(directory: Path) -> bytes:
    return workspace_pb2.ListFilesRequest(path=str(directory), roots=[str(directory)], pattern="*",
                                          max_results=10).SerializeToString()


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_a_call_forks_a_worker_and_an_idle_one_is_retired(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in a fresh interpreter, as the sandbox's server is: this process, late in the suite,
    holds the threads and state of thousands of tests, none of which a server has. Like the
    server's ``__main__``, the interpreter turns gRPC's fork handlers off before it loads gRPC."""
    monkeypatch.setenv("GRPC_ENABLE_FORK_SUPPORT", "false")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as fresh:
        fresh.submit(_run, str(directory)).result(timeout=120)


def _run(directory: str) -> None:
    asyncio.run(_forks_and_retires(Path(directory)))


def test_a_worker_starting_as_the_pool_closes_is_killed_and_reaped(
        directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Closed once the worker is forked and before its pipes are connected (the server stops
    as the first call starts one): no worker is left running, nor unreaped."""
    monkeypatch.setenv("GRPC_ENABLE_FORK_SUPPORT", "false")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as fresh:
        fresh.submit(_run_closing, str(directory)).result(timeout=120)


def _run_closing(directory: str) -> None:
    asyncio.run(_closes_as_a_worker_starts(Path(directory)))


async def _forks_and_retires(directory: Path) -> None:
    uid = unused_uid()
    pool = WorkerPool(uid=uid, gid=uid, memory_bytes=1 << 30, max_workers=2, max_message_bytes=1 << 20)
    try:
        assert pool.pids == []
        reply = workspace_pb2.ListFilesResponse.FromString(
            await pool.call("ListFiles", listing(directory), seconds=60, what="a listing"))
        assert [Path(entry.path).name for entry in reply.items] == ["a.txt"]
        [first] = pool.pids
        assert parent(first) == os.getpid()  # forked from this process

        await pool.retire_idle()
        assert pool.pids == [] and not exists(first)  # killed and reaped

        await pool.call("ListFiles", listing(directory), seconds=60, what="a listing")
        assert len(pool.pids) == 1 and pool.pids != [first]
    finally:
        await pool.aclose()


async def _closes_as_a_worker_starts(directory: Path) -> None:
    uid = unused_uid()
    pool = WorkerPool(uid=uid, gid=uid, memory_bytes=1 << 30, max_workers=2, max_message_bytes=1 << 20)
    calling = asyncio.ensure_future(pool.call("ListFiles", listing(directory), seconds=60, what="a listing"))
    while not (forked := children()):
        await asyncio.sleep(0)  # a turn of the event loop at a time: connecting its pipes takes two
    calling.cancel()  # the call is abandoned, and starts no other worker
    await pool.aclose()
    await asyncio.gather(calling, return_exceptions=True)
    assert pool.pids == [] and not any(exists(pid) for pid in forked)  # killed and reaped


def children() -> list[int]:
    """The processes whose parent is this one."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and parent(int(entry.name)) == os.getpid():
                found.append(int(entry.name))
        except OSError:  # gone meanwhile
            pass
    return found
