"""The real sandbox server (``python -m protolink_sandboxd``) as a subprocess on this host, for tests.

Tests run as root, so the server can drop commands and workers to a uid of their own. Each
server gets a uid that no account and no process uses: the server kills every process of its
command uid that it does not account for, and must never meet anyone else's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from protolink.sandbox import SandboxBackend, connect

#: Where commands find a Python interpreter they may run (the test venv may live under /root).
HOST_PYTHON = "/usr/bin/python3"
_FIRST_TEST_UID = 61000
_PROJECT = Path(__file__).resolve().parent.parent
#: The command spawner compiled for this host (the image carries its own).
SPAWNER_PROGRAM = _PROJECT / "build" / "protolink-spawner"


@functools.cache
def spawner_program() -> str:
    """The compiled spawner for servers run on this host, (re)built when its source changed."""
    subprocess.run(["bash", str(_PROJECT / "scripts" / "build-spawner.sh"), str(SPAWNER_PROGRAM)], check=True)
    return str(SPAWNER_PROGRAM)


@dataclass
class RunningServer:
    process: asyncio.subprocess.Process
    address: str
    uid: int
    backend: SandboxBackend
    log: Path

    def processes_of_uid(self) -> list[int]:
        """Pids of every live (non-zombie) process with the command uid as file-system uid on this machine."""
        return [pid for pid, (uid, state) in _processes().items() if uid == self.uid and state != "Z"]


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (file-system uid, state letter) of every process that can be read (helpers have other real
    and effective uids)."""
    found = {}
    for name in os.listdir("/proc"):
        try:
            status = Path(f"/proc/{name}/status").read_text() if name.isdigit() else ""
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if "Uid" in fields:
            found[int(name)] = (int(fields["Uid"].split()[3]), fields["State"].split()[0])
    return found


def unused_uid() -> int:
    """A uid with no account and no process, unique to this test process."""
    taken = {uid for uid, _ in _processes().values()}
    uid = _FIRST_TEST_UID + os.getpid() % 2000
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            if uid not in taken:
                return uid
        uid += 1


@contextlib.asynccontextmanager
async def sandbox_server(
    roots: Sequence[tuple[Path, bool]], *, uid: int | None = None, args: Sequence[str] = (),
    token: str | None = None, listen: str | None = None, fingerprint: str | None = None,
) -> AsyncIterator[RunningServer]:
    """Start a server over ``roots`` ((path, writable) pairs), on a Unix socket unless ``listen``
    says otherwise (TLS over TCP: the ``fingerprint`` its certificate has); stop it after, and
    kill whatever its command uid left behind."""
    uid = unused_uid() if uid is None else uid
    home = Path(tempfile.mkdtemp(prefix="protolink-sandbox-server-"))
    listen = listen or f"unix://{home / 'sandbox.sock'}"
    address = listen.removeprefix("tcp://")
    log = home / "server.log"
    command = [sys.executable, "-m", "protolink_sandboxd", "--listen", listen, "--boundary", "test-host",
               "--command-uid", str(uid), "--command-gid", str(uid), "--spawner-program", spawner_program(),
               "--serve-unprotected", *args]
    for path, writable in roots:
        command += ["--root", f"{path}:{'rw' if writable else 'ro'}"]
    with open(log, "wb") as log_file:
        process = await asyncio.create_subprocess_exec(*command, stdout=log_file, stderr=log_file, cwd="/")
    try:
        backend = await connect(address, token=token, timeout=30, fingerprint=fingerprint)
        try:
            yield RunningServer(process, address, uid, backend, log)
        finally:
            await backend.aclose()
    finally:
        await stop(process)
        for pid, (owner, _) in _processes().items():
            if owner == uid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(home, ignore_errors=True)


async def stop(process: asyncio.subprocess.Process) -> None:
    """SIGTERM the server, then SIGKILL it if it has not exited within a generous bound."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await process.wait()
