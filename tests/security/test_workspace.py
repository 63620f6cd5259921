"""The workspace: a hostile command shapes the files; the filesystem tools still read and write
only regular files beneath their roots, and never write anything a swap points them at."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from protolink import (
    Agent,
    AgentCard,
    ApprovalDecision,
    CapabilityPolicy,
    ResourceConflictError,
)
from protolink.errors import ResourceUnchangedError
from protolink.tools.builtins import filesystem_tools, process_tool

from .conftest import GVISOR, NOBODY, Attacker, figure, still_serves

pytestmark = pytest.mark.docker


def writer(attacker: Attacker, roots: list[Path], before_approving=None) -> tuple[Agent, list]:
    """An agent whose writes need approval; ``before_approving`` (async) runs first, as a race would."""
    requests: list = []

    async def approve(request, run) -> ApprovalDecision:
        requests.append(request)
        if before_approving is not None:
            await before_approving()
        return ApprovalDecision(approved=True, request_id=request.request_id)

    agent = Agent(AgentCard(name="writer"), policy=CapabilityPolicy({"filesystem.write": "require_approval"}),
                  approval_handler=approve)
    for tool in filesystem_tools(roots=roots, checkpoints=attacker.checkpoints, backend=attacker.backend):
        agent.add_tool(tool)
    return agent, requests


async def test_symlinks_out_of_the_root(attacker):
    """Symlinks made by a command: a file link to /etc/passwd, a directory link to /, a link to a file of another root.

    read_file refuses every symlink at every level; list_files shows them as "other"; search_files does not follow them.
    """
    await attacker.shell("ln -s /etc/passwd passwd.txt; ln -s / rootfs; mkdir sub; ln -s ../passwd.txt sub/up.txt")
    for path in ("passwd.txt", "rootfs/etc/passwd", "sub/up.txt"):
        with pytest.raises(ValueError, match="symlink"):
            await attacker.call("read_file", path=str(attacker.ws / path))
    listing = await attacker.call("list_files", path=str(attacker.ws), recursive=True)
    kinds = {Path(item["path"]).name: item["type"] for item in listing["items"]}
    assert kinds["passwd.txt"] == kinds["rootfs"] == kinds["up.txt"] == "other"
    found = await attacker.call("search_files", path=str(attacker.ws), query="root:")
    assert found["items"] == []
    await still_serves(attacker)


async def test_symlink_swapped_in_between_approval_and_apply(attacker):
    """While a write awaits approval, a command replaces the target with a symlink to a file outside the tool's root.

    The apply step finds the file changed: ResourceConflictError; the symlink's target is untouched.
    """
    inner = attacker.ws / "inner"
    await attacker.shell("mkdir inner && echo original > inner/doc.txt && echo victim > victim.txt")

    async def swap() -> None:
        await attacker.shell("ln -sf ../victim.txt inner/doc.new && mv -T inner/doc.new inner/doc.txt")

    agent, requests = writer(attacker, [inner], swap)
    with pytest.raises(ResourceConflictError):
        await agent.call_tool("replace_file", path=str(inner / "doc.txt"), content="overwritten\n")
    assert len(requests) == 1
    assert (attacker.ws / "victim.txt").read_text() == "victim\n"
    assert (inner / "doc.txt").is_symlink()
    await still_serves(attacker)


async def test_parent_directory_swapped_for_a_symlink_after_approval(attacker):
    """While a write awaits approval, a command replaces the target's parent directory with a symlink to another directory.

    ResourceConflictError; nothing is written in the directory the symlink points to.
    """
    inner = attacker.ws / "inner"
    await attacker.shell("mkdir -p inner/dir elsewhere && echo original > inner/dir/doc.txt && "
                         "echo original > elsewhere/doc.txt")

    async def swap() -> None:
        await attacker.shell("mv inner/dir inner/moved && ln -s ../../elsewhere inner/dir")

    agent, _ = writer(attacker, [inner], swap)
    with pytest.raises(ResourceConflictError):
        await agent.call_tool("edit_file", path=str(inner / "dir" / "doc.txt"), old_text="original", new_text="owned")
    assert (attacker.ws / "elsewhere" / "doc.txt").read_text() == "original\n"
    assert sorted(os.listdir(attacker.ws / "elsewhere")) == ["doc.txt"]
    await still_serves(attacker)


async def test_symlink_swap_race_during_many_writes(attacker):
    """A command swaps the target between a regular file and a symlink to a victim in a tight loop while 40 writes are applied.

    Every write either lands in the regular file or fails with a typed error; the victim is never written.
    """
    inner = attacker.ws / "inner"
    await attacker.shell("mkdir inner && echo victim > victim.txt && echo start > inner/doc.txt")
    loop = ("end=$(($(date +%s) + 20)); while [ $(date +%s) -lt $end ] && [ ! -e stop ]; do "
            "ln -sf ../victim.txt inner/l.tmp && mv -T inner/l.tmp inner/doc.txt; "
            "echo start > inner/r.tmp && mv -T inner/r.tmp inner/doc.txt; done")
    racer = asyncio.ensure_future(attacker.run(["/bin/sh", "-c", loop], timeout=60))
    agent, _ = writer(attacker, [inner])
    outcomes: dict[str, int] = {}
    try:
        for attempt in range(40):
            try:
                await agent.call_tool("replace_file", path=str(inner / "doc.txt"), content=f"write {attempt}\n")
                outcomes["written"] = outcomes.get("written", 0) + 1
            except (ResourceConflictError, ValueError, FileNotFoundError) as error:
                outcomes[type(error).__name__] = outcomes.get(type(error).__name__, 0) + 1
    finally:
        (attacker.ws / "stop").touch()
        await racer
    assert (attacker.ws / "victim.txt").read_text() == "victim\n"
    assert sum(outcomes.values()) == 40
    figure("40 writes during a symlink swap loop", ", ".join(f"{name} {n}" for name, n in sorted(outcomes.items())))
    await still_serves(attacker)


async def test_hardlinks(attacker):
    """Hard links: to a root-owned secret in the writable root, and from inside the tool's root to a file outside it, then written.

    Linking a file the command does not own is refused (protected_hardlinks); writes replace the name atomically, so the linked file outside is never changed.
    """
    secret = attacker.ws / "secret.txt"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    os.chown(secret, 0, 0)
    result = await attacker.shell("ln secret.txt stolen.txt; mkdir inner && echo outside > outside.txt && "
                                  "ln outside.txt inner/link.txt && echo linked")
    assert "Operation not permitted" in result.stderr and "linked" in result.stdout
    assert not (attacker.ws / "stolen.txt").exists()
    agent, _ = writer(attacker, [attacker.ws / "inner"])
    await agent.call_tool("replace_file", path=str(attacker.ws / "inner" / "link.txt"), content="changed\n")
    assert (attacker.ws / "outside.txt").read_text() == "outside\n"
    assert (attacker.ws / "inner" / "link.txt").read_text() == "changed\n"
    await still_serves(attacker)


async def test_special_files(attacker):
    """A FIFO named like a text file and like a CSV (a reader that opens it would block forever), and a Unix socket.

    read_file and read_document refuse them as special files at once (gVisor refuses even to stat the socket, a host socket: PermissionError); search_files skips them.
    """
    await attacker.shell("mkfifo pipe.txt pipe.csv; "
                         "/opt/protolink/bin/python -c \"import socket; socket.socket(socket.AF_UNIX).bind('s.txt')\"")
    special = (ValueError, "special file")
    for path, (refusal, message) in {"pipe.txt": special, "s.txt": (PermissionError, None) if GVISOR else special}.items():
        with pytest.raises(refusal, match=message):
            await attacker.call("read_file", path=str(attacker.ws / path))
    with pytest.raises(ValueError):
        await attacker.call("read_document", path=str(attacker.ws / "pipe.csv"))
    found = await attacker.call("search_files", path=str(attacker.ws), query="x")
    assert found["items"] == []
    await still_serves(attacker)


async def test_nul_and_newline_in_paths(attacker):
    """Paths with a NUL byte, and file names with newlines and terminal escapes made by a command.

    NUL is refused before authorization; other names are taken literally: listed, read and created exactly as named.
    """
    with pytest.raises(ValueError, match="NUL"):
        await attacker.call("read_file", path=str(attacker.ws / "a\0b"))
    agent, requests = writer(attacker, [attacker.ws])
    with pytest.raises(ValueError, match="NUL"):
        await agent.call_tool("create_file", path=str(attacker.ws / "x\0y"), content="x")
    assert requests == []
    await attacker.shell("printf 'body\\n' > \"$(printf 'line1\\nline2.txt')\"; printf 'esc\\n' > \"$(printf 'e\\033[31m.txt')\"")
    listing = await attacker.call("list_files", path=str(attacker.ws))
    names = {Path(item["path"]).name for item in listing["items"]}
    assert {"line1\nline2.txt", "e\x1b[31m.txt"} <= names
    assert (await attacker.call("read_file", path=str(attacker.ws / "line1\nline2.txt")))["content"] == "body\n"
    await agent.call_tool("create_file", path=str(attacker.ws / "made\nby tool.txt"), content="made\n")
    assert (attacker.ws / "made\nby tool.txt").read_text() == "made\n"
    await still_serves(attacker)


async def test_over_long_names(attacker):
    """A 300-byte path component, and a path longer than the tools accept.

    A typed error (ENAMETOOLONG, or the argument limit before authorization); nothing is created; the sandbox serves on.
    """
    long_name = attacker.ws / ("n" * 300)
    with pytest.raises(OSError) as error:
        await attacker.call("read_file", path=str(long_name))
    assert error.value.errno == errno.ENAMETOOLONG
    agent, _ = writer(attacker, [attacker.ws])
    with pytest.raises(OSError):
        await agent.call_tool("create_file", path=str(long_name), content="x")
    with pytest.raises(ValueError):
        await attacker.call("read_file", path=str(attacker.ws / ("d/" * 3000)))
    assert os.listdir(attacker.ws) == []
    await still_serves(attacker)


async def test_dot_dot_escape(attacker, roots):
    """Paths that climb out of the root with '..' (to the read-only root's file, and to /etc/passwd).

    Refused before authorization: ValueError.
    """
    for path in (f"{attacker.ws}/../../ro/readme.txt", f"{attacker.ws}/../../../../etc/passwd"):
        with pytest.raises(ValueError, match=r"\.\."):
            await attacker.call("read_file", path=path)
    await still_serves(attacker)


async def test_read_only_root_written(attacker, roots):
    """Writing the read-only root: create_file and replace_file through the tools, and a shell redirect.

    The tools get ResourceUnchangedError (EROFS) from the sandbox, as from a read-only file system on the host (the root is mounted read-only there too); the shell gets EROFS (gVisor checks permissions first: EACCES); the mount is read-only; the host files are unchanged.
    """
    agent, _ = writer(attacker, [roots.ro])
    with pytest.raises(ResourceUnchangedError):
        await agent.call_tool("create_file", path=str(roots.ro / "new.txt"), content="x\n")
    with pytest.raises(ResourceUnchangedError):
        await agent.call_tool("replace_file", path=str(roots.ro / "readme.txt"), content="changed\n")
    result = await attacker.shell(f"echo changed > {roots.ro}/readme.txt; touch {roots.ro}/new2.txt")
    assert result.stderr.count("Permission denied" if GVISOR else "Read-only file system") == 2
    mounts = await attacker.run(["/bin/cat", "/proc/self/mountinfo"])
    assert [line.split()[5].split(",")[0] for line in mounts.stdout.splitlines() if line.split()[4] == str(roots.ro)] == ["ro"]
    assert (roots.ro / "readme.txt").read_text() == "read only\n"
    assert sorted(os.listdir(roots.ro)) == ["readme.txt"]
    assert (roots.ro / "readme.txt").stat().st_uid != NOBODY
    await still_serves(attacker)


async def test_executable_planted_earlier_on_path_after_a_resolution(attacker):
    """A command plants an executable earlier on PATH than the one an earlier call of the same bare name resolved to, so that the next call, whose resolution the client reuses without asking the sandbox, would start something its preview does not name.

    The sandbox resolves a reused answer again before starting it: that call fails with ValueError and nothing runs; the call after resolves afresh, and its preview names the planted file.
    """
    early, late = attacker.ws / "path-early", attacker.ws / "path-late"
    ran = attacker.ws / "path-ran"
    env = {"PATH": f"{early}:{late}:/usr/bin:/bin"}
    previews: list[str] = []

    async def approve(request, run) -> ApprovalDecision:
        previews.extend(artifact.content["argv"][0] for artifact in request.artifacts)
        return ApprovalDecision(approved=True, request_id=request.request_id)

    agent = Agent(AgentCard(name="runner"), policy=CapabilityPolicy({"process.execute": "require_approval"}),
                  approval_handler=approve)
    agent.add_tool(process_tool(backend=attacker.backend))
    setup = await attacker.shell(f"mkdir -p {early} {late} && printf '#!/bin/sh\\necho late >> {ran}\\n' > {late}/tool"
                                 f" && chmod 755 {late}/tool")
    assert setup.exit_code == 0, setup

    async def tool() -> object:
        return await agent.call_tool("execute_command", argv=["tool"], cwd=str(attacker.ws), env=env)

    assert (await tool()).exit_code == 0
    plant = await attacker.shell(f"printf '#!/bin/sh\\necho early >> {ran}\\n' > {early}/tool && chmod 755 {early}/tool")
    assert plant.exit_code == 0, plant
    with pytest.raises(ValueError, match="now resolves to .*path-early/tool.*nothing was started"):
        await tool()
    assert ran.read_text() == "late\n"
    assert (await tool()).exit_code == 0
    assert ran.read_text() == "late\nearly\n"
    assert previews == [f"{late}/tool", f"{late}/tool", f"{early}/tool"]
    await still_serves(attacker)
