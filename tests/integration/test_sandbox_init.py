"""In the sandbox image the server runs right under tini, the container's init: no reaper process
of its own (a Python process less per sandbox), and what commands orphan is still reaped."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from protolink.execution.process_types import ProcessSpec
from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.usage import pids_in
from tests.integration.test_sandbox_server import settle

pytestmark = pytest.mark.docker

ENV = {"PATH": "/usr/bin:/bin"}
#: Orphans a child that outlives the command (its keeper goes with the command, so the child
#: is reparented to the container's init, killed as a stray, and must be reaped there).
ORPHANING = "setsid sleep 30 >/dev/null 2>&1 & echo started"


class Silent:
    async def emit(self, type: str, **data: Any) -> None:
        return None


def stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of host process ``pid``; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0], int(fields[1])


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


async def test_the_server_runs_under_tini_and_what_commands_orphan_is_reaped(sandbox_image, tmp_path):
    sandbox = DockerSandbox([tmp_path], image=sandbox_image)
    async with sandbox as backend:
        init = await asyncio.to_thread(sandbox.host_pid)
        servers = [pid for pid in pids_in(init) if pid != init and "-m protolink_sandboxd " in f"{cmdline(pid)} "]
        assert "tini" in cmdline(init)
        assert len(servers) == 1, [cmdline(pid) for pid in servers]
        assert (stat(servers[0]) or ("", 0))[1] == init  # the server is init's child: no reaper between

        spec = ProcessSpec(("/bin/sh", "-c", ORPHANING), "/tmp", ENV, 60, 1 << 16)
        assert (await backend.execute(spec, Silent())).stdout == "started\n"

        def nothing_orphaned_is_left() -> bool:
            inside = set(pids_in(init))
            sleeping = any("sleep 30" in cmdline(pid) for pid in inside)
            # A zombie leaves its cgroup: it is found as a child of a process inside.
            facts = (stat(int(entry.name)) for entry in Path("/proc").iterdir() if entry.name.isdigit())
            zombies = any(fact is not None and fact[0] == "Z" and fact[1] in inside for fact in facts)
            return not sleeping and not zombies

        await settle(nothing_orphaned_is_left, "the orphaned sleep to be killed and reaped")
        assert (await backend.execute(spec, Silent())).exit_code == 0
