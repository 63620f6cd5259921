"""filesystem_tools against a backend: reads, listing, search and conditional writes.

Every file lives under ``workspace``; the tools run through an ordinary Agent with the backend
under test, so the same suite holds for the host and for a sandbox.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from filesystem_agents import Approver, file_agent

from protolink import CapabilityPolicy
from protolink.errors import PolicyDeniedError, ResourceConflictError, ToolArgumentError
from protolink.tools import filesystem_tools


@pytest.fixture
def root(workspace: Path) -> Path:
    """The configured root; ``workspace/outside`` sits next to it, beyond every root."""
    path = workspace / "root"
    path.mkdir()
    (workspace / "outside").mkdir()
    return path


@pytest.fixture
def special_files(root: Path) -> Iterator[dict[str, Path]]:
    """A FIFO and a bound Unix socket beneath the root."""
    fifo = root / "fifo"
    os.mkfifo(fifo)
    sock_path = root / "sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    try:
        yield {"fifo": fifo, "socket": sock_path}
    finally:
        server.close()


async def read(agent, path: Path, **options) -> dict:
    return await agent.call_tool("read_file", path=str(path), **options)


# -- registration ---------------------------------------------------------------------------


def test_without_checkpoints_only_read_tools_exist(root: Path, backend) -> None:
    tools = filesystem_tools(roots=[root], backend=backend)
    assert [tool.name for tool in tools] == ["read_file", "list_files", "search_files"]
    assert all(tool.capabilities == ("filesystem.read",) for tool in tools)


def test_checkpoints_add_write_and_recovery_tools_with_their_capabilities(root: Path, backend) -> None:
    agent = file_agent(root, backend)
    capabilities = {name: tool.capabilities for name, tool in agent.tools.items()}
    assert capabilities == {
        "read_file": ("filesystem.read",), "list_files": ("filesystem.read",),
        "search_files": ("filesystem.read",), "create_file": ("filesystem.write",),
        "replace_file": ("filesystem.write",), "edit_file": ("filesystem.write",),
        "preview_change": ("filesystem.read",), "restore_change": ("filesystem.restore",),
    }


def test_roots_must_be_existing_absolute_directories(root: Path, backend) -> None:
    for bad in (["relative/dir"], [str(root / "missing")], []):
        with pytest.raises(ValueError):
            filesystem_tools(roots=bad, backend=backend)


# -- read_file ------------------------------------------------------------------------------


async def test_read_file_offsets_count_unicode_characters(root: Path, backend) -> None:
    path = root / "unicode.txt"
    path.write_text("héllo wörld 🎉 done\n", encoding="utf-8")
    agent = file_agent(root, backend, writable=False)

    first = await read(agent, path, max_chars=7)
    assert first == {"path": str(path), "content": "héllo w", "next_offset": 7}
    second = await read(agent, path, offset=first["next_offset"], max_chars=7)
    assert second["content"] == "örld 🎉 "
    assert second["next_offset"] == 14
    last = await read(agent, path, offset=second["next_offset"])
    assert last["content"] == "done\n"
    assert last["next_offset"] is None


async def test_read_file_max_chars_is_1_to_20000(root: Path, backend) -> None:
    path = root / "long.txt"
    path.write_text("x" * 25_000)
    agent = file_agent(root, backend, writable=False)
    assert len((await read(agent, path))["content"]) == 20_000
    for bad in (0, 20_001):
        with pytest.raises(ToolArgumentError):
            await read(agent, path, max_chars=bad)
    with pytest.raises(ToolArgumentError):
        await read(agent, path, offset=-1)


async def test_read_file_rejects_symlinks_at_every_level(root: Path, workspace: Path, backend) -> None:
    (root / "real").mkdir()
    (root / "real" / "file.txt").write_text("inside\n")
    (workspace / "outside" / "secret.txt").write_text("secret\n")
    (root / "link.txt").symlink_to(root / "real" / "file.txt")
    (root / "linkdir").symlink_to(root / "real", target_is_directory=True)
    (root / "escape").symlink_to(workspace / "outside", target_is_directory=True)
    agent = file_agent(root, backend, writable=False)

    for path in (root / "link.txt", root / "linkdir" / "file.txt", root / "escape" / "secret.txt"):
        with pytest.raises(ValueError, match="symlink"):
            await read(agent, path)
    assert (await read(agent, root / "real" / "file.txt"))["content"] == "inside\n"


async def test_read_file_rejects_special_files_without_blocking(root: Path, special_files, backend) -> None:
    agent = file_agent(root, backend, writable=False)
    for path in special_files.values():
        with pytest.raises(ValueError, match="special file"):
            await read(agent, path)
    with pytest.raises(ValueError, match="directory"):
        await read(agent, root)


async def test_read_file_rejects_binary_and_invalid_utf8(root: Path, backend) -> None:
    (root / "nul.txt").write_bytes(b"text\0more")
    (root / "latin1.txt").write_bytes("café".encode("latin-1"))
    agent = file_agent(root, backend, writable=False)
    with pytest.raises(ValueError, match="NUL"):
        await read(agent, root / "nul.txt")
    with pytest.raises(ValueError, match="UTF-8"):
        await read(agent, root / "latin1.txt")


async def test_read_file_refuses_files_over_max_file_bytes(root: Path, backend) -> None:
    (root / "big.txt").write_text("y" * 101)
    agent = file_agent(root, backend, writable=False, max_file_bytes=100)
    with pytest.raises(ValueError, match="limit is 100"):
        await read(agent, root / "big.txt")


async def test_paths_outside_roots_fail_before_authorization(root: Path, workspace: Path, backend) -> None:
    (workspace / "outside" / "secret.txt").write_text("secret\n")
    agent = file_agent(root, backend, writable=False)
    agent.policy = CapabilityPolicy(default_effect="deny")
    bad_paths = ["relative.txt", f"{root}/../outside/secret.txt", str(workspace / "outside" / "secret.txt"),
                 f"{root}/a\0b"]
    for path in bad_paths:
        with pytest.raises(ValueError):
            await agent.call_tool("read_file", path=path)
    with pytest.raises(PolicyDeniedError):
        await agent.call_tool("read_file", path=str(root / "inside.txt"))


async def test_read_file_of_a_missing_file_is_file_not_found(root: Path, backend) -> None:
    agent = file_agent(root, backend, writable=False)
    with pytest.raises(FileNotFoundError):
        await read(agent, root / "absent.txt")


# -- list_files -----------------------------------------------------------------------------


async def test_list_files_reports_types_and_sizes(root: Path, workspace: Path, special_files, backend) -> None:
    (root / "a.py").write_text("print(1)\n")
    (root / "sub").mkdir()
    (root / "sub" / "nested.py").write_text("x\n")
    (root / "to-outside").symlink_to(workspace / "outside", target_is_directory=True)
    agent = file_agent(root, backend, writable=False)

    listing = await agent.call_tool("list_files", path=str(root))
    items = {Path(item["path"]).name: item for item in listing["items"]}
    assert items["a.py"] == {"path": str(root / "a.py"), "type": "file", "size": 9}
    assert items["sub"]["type"] == "directory"
    assert {items[name]["type"] for name in ("fifo", "sock", "to-outside")} == {"other"}
    assert "nested.py" not in items
    assert (listing["scanned"], listing["skipped"], listing["truncated"]) == (5, 0, False)


async def test_list_files_matches_filename_glob_recursively(root: Path, backend) -> None:
    (root / "a.py").write_text("")
    (root / "b.txt").write_text("")
    (root / "pkg").mkdir()
    (root / "pkg" / "c.py").write_text("")
    agent = file_agent(root, backend, writable=False)

    flat = await agent.call_tool("list_files", path=str(root), pattern="*.py")
    deep = await agent.call_tool("list_files", path=str(root), pattern="*.py", recursive=True)
    assert [item["path"] for item in flat["items"]] == [str(root / "a.py")]
    assert sorted(item["path"] for item in deep["items"]) == [str(root / "a.py"), str(root / "pkg" / "c.py")]


async def test_list_files_does_not_follow_symlinked_directories(root: Path, workspace: Path, backend) -> None:
    (workspace / "outside" / "secret.txt").write_text("secret\n")
    (root / "escape").symlink_to(workspace / "outside", target_is_directory=True)
    agent = file_agent(root, backend, writable=False)
    listing = await agent.call_tool("list_files", path=str(root), recursive=True)
    assert listing["items"] == [{"path": str(root / "escape"), "type": "other", "size": None}]
    with pytest.raises(ValueError, match="symlink"):
        await agent.call_tool("list_files", path=str(root / "escape"))


async def test_list_files_max_results_truncates(root: Path, backend) -> None:
    for index in range(5):
        (root / f"f{index}").write_text("")
    agent = file_agent(root, backend, writable=False)
    cut = await agent.call_tool("list_files", path=str(root), max_results=2)
    whole = await agent.call_tool("list_files", path=str(root), max_results=5)
    assert (len(cut["items"]), cut["truncated"]) == (2, True)
    assert (len(whole["items"]), whole["truncated"]) == (5, False)
    for bad in (0, 1001):
        with pytest.raises(ToolArgumentError):
            await agent.call_tool("list_files", path=str(root), max_results=bad)


async def test_traversal_stops_at_10000_entries(root: Path, backend) -> None:
    for index in range(10_050):
        (root / f"e{index:05d}").touch()
    agent = file_agent(root, backend, writable=False)
    listing = await agent.call_tool("list_files", path=str(root), pattern="nothing-matches")
    assert listing == {"items": [], "scanned": 10_000, "skipped": 0, "truncated": True}


async def test_traversal_descends_at_most_20_levels(root: Path, backend) -> None:
    directory = root
    for level in range(1, 25):
        directory = directory / f"d{level}"
        directory.mkdir()
        (directory / f"level{level}.txt").write_text("needle\n")
    agent = file_agent(root, backend, writable=False)

    listing = await agent.call_tool("list_files", path=str(root), pattern="level*.txt", recursive=True)
    found = sorted(int(Path(item["path"]).stem.removeprefix("level")) for item in listing["items"])
    assert found == list(range(1, 20))  # d1 is level 2 below the starting directory
    assert listing["skipped"] == 1 and not listing["truncated"]

    search = await agent.call_tool("search_files", path=str(root), query="needle")
    assert len(search["items"]) == 19 and search["skipped"] == 1


# -- search_files ---------------------------------------------------------------------------


async def test_search_files_matches_literal_text_case_insensitively(root: Path, backend) -> None:
    (root / "notes.md").write_text("first line\nThe Äpfel are red\nno match\nÄPFEL again\n")
    (root / "regex.txt").write_text("a.c is literal\nabc is not a match\n")
    agent = file_agent(root, backend, writable=False)

    result = await agent.call_tool("search_files", path=str(root), query="äpfel")
    assert result["items"] == [
        {"path": str(root / "notes.md"), "line": 2, "text": "The Äpfel are red", "text_truncated": False},
        {"path": str(root / "notes.md"), "line": 4, "text": "ÄPFEL again", "text_truncated": False},
    ]
    sensitive = await agent.call_tool("search_files", path=str(root), query="ÄPFEL", case_sensitive=True)
    assert [item["line"] for item in sensitive["items"]] == [4]
    literal = await agent.call_tool("search_files", path=str(root), query="a.c")
    assert [(Path(item["path"]).name, item["line"]) for item in literal["items"]] == [("regex.txt", 1)]


async def test_search_files_shortens_long_lines_to_500_characters(root: Path, backend) -> None:
    (root / "wide.txt").write_text("needle" + "z" * 600 + "\r\nneedle short\r\n")
    agent = file_agent(root, backend, writable=False)
    items = (await agent.call_tool("search_files", path=str(root), query="needle"))["items"]
    assert len(items[0]["text"]) == 500 and items[0]["text_truncated"] is True
    assert items[1] == {"path": str(root / "wide.txt"), "line": 2, "text": "needle short", "text_truncated": False}


async def test_search_files_filters_by_pattern_and_max_results(root: Path, backend) -> None:
    (root / "a.py").write_text("needle\nneedle\nneedle\n")
    (root / "b.txt").write_text("needle\n")
    agent = file_agent(root, backend, writable=False)
    only_py = await agent.call_tool("search_files", path=str(root), query="needle", pattern="*.py")
    assert {Path(item["path"]).name for item in only_py["items"]} == {"a.py"}
    capped = await agent.call_tool("search_files", path=str(root), query="needle", pattern="*.py", max_results=2)
    assert (len(capped["items"]), capped["truncated"]) == (2, True)


async def test_search_files_skips_binary_invalid_and_oversized_files(root: Path, backend) -> None:
    (root / "good.txt").write_text("needle\n")
    (root / "binary.bin").write_bytes(b"needle\0\1\2")
    (root / "latin1.txt").write_bytes("needle café".encode("latin-1"))
    (root / "huge.txt").write_text("needle\n" + "x" * 200)
    agent = file_agent(root, backend, writable=False, max_file_bytes=100)
    result = await agent.call_tool("search_files", path=str(root), query="needle")
    assert [Path(item["path"]).name for item in result["items"]] == ["good.txt"]
    assert (result["scanned"], result["skipped"], result["truncated"]) == (4, 3, False)


async def test_search_files_ignores_symlinks_and_special_files(root: Path, workspace: Path, special_files,
                                                               backend) -> None:
    (workspace / "outside" / "secret.txt").write_text("needle\n")
    (root / "escape").symlink_to(workspace / "outside", target_is_directory=True)
    (root / "file-link").symlink_to(workspace / "outside" / "secret.txt")
    agent = file_agent(root, backend, writable=False)
    result = await agent.call_tool("search_files", path=str(root), query="needle")
    assert result == {"items": [], "scanned": 4, "skipped": 0, "truncated": False}


async def test_search_reads_at_most_32_mib_in_total(root: Path, backend) -> None:
    seven_mib = 7 * 1024 * 1024
    for index in range(5):
        (root / f"part{index}.txt").write_bytes(b"needle\n" + b"x" * (seven_mib - 7))
    agent = file_agent(root, backend, writable=False)
    result = await agent.call_tool("search_files", path=str(root), query="needle")
    assert len(result["items"]) == 4  # 4 x 7 MiB fit in 32 MiB; the fifth does not
    assert result["truncated"] is True


async def test_search_query_must_be_one_line(root: Path, backend) -> None:
    agent = file_agent(root, backend, writable=False)
    with pytest.raises(ToolArgumentError):
        await agent.call_tool("search_files", path=str(root), query="")
    with pytest.raises(ValueError, match="single line"):
        await agent.call_tool("search_files", path=str(root), query="two\nlines")


# -- create_file ----------------------------------------------------------------------------


async def test_create_file_writes_utf8_with_mode_0600(root: Path, backend) -> None:
    approver = Approver()
    agent = file_agent(root, backend, approver=approver)
    target = root / "new.txt"
    result = await agent.call_tool("create_file", path=str(target), content="grüße\n")

    assert target.read_bytes() == "grüße\n".encode()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert result["state"] == "applied" and result["change_id"].startswith("chg_")
    assert approver.artifact("preimage")["exists"] is False
    assert approver.artifact("diff").startswith(f"--- /dev/null\n+++ {target}\n")
    assert sorted(os.listdir(root)) == ["new.txt"]  # no temporary file left behind


async def test_create_file_refuses_an_existing_target_before_approval(root: Path, backend) -> None:
    (root / "exists.txt").write_text("keep\n")
    approver = Approver()
    agent = file_agent(root, backend, approver=approver)
    with pytest.raises(FileExistsError):
        await agent.call_tool("create_file", path=str(root / "exists.txt"), content="clobber\n")
    assert approver.requests == []
    assert (root / "exists.txt").read_text() == "keep\n"


async def test_create_file_does_not_create_missing_parents(root: Path, backend) -> None:
    agent = file_agent(root, backend)
    with pytest.raises(FileNotFoundError):
        await agent.call_tool("create_file", path=str(root / "missing" / "new.txt"), content="x")
    assert not (root / "missing").exists()


async def test_create_file_refuses_a_target_created_concurrently(root: Path, backend) -> None:
    approver = Approver()
    target = root / "race.txt"
    approver.before_approving = lambda: target.write_text("someone else\n")
    agent = file_agent(root, backend, approver=approver)
    with pytest.raises(ResourceConflictError):
        await agent.call_tool("create_file", path=str(target), content="mine\n")
    assert target.read_text() == "someone else\n"
    assert sorted(os.listdir(root)) == ["race.txt"]


# -- replace_file and edit_file -------------------------------------------------------------


async def test_replace_file_preserves_mode_and_replaces_atomically(root: Path, backend) -> None:
    target = root / "script.sh"
    target.write_text("#!/bin/sh\necho old\n")
    target.chmod(0o751)
    old_inode = target.stat().st_ino
    approver = Approver()
    agent = file_agent(root, backend, approver=approver)

    await agent.call_tool("replace_file", path=str(target), content="#!/bin/sh\necho new\n")
    assert target.read_text() == "#!/bin/sh\necho new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o751
    assert target.stat().st_ino != old_inode  # a new file was renamed into place
    assert os.listdir(root) == ["script.sh"]
    preimage = approver.artifact("preimage")
    assert preimage["content"] == "#!/bin/sh\necho old\n" and preimage["mode"] == 0o751
    assert "-echo old\n+echo new\n" in approver.artifact("diff")


async def test_replace_file_rejects_symlinks_special_and_binary_files_before_approval(
        root: Path, workspace: Path, special_files, backend) -> None:
    outside = workspace / "outside" / "target.txt"
    outside.write_text("outside\n")
    (root / "link.txt").symlink_to(outside)
    (root / "binary.dat").write_bytes(b"\0\1\2")
    approver = Approver()
    agent = file_agent(root, backend, approver=approver)
    for path in (root / "link.txt", special_files["fifo"], root / "binary.dat"):
        with pytest.raises(ValueError):
            await agent.call_tool("replace_file", path=str(path), content="new\n")
    with pytest.raises(FileNotFoundError):
        await agent.call_tool("replace_file", path=str(root / "absent.txt"), content="new\n")
    assert approver.requests == []
    assert outside.read_text() == "outside\n"


async def test_replace_file_conflicts_when_the_file_changed_after_approval(root: Path, backend) -> None:
    target = root / "doc.txt"
    target.write_text("approved\n")
    approver = Approver()
    approver.before_approving = lambda: target.write_text("changed meanwhile\n")
    agent = file_agent(root, backend, approver=approver)
    with pytest.raises(ResourceConflictError):
        await agent.call_tool("replace_file", path=str(target), content="mine\n")
    assert target.read_text() == "changed meanwhile\n"


async def test_a_mode_change_after_approval_is_a_conflict(root: Path, backend) -> None:
    target = root / "doc.txt"
    target.write_text("same bytes\n")
    approver = Approver()
    approver.before_approving = lambda: target.chmod(0o600)
    agent = file_agent(root, backend, approver=approver)
    with pytest.raises(ResourceConflictError):
        await agent.call_tool("edit_file", path=str(target), old_text="same", new_text="other")
    assert target.read_text() == "same bytes\n"


async def test_a_replaced_parent_directory_is_a_conflict(root: Path, workspace: Path, backend) -> None:
    (root / "dir").mkdir()
    (root / "dir" / "doc.txt").write_text("content\n")

    def swap_directory() -> None:
        (root / "dir").rename(workspace / "outside" / "moved")
        (root / "dir").mkdir()
        (root / "dir" / "doc.txt").write_text("content\n")

    approver = Approver()
    approver.before_approving = swap_directory
    agent = file_agent(root, backend, approver=approver)
    with pytest.raises(ResourceConflictError, match="changed"):
        await agent.call_tool("edit_file", path=str(root / "dir" / "doc.txt"), old_text="content", new_text="x")
    assert (root / "dir" / "doc.txt").read_text() == "content\n"
    assert (workspace / "outside" / "moved" / "doc.txt").read_text() == "content\n"


async def test_a_symlinked_parent_swapped_in_after_approval_writes_nothing_outside(
        root: Path, workspace: Path, backend) -> None:
    (root / "dir").mkdir()
    (root / "dir" / "doc.txt").write_text("content\n")
    outside = workspace / "outside"

    def swap_in_symlink() -> None:
        shutil.move(root / "dir" / "doc.txt", outside / "doc.txt")
        (root / "dir").rmdir()
        (root / "dir").symlink_to(outside, target_is_directory=True)

    approver = Approver()
    approver.before_approving = swap_in_symlink
    agent = file_agent(root, backend, approver=approver)
    with pytest.raises(ResourceConflictError):
        await agent.call_tool("replace_file", path=str(root / "dir" / "doc.txt"), content="escaped\n")
    assert (outside / "doc.txt").read_text() == "content\n"
    assert os.listdir(outside) == ["doc.txt"]


async def test_a_symlinked_target_swapped_in_after_approval_writes_nothing_outside(
        root: Path, workspace: Path, backend) -> None:
    target = root / "doc.txt"
    target.write_text("content\n")
    outside = workspace / "outside" / "victim.txt"
    outside.write_text("content\n")

    def swap_in_symlink() -> None:
        target.unlink()
        target.symlink_to(outside)

    approver = Approver()
    approver.before_approving = swap_in_symlink
    agent = file_agent(root, backend, approver=approver)
    with pytest.raises(ResourceConflictError):
        await agent.call_tool("edit_file", path=str(target), old_text="content", new_text="escaped")
    assert outside.read_text() == "content\n"
    assert target.is_symlink()


async def test_edit_file_replaces_exact_case_sensitive_text(root: Path, backend) -> None:
    target = root / "config.ini"
    target.write_text("name = Alpha\nalpha = 1\n")
    agent = file_agent(root, backend)
    await agent.call_tool("edit_file", path=str(target), old_text="Alpha", new_text="Beta")
    assert target.read_text() == "name = Beta\nalpha = 1\n"


async def test_edit_file_match_errors_fail_before_approval(root: Path, backend) -> None:
    target = root / "config.ini"
    target.write_text("x = 1\nx = 1\n")
    approver = Approver()
    agent = file_agent(root, backend, approver=approver)
    with pytest.raises(ValueError, match="does not occur"):
        await agent.call_tool("edit_file", path=str(target), old_text="X = 1", new_text="y")
    with pytest.raises(ValueError, match="2 times"):
        await agent.call_tool("edit_file", path=str(target), old_text="x = 1", new_text="y")
    with pytest.raises(ToolArgumentError):
        await agent.call_tool("edit_file", path=str(target), old_text="", new_text="y")
    with pytest.raises(ToolArgumentError):
        await agent.call_tool("edit_file", path=str(target), new_text="y")
    assert approver.requests == []

    await agent.call_tool("edit_file", path=str(target), old_text="x = 1", new_text="y = 2", replace_all=True)
    assert target.read_text() == "y = 2\ny = 2\n"


async def test_edit_file_counts_overlapping_matches(root: Path, backend) -> None:
    """In "aaa", "aa" occurs at offsets 0 and 1: two matches, refused before approval without
    replace_all; replace_all replaces left to right without overlap, as str.replace does."""
    target = root / "a.txt"
    target.write_text("aaa\n")
    approver = Approver()
    agent = file_agent(root, backend, approver=approver)
    with pytest.raises(ValueError, match="occurs 2 times .*replace 1 of them, left to right"):
        await agent.call_tool("edit_file", path=str(target), old_text="aa", new_text="b")
    assert approver.requests == [] and target.read_text() == "aaa\n"

    await agent.call_tool("edit_file", path=str(target), old_text="aa", new_text="b", replace_all=True)
    assert target.read_text() == "ba\n"


async def test_writes_over_max_file_bytes_are_rejected_before_approval(root: Path, backend) -> None:
    approver = Approver()
    agent = file_agent(root, backend, approver=approver, max_file_bytes=10)
    with pytest.raises(ValueError, match="limit is 10"):
        await agent.call_tool("create_file", path=str(root / "big.txt"), content="x" * 11)
    assert approver.requests == [] and not (root / "big.txt").exists()


async def test_write_content_must_be_text(root: Path, backend) -> None:
    agent = file_agent(root, backend)
    with pytest.raises(ValueError, match="NUL"):
        await agent.call_tool("create_file", path=str(root / "nul.txt"), content="a\0b")
    with pytest.raises(ValueError, match="UTF-8"):
        await agent.call_tool("create_file", path=str(root / "surrogate.txt"), content="\ud800")
    assert os.listdir(root) == []
