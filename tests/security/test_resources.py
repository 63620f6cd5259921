"""Resource attacks: bombs, spins, floods and daemons end as results; the sandbox serves on."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
from collections.abc import Awaitable
from pathlib import Path

import pytest

from protolink.errors import SandboxUnavailableError
from protolink.execution.process_types import ProcessResult
from protolink.sandbox.config import Limits
from protolink.sandbox.disk import usage_bytes
from protolink.sandbox.placements.docker import TMPFS_BYTES_PER_ENTRY

from .conftest import (GVISOR, HANG_GUARD, LIMITS, MiB, Attacker, dedicated_sandbox, ended_under_gvisor, figure,
                       still_serves)

pytestmark = pytest.mark.docker

#: A process refused a fork leaves a mark (once) in the working directory.
FORK_BOMB = """
import os
marked = False
while True:
    try:
        os.fork()
    except OSError:
        if not marked:
            marked = True
            try:
                open(f"refused-{os.getpid()}", "x").close()
            except OSError:
                pass
"""
#: Every child leaves its parent's session at once: no process group holds the bomb.
SETSID_FORK_BOMB = """
import os
while True:
    try:
        if os.fork() == 0:
            os.setsid()
    except OSError:
        pass
"""


async def pids_limit_hits(attacker: Attacker) -> int:
    events = await attacker.run(["/bin/cat", "/sys/fs/cgroup/pids/pids.events"])
    return int(events.stdout.split()[1])


async def times_out_or_starves_the_server(what: str, bomb: Awaitable[ProcessResult]) -> None:
    """A bomb's call ends as a timed-out result, or with SandboxUnavailableError when the bomb
    starved the server of CPU past the client's keepalive (SECURITY.md, "CPU sharing"); the
    outcome is a figure."""
    try:
        result = await bomb
    except SandboxUnavailableError as error:
        figure(f"{what}: the call ended with", f"SandboxUnavailableError ({error})")
        return
    figure(f"{what}: the call ended with", "a timed-out result")
    assert result.timed_out


async def serves_after_a_bomb(attacker: Attacker, what: str) -> None:
    """The sandbox serves after a fork bomb; under gVisor the bomb may have ended it instead (the
    Sentry's tasks are host threads: SECURITY.md)."""
    try:
        await still_serves(attacker)
    except SandboxUnavailableError as error:
        await ended_under_gvisor(attacker, what, error)


async def test_fork_bomb(lone_attacker):
    """A fork bomb (os.fork in a loop) run with execute_command.

    The pids limit stops its growth (under gVisor, which has no pids cgroup inside, the task limit of the command user): forks are refused; the timeout kills its process group (or, when the bomb starves the server past the client's keepalive, the call fails with SandboxUnavailableError and the group dies with it); the next call works. Under gVisor, whose tasks are host threads of the Sentry, a bomb may end the sandbox instead (a typed error).
    """
    before = None if GVISOR else await pids_limit_hits(lone_attacker)
    await times_out_or_starves_the_server("fork bomb", lone_attacker.python(FORK_BOMB, timeout=3))
    assert list(lone_attacker.ws.glob("refused-*")), "no fork was refused"
    if before is not None:
        assert await pids_limit_hits(lone_attacker) > before
    await serves_after_a_bomb(lone_attacker, "fork bomb")


async def test_setsid_fork_bomb(lone_attacker):
    """A fork bomb whose every child calls setsid, escaping the command's process group.

    While the command runs the bomb stays below its keeper (a child subreaper), whatever its sessions; at the timeout its group is killed, its keeper exits with it, and the stray sweep kills everything the bomb left until none is left; a command refused a process while their remains are reaped is tried again; the next call works. Under gVisor the bomb may end the sandbox instead (a typed error).
    """
    await times_out_or_starves_the_server("setsid fork bomb", lone_attacker.python(SETSID_FORK_BOMB, timeout=3))
    await serves_after_a_bomb(lone_attacker, "setsid fork bomb")


async def test_memory_bomb(lone_attacker):
    """A memory bomb: 32 MiB allocations in a loop, past the container's memory limit (swap included).

    The kernel kills the process (memory == memory+swap, no swap to hide in); the call is a non-zero result. Under gVisor, which has no cgroup files inside and no OOM killer of its own, the command's address-space limit (half the memory) stops it with MemoryError.
    """
    # A sandbox of its own: under gVisor the other half of the memory is all the server, its
    # workers and the Sentry have, and in the shared sandbox, after the document bombs, a CI run
    # saw the bomb fill the container: the host ended the Sentry, and 20 later tests with it.
    result = await lone_attacker.python("chunks = []\nwhile True:\n    chunks.append(bytearray(32 << 20))\n",
                                        timeout=60)
    assert result.exit_code not in (0, None) and not result.timed_out
    if GVISOR:
        assert "MemoryError" in result.stderr, result
    else:
        usage = await lone_attacker.run(["/bin/cat", "/sys/fs/cgroup/memory/memory.max_usage_in_bytes"])
        assert int(usage.stdout) <= LIMITS["memory"]
    await still_serves(lone_attacker)


async def test_cpu_spin_past_timeout(attacker):
    """A busy loop that never ends, with a 1 s timeout.

    The process group is killed at the timeout: timed_out=True, nothing keeps spinning.
    """
    result = await attacker.python("while True:\n    pass\n", timeout=1)
    assert result.timed_out and result.exit_code is not None and result.exit_code < 0
    await still_serves(attacker)


async def test_sigterm_ignoring_process(attacker):
    """A process that ignores SIGTERM (and its children that do too) past its timeout.

    After the grace period the whole group gets SIGKILL: timed_out, exit_code -9, nothing left.
    """
    # A shell ignores SIGTERM a millisecond of CPU after it starts; a Python start-up takes tens,
    # which on a loaded machine can fill the 1 s timeout: its SIGTERM would then end the command
    # before it ignored anything.
    result = await attacker.run(["/bin/sh", "-c", "trap '' TERM; sleep 1000 & sleep 1000"], timeout=1)
    assert result.timed_out and result.exit_code == -9
    await still_serves(attacker)


async def test_setsid_double_fork_daemon(attacker):
    """A daemon that double-forks, calls setsid and closes its pipes, then keeps writing a file.

    The command returns at once; its keeper exits with it, and the stray sweep kills the daemon, which stops writing.
    """
    beat = attacker.ws / "heartbeat"
    code = f"""
import os, sys, time
if os.fork():
    sys.exit(0)
os.setsid()
if os.fork():
    os._exit(0)
for fd in (0, 1, 2):
    os.close(fd)
while True:
    with open({str(beat)!r}, 'a') as out:
        out.write('.')
    time.sleep(0.05)
"""
    result = await attacker.python(code, timeout=30)
    assert result.exit_code == 0 and not result.timed_out
    size = beat.stat().st_size if beat.exists() else 0
    await asyncio.sleep(0.5)
    assert (beat.stat().st_size if beat.exists() else 0) == size
    await still_serves(attacker)


async def test_daemon_holding_the_output_pipes(attacker):
    """A background process that calls setsid and keeps the command's stdout and stderr open for 1000 s.

    The call returns once its own process exits (the pipes are drained for a bounded grace, as on the host); the holder is killed with everything else the command left.
    """
    result = await attacker.shell("setsid sleep 1000 & echo started")
    assert result.stdout == "started\n" and not result.timed_out
    await still_serves(attacker)


@pytest.mark.parametrize("channel", ["stdout", "stderr", "both"])
async def test_output_flood(attacker, channel):
    """About 1 GiB of output on stdout, stderr or both at once, with a 64 KiB cap.

    Output past the cap is read and discarded: truncated=True, at most 64 KiB kept, the command runs to its end.
    """
    flood = {"stdout": "head -c 1000000000 /dev/zero", "stderr": "head -c 1000000000 /dev/zero >&2",
             "both": "head -c 500000000 /dev/zero & head -c 500000000 /dev/zero >&2; wait"}[channel]
    started = asyncio.get_running_loop().time()
    result = await attacker.run(["/bin/sh", "-c", flood], timeout=120, max_output_bytes=65536)
    seconds = asyncio.get_running_loop().time() - started
    assert result.exit_code == 0 and not result.timed_out and result.truncated
    assert len(result.stdout.encode()) + len(result.stderr.encode()) <= 65536
    figure(f"1 GB output flood on {channel}, 64 KiB kept", f"{seconds:.1f} s")
    await still_serves(attacker)


async def test_invalid_utf8_flood(attacker):
    """Random bytes (invalid UTF-8, terminal escapes, NULs) flooding stdout.

    Decoded with replacement characters, capped; the stream and the result stay well-formed.
    """
    result = await attacker.run(["/bin/sh", "-c", "head -c 50000000 /dev/urandom"], timeout=60, max_output_bytes=4096)
    assert result.truncated and len(result.stdout.encode()) <= 4096 * 3  # U+FFFD is three bytes
    assert "\ufffd" in result.stdout
    await still_serves(attacker)


async def test_filling_tmp(attacker):
    """Filling /tmp (a tmpfs) with one file as large as dd can write.

    Writing fails with ENOSPC at the tmpfs size; the file is removed and the next call works.
    """
    result = await attacker.shell("dd if=/dev/zero of=/tmp/fill bs=1M count=1000 2>&1; du -k /tmp/fill; rm -f /tmp/fill")
    assert "No space left on device" in result.stdout
    written_kib = int(result.stdout.split()[-2])
    assert written_kib * 1024 <= LIMITS["tmpfs_bytes"]
    await still_serves(attacker)


@pytest.mark.parametrize("directory", ["/tmp", "/dev/shm"])
async def test_entry_flood_in_memory_file_systems(lone_attacker, directory):
    """A flood of empty files ("a billion files") in /tmp or /dev/shm, both tmpfs, for up to 30 s.

    Each tmpfs holds at most one entry per 4 KiB of its size: the flood ends with ENOSPC instead of filling the container's memory with inodes. gVisor's tmpfs has no entry limit: there the flood runs to its timeout, its entries in the Sentry's memory (bounded by the container's memory cgroup), and the sandbox serves after it, or is ended by it (a typed error).
    """
    code = ("import itertools, os, sys\nos.mkdir(sys.argv[1])\n"
            "for i in itertools.count():\n    open(f'{sys.argv[1]}/{i}', 'w').close()\n")
    flood = f"{directory}/flood"
    try:
        result = await lone_attacker.python(code, flood, timeout=30)
        if GVISOR and result.timed_out:
            figure(f"empty files in {directory} (gVisor)", "no entry limit: the flood ran to its 30 s timeout")
            await lone_attacker.run(["/bin/rm", "-rf", flood], timeout=120)
            await still_serves(lone_attacker)
            return
    except SandboxUnavailableError as error:
        await ended_under_gvisor(lone_attacker, f"empty files in {directory}", error)
        return
    assert not result.timed_out and "No space left on device" in result.stderr
    count = await lone_attacker.run(["/bin/sh", "-c", f"ls -f {flood} | wc -l; rm -rf {flood}"])
    limit = (LIMITS["tmpfs_bytes"] if directory == "/tmp" else Limits.shm_bytes) // TMPFS_BYTES_PER_ENTRY
    assert int(count.stdout.split()[0]) <= limit
    figure(f"empty files in {directory} before ENOSPC", count.stdout.split()[0])
    await still_serves(lone_attacker)


@pytest.fixture
async def budgeted(sandbox_image, tmp_path, request):
    """A sandbox of the test's own whose writable root has a disk budget (16 MiB, or the test's
    indirect parameter). One per test: after the entry flood, whose last measurement took 2.5 s,
    the watch spaced its periodic measurements to 20 times that, and the next test's writes landed
    until the file system's growth, which other jobs on the machine move both ways, happened to
    pass the budget (86-327 MiB of 400 in loaded runs)."""
    budget = getattr(request, "param", 16 << 20)
    root = tmp_path / "budget"
    root.mkdir()
    tmp_path.chmod(0o755)
    root.chmod(0o755)
    os.chown(root, 65534, 65534)
    try:
        async with dedicated_sandbox(sandbox_image, writable=[root], disk_bytes=budget) as box:
            yield box, root
    finally:
        # rm(1) walks a tree 1,100 levels deep by descriptors; pytest's own cleanup would
        # recurse past Python's limit on what a failed test left behind.
        subprocess.run(["rm", "-rf", str(root)], check=False)


def _deep_tree_mib(tree: Path) -> int:
    """MiB of the files in ``tree``, measured level by level through directory descriptors (no
    path gets longer than a name), by a process of its own (its recursion goes deeper than this
    one's limit)."""
    measure = ("import os, sys\nsys.setrecursionlimit(10000)\n"
               "print(sum(os.stat(name, dir_fd=fd).st_size for _, _, files, fd in os.fwalk(sys.argv[1]) "
               "for name in files) >> 20)\n")
    return int(subprocess.run([sys.executable, "-c", measure, str(tree)], capture_output=True, text=True,
                              check=True, timeout=HANG_GUARD).stdout)


def _tree_bytes(root: Path) -> int:
    return sum(path.lstat().st_size for path in root.rglob("*"))


async def test_disk_budget_one_large_file(budgeted):
    """One file written past the writable root's 16 MiB disk budget.

    The write fails inside the sandbox (RLIMIT_FSIZE); the host file never exceeds the budget.
    """
    box, root = budgeted
    attacker = Attacker(box.backend, root)
    result = await attacker.shell("dd if=/dev/zero of=big bs=1M count=64")
    assert result.exit_code != 0
    assert (root / "big").stat().st_size <= 16 << 20
    (root / "big").unlink()
    await still_serves(attacker)


async def test_disk_budget_many_files(budgeted):
    """Many 1 MiB files in the writable root, 400 MiB in all, each under the per-file limit.

    The host's disk watch sees the budget spent and kills the command; far less than 400 MiB lands on the host.
    """
    box, root = budgeted
    attacker = Attacker(box.backend, root)
    script = "i=0; while [ $i -lt 400 ]; do dd if=/dev/zero of=f$i bs=1M count=1 2>/dev/null; i=$((i+1)); done"
    result = await attacker.run(["/bin/sh", "-c", script], timeout=120)
    written = _tree_bytes(root)
    assert result.exit_code != 0 and not result.timed_out
    assert written < 400 << 20
    figure("disk budget 16 MiB, many 1 MiB files: written before stopped", f"{written / (1 << 20):.0f} MiB")
    for path in root.glob("f*"):
        path.unlink()
    await still_serves(attacker)


# A 2 MiB budget is 8,192 entries. Under gVisor an entry costs about a millisecond: the 65,536 of
# a 16 MiB budget took about as long as the flood's timeout, and load decided which came first.
@pytest.mark.parametrize("budgeted", [2 << 20], ids=["2MiB"], indirect=True)
async def test_disk_budget_entry_flood(budgeted):
    """A flood of empty files and directories in the writable root (inodes, not bytes), for up to 40 s, against a 2 MiB budget.

    Each entry counts against the disk budget; the disk watch kills the command long before the host runs out of inodes.
    """
    box, root = budgeted
    attacker = Attacker(box.backend, root)
    code = ("import os, itertools\nos.mkdir('flood')\n"
            "for i in itertools.count():\n    open(f'flood/{i}', 'w').close()\n")
    result = await attacker.python(code, timeout=40)
    entries = sum(1 for _ in (root / "flood").iterdir())
    assert result.exit_code != 0 and not result.timed_out
    figure("disk budget 2 MiB, empty-file flood: entries before stopped", str(entries))
    await attacker.shell("rm -rf flood")
    await still_serves(attacker)


async def test_disk_budget_deep_tree(budgeted):
    """1 MiB files written (and synced) at the bottom of a directory chain 1,100 levels deep (a path of 5,500 characters, past the host's PATH_MAX), 400 MiB in all.

    The host's disk watch measures the tree exactly at any depth (one directory descriptor at a time, opening each level relative to the last and going back up through ``..``): the command is killed long before 400 MiB land. Other jobs writing to the host's file system do not count against the sandbox: once the tree is removed, the watch stops nothing more and the sandbox serves the next commands.
    """
    box, root = budgeted
    attacker = Attacker(box.backend, root)
    code = ("import os\nos.mkdir('deep')\nos.chdir('deep')\nfor _ in range(1100):\n    os.mkdir('dddd')\n"
            "    os.chdir('dddd')\nfor index in range(400):\n    with open(f'f{index}', 'wb') as out:\n"
            "        out.write(b'x' * (1 << 20))\n        os.fsync(out.fileno())\n")
    result = await attacker.python(code, timeout=120)
    assert result.exit_code != 0 and not result.timed_out
    # Measured on the host, where the files land, once they stop growing: under gVisor the Sentry
    # writes back what it had cached after the writer died. (A command could not measure it: the
    # watch stops commands while the roots grow, for as long as the write-back takes on a loaded
    # machine.)
    written = -1
    for _ in range(int(HANG_GUARD / 0.5)):
        previous, written = written, await asyncio.to_thread(_deep_tree_mib, root / "deep")
        if written == previous:
            break
        await asyncio.sleep(0.5)
    # The watch's walk measures the whole tree: the file system's growth, which counts every
    # other writer on the host, never stands in for it.
    assert (await asyncio.to_thread(usage_bytes, [str(root)])).complete
    await attacker.run(["/bin/rm", "-rf", "deep"], timeout=120)
    subprocess.run(["rm", "-rf", str(root / "deep")], check=True)  # what a stopped rm left
    assert written < 400
    figure("disk budget 16 MiB, 1 MiB files 1,100 levels deep: written before stopped", f"{written} MiB")
    stops = box._watch.exceeded
    await still_serves(attacker)
    assert box._watch.exceeded == stops, "the watch stopped commands after the tree was gone"


async def test_cpu_hog_beside_other_calls(lone_attacker):
    """100 processes spinning on the CPU for 10 s while the agent reads a file; before that, a command tries to raise its own priority.

    Commands run at nice 19 and cannot go lower (RLIMIT_NICE 0): the server and its workers keep the CPU they need, the read is answered (or, at worst, reported as SandboxUnavailableError); the hog ends at its timeout and nothing is left. gVisor does not enforce RLIMIT_NICE (the command's nice is the Sentry's record, which does not decide what runs on the host's CPUs), and its Sentry runs the server as one task among the 100: the server answers slowly until the hog's keeper (a small C process, which needs little of the CPU) kills the hog's group at its timeout and grace, then serves again with nothing left, and the hog's call ends timed out. The sandbox is the test's own, so a slow one delays no other test.
    """
    attacker = lone_attacker
    code = ("import json, os\nnice = os.getpriority(os.PRIO_PROCESS, 0)\ntry:\n"
            "    os.setpriority(os.PRIO_PROCESS, 0, 0)\n    raised = 0\nexcept OSError as error:\n"
            "    raised = error.errno\nprint(json.dumps([nice, raised]))\n")
    assert await attacker.probe(code) == [19, 0 if GVISOR else errno.EACCES]
    hog = asyncio.ensure_future(attacker.python(
        "import os\nfor _ in range(100):\n    if os.fork() == 0:\n        break\nwhile True:\n    pass\n", timeout=10))
    await asyncio.sleep(2)
    (attacker.ws / "during.txt").write_text("during\n")
    started = asyncio.get_running_loop().time()
    try:
        read = await attacker.call("read_file", path=str(attacker.ws / "during.txt"), guard=HANG_GUARD * 2)
        outcome = f"read_file answered after {asyncio.get_running_loop().time() - started:.1f} s"
        assert read["content"] == "during\n"
    except SandboxUnavailableError:
        outcome = f"read_file failed with SandboxUnavailableError after {asyncio.get_running_loop().time() - started:.1f} s"
    assert (await hog).timed_out
    figure(f"read_file beside 100 spinning processes{' (gVisor)' if GVISOR else ''}", outcome)
    await still_serves(attacker)


OOM_PRESSURE = r"""
import json, os, sys, time
def server_processes():
    found = {}
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            command = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\0')
            uid = int(open(f'/proc/{pid}/status').read().split('\nUid:')[1].split()[0])
            adjust = int(open(f'/proc/{pid}/oom_score_adj').read())
        except (OSError, IndexError, ValueError):
            continue
        if uid == 0 and b'-m' in command and command[command.index(b'-m') + 1] == b'protolink_sandboxd':
            found[int(pid)] = adjust
    return found
before = server_processes()
mine = int(open('/proc/self/oom_score_adj').read())
children = []
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        hoard = b'\x01' * (16 << 20)  # smaller than the server
        time.sleep(60)
        os._exit(0)
    children.append(pid)
time.sleep(3)
ended, deadline = set(), time.monotonic() + 30  # a hang guard: on a loaded machine filling takes longer
while True:
    ended |= {pid for pid in children if pid not in ended and os.waitpid(pid, os.WNOHANG) != (0, 0)}
    if ended or time.monotonic() > deadline:
        break
    time.sleep(0.1)
killed = len(ended)
print(json.dumps({"before": before, "after": server_processes(), "mine": mine, "killed": killed}))
"""


async def test_out_of_memory_among_many_small_processes(sandbox_image):
    """Eighty processes of 16 MiB each, smaller than the server, fill a 512 MiB sandbox: by size alone the kernel's OOM killer would pick the server (or a worker) first.

    Commands start with oom_score_adj 1000 (set by the spawner; workers have 500, the server 0): the killer takes commands only, the server's processes are the same before and after, and the next calls work. gVisor has no OOM killer of its own: there the host's ends the Sentry, and with it the sandbox (a typed error).
    """
    async with dedicated_sandbox(sandbox_image, memory=512 * MiB) as box:
        attacker = Attacker(box.backend, Path("/tmp"))
        try:
            seen = await attacker.probe(OOM_PRESSURE, "80", timeout=60)
        except SandboxUnavailableError as error:
            await ended_under_gvisor(attacker, "80 processes of 16 MiB in 512 MiB", error)
            return
        assert seen["mine"] == 1000
        assert seen["before"] and set(seen["before"].values()) == {0}
        assert seen["after"] == seen["before"]
        assert seen["killed"] > 0
        figure("80 processes of 16 MiB in 512 MiB", f"{seen['killed']} commands killed by the OOM killer, "
                                                    f"server processes unchanged")
        assert (await attacker.run(["/bin/echo", "next"])).stdout == "next\n"
