"""An Agent whose shell, git, filesystem and document tools all run inside a DockerSandbox.

Needs a Docker Engine and the sandbox image (built here when missing, which takes minutes the
first time)::

    python examples/sandboxed_agent.py

The workspace is a temporary directory mounted writable at its own path; nothing else of the host
is visible. The agent's policy, approvals and recovery checkpoints stay on the host. The output
shows what the commands saw: no network but loopback, no capabilities, an unprivileged uid, a
read-only system, and none of the host's files.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

from protolink import Agent, AgentCard, CapabilityPolicy, StorageCheckpointStore
from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.provision import ensure_image
from protolink.storage import InMemoryStorage
from protolink.tools import document_tools, filesystem_tools, git_tool, shell_tool

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
       "GIT_AUTHOR_NAME": "Sandboxed Agent", "GIT_AUTHOR_EMAIL": "agent@example.invalid",
       "GIT_COMMITTER_NAME": "Sandboxed Agent", "GIT_COMMITTER_EMAIL": "agent@example.invalid"}

LOOK_AROUND = """\
echo "uid: $(id -u)"
echo "capabilities: $(grep CapEff /proc/self/status | cut -f2)"
echo "network interfaces: $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' ')"
/opt/protolink/bin/python -c 'import socket
try:
    socket.create_connection(("example.com", 443), timeout=3)
    print("network: reachable")
except OSError as error:
    print(f"network: {{error.strerror or error}}")'
touch /etc/owned 2>/dev/null && echo "system: writable" || echo "system: read-only"
test -e /var/run/docker.sock && echo "docker socket: visible" || echo "docker socket: absent"
test -e {here} && echo "this example's directory: visible" || echo "this example's directory: absent"
"""


def _give(workspace: Path, uid: int, gid: int) -> None:
    """When we are root, the commands' uid must own the workspace to change it."""
    if os.getuid() != 0:
        return
    for directory, dirs, files in os.walk(workspace):
        for name in (directory, *(os.path.join(directory, item) for item in dirs + files)):
            os.chown(name, uid, gid)


async def main() -> None:
    image = await asyncio.to_thread(ensure_image)
    with tempfile.TemporaryDirectory(prefix="protolink-example-") as temporary:
        workspace = Path(temporary, "workspace").resolve()
        workspace.mkdir()
        (workspace / "notes.md").write_text("# Notes\n\nThe sandbox keeps commands away from the host.\n")
        (workspace / "figures.csv").write_text("quarter,revenue\nQ1,120\nQ2,135\n")

        sandbox = DockerSandbox(writable=[workspace], image=image)
        _give(workspace, sandbox.command_uid, sandbox.command_gid)
        async with sandbox as backend:
            print(f"sandbox {backend.boundary} is up; workspace {workspace}\n")
            agent = Agent(AgentCard(name="sandboxed"), policy=CapabilityPolicy({
                "process.execute": "allow", "shell.execute": "allow", "git.*": "allow",
                "filesystem.read": "allow", "filesystem.write": "allow",
            }, default_effect="deny"))
            agent.add_tool(shell_tool(cwd=str(workspace), env=ENV, backend=backend))
            agent.add_tool(git_tool(cwd=str(workspace), env=ENV, allow_write=True, backend=backend))
            checkpoints = StorageCheckpointStore(InMemoryStorage())
            for tool in filesystem_tools(roots=[workspace], checkpoints=checkpoints, backend=backend):
                agent.add_tool(tool)
            for tool in document_tools(roots=[workspace], backend=backend):
                agent.add_tool(tool)

            seen = await agent.call_tool("run_shell", command=LOOK_AROUND.format(here=Path(__file__).resolve().parent))
            print("what the commands saw:\n" + seen.stdout)

            await agent.call_tool("run_shell", command="git init -q -b main . && git add -A")
            await agent.call_tool("edit_file", path=str(workspace / "notes.md"),
                                  old_text="from the host.", new_text="from the host, and the host from them.")
            await agent.call_tool("git", operation="add", paths=["notes.md"])
            committed = await agent.call_tool("git", operation="commit", message="Notes written in a sandbox")
            print("git commit:", committed.stdout.strip())
            log = await agent.call_tool("git", operation="log")
            print("git log:", log.stdout.splitlines()[0])

            found = await agent.call_tool("search_files", path=str(workspace), query="away from the host")
            print("search_files:", [f"{Path(hit['path']).name}:{hit['line']}" for hit in found["items"]])
            table = await agent.call_tool("read_document", path=str(workspace / "figures.csv"))
            print("read_document:", [section["cells"] for section in table["sections"]])
        print("\nsandbox removed")


if __name__ == "__main__":
    asyncio.run(main())
