"""Root aliases against a backend: a root and a requested path may each be spelled through the
root's real path or through symlinks outside every root, and every filesystem and document
tool answers with the real spelling.

The links live in a host directory outside every root (and outside every sandbox mount), as
macOS ``/tmp`` lives outside ``/private/tmp``: a sandbox never sees them, so it must be given
the real spelling.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from filesystem_agents import Approver, file_agent

from protolink import Agent, AgentCard, CapabilityPolicy, StorageCheckpointStore
from protolink.storage import InMemoryStorage
from protolink.tools import document_tools

SPELLINGS = ("real", "link", "parent")


@pytest.fixture
def root(workspace: Path) -> Path:
    """The root; ``workspace/outside`` sits next to it, beyond every root."""
    path = workspace / "root"
    (path / "sub").mkdir(parents=True)
    (workspace / "outside").mkdir()
    (workspace / "outside" / "secret.txt").write_text("needle outside\n")
    return path


@pytest.fixture
def links() -> Iterator[Path]:
    """A host directory of symlinks, outside every root and every sandbox mount."""
    path = Path(tempfile.mkdtemp(prefix="protolink-aliases-")).resolve()
    yield path
    shutil.rmtree(path)


@pytest.fixture
def spellings(root: Path, workspace: Path, links: Path) -> dict[str, Path]:
    """The root spelled through its real path, a link to it, and a link to its parent."""
    (links / "root").symlink_to(root, target_is_directory=True)
    (links / "parent").symlink_to(workspace, target_is_directory=True)
    return {"real": root, "link": links / "root", "parent": links / "parent" / root.name}


@pytest.fixture(params=SPELLINGS)
def configured(request: pytest.FixtureRequest, spellings: dict[str, Path]) -> Path:
    """The root as the tools are registered with it."""
    return spellings[request.param]


@pytest.fixture(params=SPELLINGS)
def spell(request: pytest.FixtureRequest, spellings: dict[str, Path], root: Path) -> Callable[[Path], str]:
    """Writes a real path beneath the root in the spelling a request uses."""
    return lambda path: str(spellings[request.param] / path.relative_to(root))


def document_agent(roots: list[Path], backend) -> Agent:
    agent = Agent(AgentCard(name="reader"))
    for tool in document_tools(roots=roots, backend=backend):
        agent.add_tool(tool)
    return agent


async def test_read_file_answers_with_the_real_path(root: Path, configured: Path, spell, backend) -> None:
    (root / "sub" / "a.txt").write_text("hello\n")
    agent = file_agent(root, backend, roots=[configured], writable=False)
    result = await agent.call_tool("read_file", path=spell(root / "sub" / "a.txt"))
    assert result == {"path": str(root / "sub" / "a.txt"), "content": "hello\n", "next_offset": None}


async def test_list_files_lists_beneath_the_real_path(root: Path, configured: Path, spell, backend) -> None:
    (root / "a.txt").write_text("a\n")
    (root / "sub" / "b.txt").write_text("bb\n")
    agent = file_agent(root, backend, roots=[configured], writable=False)
    whole = await agent.call_tool("list_files", path=spell(root), recursive=True)
    assert sorted((item["path"], item["type"], item["size"]) for item in whole["items"]) == [
        (str(root / "a.txt"), "file", 2), (str(root / "sub"), "directory", None),
        (str(root / "sub" / "b.txt"), "file", 3)]
    beneath = await agent.call_tool("list_files", path=spell(root / "sub"))
    assert [item["path"] for item in beneath["items"]] == [str(root / "sub" / "b.txt")]


async def test_search_files_finds_lines_under_the_real_path(root: Path, configured: Path, spell, backend) -> None:
    (root / "sub" / "notes.md").write_text("first\nthe needle\n")
    agent = file_agent(root, backend, roots=[configured], writable=False)
    result = await agent.call_tool("search_files", path=spell(root), query="needle")
    assert result["items"] == [
        {"path": str(root / "sub" / "notes.md"), "line": 2, "text": "the needle", "text_truncated": False}]


async def test_writes_approvals_and_recovery_records_name_the_real_path(root: Path, configured: Path, spell,
                                                                        backend) -> None:
    target = root / "sub" / "note.txt"
    approver = Approver()
    checkpoints = StorageCheckpointStore(InMemoryStorage("file-changes"))
    agent = file_agent(root, backend, roots=[configured], approver=approver, checkpoints=checkpoints)

    created = await agent.call_tool("create_file", path=spell(target), content="one\n")
    assert approver.artifact("diff").startswith(f"--- /dev/null\n+++ {target}\n")
    edited = await agent.call_tool("edit_file", path=spell(target), old_text="one", new_text="two")
    assert approver.artifact("preimage")["path"] == str(target)
    replaced = await agent.call_tool("replace_file", path=spell(target), content="three\n")
    assert target.read_text() == "three\n"

    preview = await agent.call_tool("preview_change", change_id=replaced["change_id"])
    assert (preview["path"], preview["conflict"]) == (str(target), False)
    restored = await agent.call_tool("restore_change", change_id=replaced["change_id"])
    assert target.read_text() == "two\n"
    changes = (created, edited, replaced, restored)
    assert {change["path"] for change in changes} == {str(target)}
    assert {checkpoints.load(change["change_id"]).resource_id for change in changes} == {str(target)}


async def test_document_tools_answer_with_the_real_path(root: Path, configured: Path, spell, backend) -> None:
    document = root / "sub" / "report.md"
    document.write_text("# Report\nRevenue grew.\n")
    agent = document_agent([configured], backend)
    extraction = await agent.call_tool("read_document", path=spell(document))
    assert extraction["metadata"] == {"path": str(document), "format": "md", "input_bytes": 23}
    found = await agent.call_tool("search_document", path=spell(document), query="revenue")
    assert found["metadata"]["path"] == str(document)
    assert [match["snippet"] for match in found["matches"]] == ["Revenue grew."]


async def test_a_symlink_beneath_the_root_is_refused_in_every_spelling(root: Path, workspace: Path, configured: Path,
                                                                       spell, backend) -> None:
    outside = workspace / "outside"
    (root / "escape").symlink_to(outside, target_is_directory=True)
    files = file_agent(root, backend, roots=[configured])
    documents = document_agent([configured], backend)
    escape = root / "escape"
    refused = [
        (files, "read_file", {"path": spell(escape / "secret.txt")}),
        (files, "list_files", {"path": spell(escape)}),
        (files, "search_files", {"path": spell(escape), "query": "needle"}),
        (files, "create_file", {"path": spell(escape / "new.txt"), "content": "escaped\n"}),
        (files, "replace_file", {"path": spell(escape / "secret.txt"), "content": "escaped\n"}),
        (documents, "read_document", {"path": spell(escape / "secret.txt")}),
    ]
    for agent, tool, arguments in refused:
        with pytest.raises(ValueError, match="symlink"):
            await agent.call_tool(tool, **arguments)
    searched = await files.call_tool("search_files", path=spell(root), query="needle")
    assert searched["items"] == []
    assert os.listdir(outside) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "needle outside\n"


@pytest.mark.parametrize("alias", ["outside", "sub"])
async def test_a_link_that_does_not_name_a_root_is_refused_before_authorization(
        root: Path, workspace: Path, links: Path, configured: Path, backend, alias: str) -> None:
    """A link to a directory outside every root, and a link to a directory beneath the root (not the root)."""
    (links / "outside").symlink_to(workspace / "outside", target_is_directory=True)
    (links / "sub").symlink_to(root / "sub", target_is_directory=True)
    (root / "sub" / "secret.txt").write_text("needle beneath\n")
    files = file_agent(root, backend, roots=[configured])
    documents = document_agent([configured], backend)
    for agent in (files, documents):
        agent.policy = CapabilityPolicy(default_effect="deny")
    link = links / alias
    refused = [
        (files, "read_file", {"path": str(link / "secret.txt")}),
        (files, "list_files", {"path": str(link)}),
        (files, "search_files", {"path": str(link), "query": "needle"}),
        (files, "create_file", {"path": str(link / "new.txt"), "content": "escaped\n"}),
        (files, "edit_file", {"path": str(link / "secret.txt"), "old_text": "needle", "new_text": "pin"}),
        (documents, "read_document", {"path": str(link / "secret.txt")}),
        (documents, "search_document", {"path": str(link / "secret.txt"), "query": "needle"}),
    ]
    for agent, tool, arguments in refused:
        with pytest.raises(ValueError, match="not inside a configured root"):
            await agent.call_tool(tool, **arguments)
    assert sorted(os.listdir(workspace / "outside")) == ["secret.txt"]
    assert sorted(os.listdir(root / "sub")) == ["secret.txt"]
