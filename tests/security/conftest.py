"""Fixtures of the attack corpus: one shared DockerSandbox, an attacker's agent, figures.

Every attack is driven through the agent's own tools (``run_shell``, ``execute_command``,
``git``, the filesystem and document tools) with ``backend=`` the sandbox. Attacks that do not
kill a sandbox share one per session (:func:`sandbox`); the few that must kill or exhaust one
start their own with :func:`dedicated_sandbox`. ``PROTOLINK_SANDBOX_RUNTIME=runsc`` runs every
sandbox of the suite under that runtime (gVisor) where the engine has it.

Figures the tests measure are printed in a "security figures" section at the end of the run;
SECURITY.md quotes them with the command that produced them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from protolink import Agent, AgentCard, StorageCheckpointStore
from protolink.errors import SandboxUnavailableError
from protolink.execution.process_types import ProcessResult
from protolink.sandbox.config import MiB
from protolink.sandbox.docker import DockerSandbox
from protolink.storage import InMemoryStorage
from protolink.tools.builtins import (
    document_tools,
    filesystem_tools,
    git_tool,
    process_tool,
    shell_tool,
)

PYTHON = "/opt/protolink/bin/python"
NOBODY = 65534
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
RUNTIME = os.environ.get("PROTOLINK_SANDBOX_RUNTIME") or None
#: gVisor's Sentry, not the host kernel, answers the commands' system calls.
GVISOR = RUNTIME == "runsc"
#: A destination without a route: gVisor's network stack answers EHOSTUNREACH where Linux answers ENETUNREACH.
NO_ROUTE = errno.EHOSTUNREACH if GVISOR else errno.ENETUNREACH
#: Generous bound that only keeps a broken build from hanging the suite; never a timing claim.
HANG_GUARD = 60.0
#: An environment variable of the host process while sandboxes start: it must never be seen inside.
CANARY_VARIABLE = "PROTOLINK_SECURITY_CANARY"
CANARY = f"canary-{secrets.token_hex(8)}"

#: The shared sandbox's limits: small enough that bombs end quickly, large enough for git and parsers.
LIMITS: dict[str, Any] = {"memory": 768 * MiB, "pids": 256, "cpus": 1.0, "tmpfs_bytes": 32 * MiB,
                          "disk_bytes": 256 * MiB}

_figures: dict[str, str] = {}


@dataclass(frozen=True)
class Roots:
    """Host directories mounted into the shared sandbox at the same paths."""

    base: Path  # not mounted: the host side the sandbox must never see
    work: Path  # mounted writable, owned by the command uid
    ro: Path  # mounted read-only


@pytest.fixture(scope="session")
def roots() -> Iterator[Roots]:
    base = Path(tempfile.mkdtemp(prefix="protolink-security-")).resolve()
    base.chmod(0o755)
    work, ro = base / "work", base / "ro"
    work.mkdir()
    ro.mkdir()
    os.chown(work, NOBODY, NOBODY)
    (ro / "readme.txt").write_text("read only\n")
    (base / "host-secret.txt").write_text(f"{CANARY}\n")
    yield Roots(base, work, ro)
    shutil.rmtree(base, ignore_errors=True)


@contextlib.asynccontextmanager
async def dedicated_sandbox(image: str, *, ro: list[Path] | None = None, writable: list[Path] | None = None,
                            **limits: Any) -> AsyncIterator[DockerSandbox]:
    """A sandbox of its own for an attack that kills or exhausts one; removed on exit."""
    sandbox = DockerSandbox(ro or [], writable=writable or [], image=image, runtime=RUNTIME, **{**LIMITS, **limits})
    with _canary_in_host_environment():
        await sandbox.start()
    try:
        yield sandbox
    finally:
        await sandbox.aclose()


@contextlib.contextmanager
def _canary_in_host_environment() -> Iterator[None]:
    previous = os.environ.get(CANARY_VARIABLE)
    os.environ[CANARY_VARIABLE] = CANARY
    try:
        yield
    finally:
        if previous is None:
            del os.environ[CANARY_VARIABLE]
        else:
            os.environ[CANARY_VARIABLE] = previous


@pytest.fixture(scope="session")
async def sandbox(roots: Roots, sandbox_image: str) -> AsyncIterator[DockerSandbox]:
    """The session's shared sandbox: ``roots.ro`` read-only, ``roots.work`` writable."""
    async with dedicated_sandbox(sandbox_image, ro=[roots.ro], writable=[roots.work]) as shared:
        yield shared


@pytest.fixture
def ws(roots: Roots, request: pytest.FixtureRequest) -> Path:
    """A fresh directory of the command user beneath the writable root, for one test."""
    name = "".join(c if c.isalnum() or c in "_-" else "-" for c in request.node.name[:40])
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=roots.work))
    path.chmod(0o755)
    os.chown(path, NOBODY, NOBODY)
    return path


