"""A sandbox root given through an alias: mounted at its real path, used through either spelling."""

from __future__ import annotations

import os

import pytest

from protolink import Agent, AgentCard, StorageCheckpointStore
from protolink.sandbox.docker import DockerSandbox
from protolink.storage import InMemoryStorage
from protolink.tools import document_tools, filesystem_tools

pytestmark = pytest.mark.docker


async def test_a_root_given_through_an_alias_is_mounted_at_its_real_path(sandbox_image, run, tmp_path):
    """The container holds the real path only; tools registered through the alias still reach it."""
    real = tmp_path.resolve() / "real"
    real.mkdir()
    real.chmod(0o777)  # only the mount may stop the command uid (nobody) from writing
    (real / "a.md").write_text("hello\n")
    alias = tmp_path.resolve() / "alias"
    alias.symlink_to(real, target_is_directory=True)

    async with DockerSandbox(writable=[alias], image=sandbox_image) as backend:
        info = await backend.info()
        assert [(root.path, root.writable) for root in info.roots] == [(str(real), True)]
        seen = await run(backend, ["/bin/sh", "-c", f"test -d {real} && echo real; test -e {alias} || echo no-alias"])
        assert seen.stdout == "real\nno-alias\n"

        agent = Agent(AgentCard(name="files"))
        checkpoints = StorageCheckpointStore(InMemoryStorage("file-changes"))
        for tool in [*filesystem_tools(roots=[alias], checkpoints=checkpoints, backend=backend),
                     *document_tools(roots=[alias], backend=backend)]:
            agent.add_tool(tool)
        read = await agent.call_tool("read_file", path=str(alias / "a.md"))
        assert (read["path"], read["content"]) == (str(real / "a.md"), "hello\n")
        created = await agent.call_tool("create_file", path=str(alias / "b.txt"), content="written\n")
        assert created["path"] == str(real / "b.txt")
        document = await agent.call_tool("read_document", path=str(alias / "a.md"))
        assert document["metadata"]["path"] == str(real / "a.md")
    assert (real / "b.txt").read_text() == "written\n"
    assert sorted(os.listdir(real)) == ["a.md", "b.txt"]