class Attacker:
    """An agent whose tools all run in one sandbox, over one workspace directory."""

    def __init__(self, backend: Any, ws: Path, roots: Roots | None = None) -> None:
        self.backend, self.ws = backend, ws
        file_roots = [ws] + ([roots.ro] if roots else [])
        self.checkpoints = StorageCheckpointStore(InMemoryStorage("security-changes"))
        self.agent = Agent(AgentCard(name="attacker"))
        for tool in (shell_tool(cwd=str(ws), env=ENV, backend=backend, timeout_seconds=30),
                     process_tool(backend=backend),
                     *filesystem_tools(roots=file_roots, checkpoints=self.checkpoints, backend=backend),
                     *document_tools(roots=file_roots, backend=backend, timeout_seconds=30)):
            self.agent.add_tool(tool)
        self._git: dict[Path, Agent] = {}

    async def call(self, tool: str, *, guard: float = HANG_GUARD, **arguments: Any) -> Any:
        """The tool's call, failed by the test past ``guard`` seconds (a hang, not a slow machine:
        a command's guard is its own timeout plus HANG_GUARD)."""
        return await asyncio.wait_for(self.agent.call_tool(tool, **arguments), guard)

    async def shell(self, command: str) -> ProcessResult:
        """``run_shell`` (30 s, 64 KiB of output) in the workspace."""
        return await self.call("run_shell", command=command)

    async def run(self, argv: list[str], *, timeout: float = 30, max_output_bytes: int = 65536,
                  cwd: Path | None = None) -> ProcessResult:
        """``execute_command`` with its own limits."""
        return await self.call("execute_command", argv=argv, cwd=str(cwd or self.ws), env=ENV,
                               timeout_seconds=timeout, max_output_bytes=max_output_bytes, guard=timeout + HANG_GUARD)

    async def python(self, code: str, *args: str, timeout: float = 30, max_output_bytes: int = 65536) -> ProcessResult:
        return await self.run([PYTHON, "-c", code, *args], timeout=timeout, max_output_bytes=max_output_bytes)

    async def probe(self, code: str, *args: str, timeout: float = 30) -> Any:
        """Run ``code`` (which prints one JSON document last) and return what it printed."""
        result = await self.python(code, *args, timeout=timeout)
        assert result.exit_code == 0, result
        return json.loads(result.stdout.strip().splitlines()[-1])

    async def git(self, repo: Path, operation: str, **arguments: Any) -> ProcessResult:
        """The ``git`` tool (writes allowed) configured on ``repo``."""
        if repo not in self._git:
            self._git[repo] = Agent(AgentCard(name="git-attacker"))
            self._git[repo].add_tool(git_tool(cwd=str(repo), allow_write=True, env=ENV, backend=self.backend))
        return await asyncio.wait_for(self._git[repo].call_tool("git", operation=operation, **arguments), HANG_GUARD)


@pytest.fixture
def attacker(sandbox: DockerSandbox, ws: Path, roots: Roots) -> Attacker:
    return Attacker(sandbox.backend, ws, roots)


@pytest.fixture
def box_root(tmp_path: Path) -> Path:
    """A directory of the command user, to be the writable root of a sandbox of the test's own."""
    root = tmp_path / "root"
    root.mkdir()
    os.chown(root, NOBODY, NOBODY)
    return root


@pytest.fixture
async def lone_attacker(sandbox_image: str, box_root: Path) -> AsyncIterator[Attacker]:
    """An attacker in a sandbox of its own: an attack that may end its sandbox (a fork bomb ends
    gVisor's) takes no other test with it."""
    async with dedicated_sandbox(sandbox_image, writable=[box_root]) as box:
        yield Attacker(box.backend, box_root)


STRAYS = r"""
import json, os
me = os.getsid(0)
seen = {}
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        status = open(f'/proc/{pid}/status').read()
        command = open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\0', b' ').decode(errors='replace')
        seen[int(pid)] = (int(status.split('\nUid:')[1].split()[0]), int(status.split('\nPPid:')[1].split()[0]),
                          os.getpgid(int(pid)), os.getsid(int(pid)), command)
    except (OSError, IndexError):
        pass
servers = {pid for pid, (uid, _, _, _, command) in seen.items() if uid == 0 and ' -m protolink_sandboxd ' in command}
found = []
for pid, (real_uid, parent, group, session, command) in seen.items():
    # The server's helpers (the spawner, forked from it or started anew, and the workers) are its
    # children leading their own groups; the spawner holds the command uid as its real uid while
    # it starts this very probe.
    helper = parent in servers and group == pid
    if real_uid == os.getuid() and session != me and not helper:
        found.append(command)
print(json.dumps(found))
"""


async def ended_under_gvisor(attacker: Attacker, what: str, error: SandboxUnavailableError) -> None:
    """The outcome of an attack that ended its sandbox: allowed only under gVisor, where the
    Sentry's memory and tasks are what the attack exhausts (SECURITY.md); the host's cgroups
    hold, and the next call fails at once with a typed error instead of hanging."""
    assert GVISOR, f"{what} ended the sandbox: {error}"
    figure(f"{what} (gVisor)", f"the sandbox ended: {error}")
    with pytest.raises(SandboxUnavailableError):
        await attacker.run(["/bin/echo", "next"])


async def still_serves(attacker: Attacker) -> None:
    """The sandbox answers the next calls: a command, a file read, and nothing of the command uid is left over."""
    assert (await attacker.run(["/bin/echo", "next"])).stdout == "next\n"
    probe = attacker.ws / "still-serves.txt"
    if not probe.exists():
        probe.write_text("served\n")
    assert (await attacker.call("read_file", path=str(probe)))["content"] == "served\n"
    assert await attacker.probe(STRAYS) == []


def figure(name: str, value: str) -> None:
    """Record a figure for the end-of-run "security figures" section."""
    _figures[name] = value


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _figures:
        terminalreporter.section("security figures")
        for name, value in _figures.items():
            terminalreporter.line(f"{name}: {value}")
