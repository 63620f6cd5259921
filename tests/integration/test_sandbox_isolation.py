"""What a command inside a DockerSandbox can and cannot do, seen from inside and from the host."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from protolink.errors import SandboxUnavailableError
from protolink.sandbox.config import MiB
from protolink.sandbox.docker import DockerSandbox

pytestmark = pytest.mark.docker

MEMORY = 512 * MiB
PIDS = 256
TMPFS = 32 * MiB
DISK = 16 * MiB
PYTHON = "/opt/protolink/bin/python"


@pytest.fixture(scope="module")
def roots():
    with tempfile.TemporaryDirectory(prefix="protolink-ro-") as ro, tempfile.TemporaryDirectory(prefix="protolink-rw-") as rw:
        Path(ro, "readme.txt").write_text("read me\n")
        os.chmod(Path(ro, "readme.txt"), 0o644)
        for path in (ro, rw):
            os.chmod(path, 0o777)  # only the mount may stop the command uid (nobody) from writing
        yield Path(ro), Path(rw)


@pytest.fixture(scope="module")
async def sandbox(roots, sandbox_image):
    ro, rw = roots
    sandbox = DockerSandbox([ro], writable=[rw], image=sandbox_image, memory=MEMORY, pids=PIDS,
                            tmpfs_bytes=TMPFS, disk_bytes=DISK)
    async with sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def backend(sandbox):
    return sandbox.backend


async def sh(run, backend, script: str, **options):
    return await run(backend, ["/bin/sh", "-c", script], **options)


def status_field(text: str, name: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(name + ":"))


async def test_commands_have_no_capabilities_no_new_privileges_and_a_seccomp_filter(run, backend):
    result = await run(backend, ["/bin/cat", "/proc/self/status"])
    for field in ("CapEff", "CapPrm", "CapInh", "CapAmb"):
        assert int(status_field(result.stdout, field), 16) == 0, field
    assert status_field(result.stdout, "NoNewPrivs") == "1"
    assert status_field(result.stdout, "Seccomp") == "2"


async def test_commands_never_run_as_root(run, backend):
    result = await run(backend, ["/usr/bin/id", "-u"])
    assert result.exit_code == 0 and int(result.stdout) == 65534


async def test_the_root_file_system_is_read_only(run, backend):
    result = await sh(run, backend, "touch /usr/x || touch /etc/x || touch /x || echo refused")
    assert "Read-only file system" in result.stderr and result.stdout == "refused\n"


async def test_only_loopback_exists(run, backend):
    result = await run(backend, [PYTHON, "-c", "import socket; print([n for _, n in socket.if_nameindex()])"])
    assert result.stdout.strip() == "['lo']"


async def test_paths_outside_the_roots_are_absent(run, backend, roots):
    outside = [str(Path(__file__).resolve()), str(Path(tempfile.gettempdir()) / "protolink-outside"),
               "/var/run/docker.sock", "/run/docker.sock", "/root/.docker"]
    Path(outside[1]).mkdir(exist_ok=True)
    try:
        result = await run(backend, [PYTHON, "-c", "import os, sys; print([os.path.lexists(p) for p in sys.argv[1:]])",
                                     *outside])
    finally:
        Path(outside[1]).rmdir()
    assert result.stdout.strip() == str([False] * len(outside))
    listing = await run(backend, ["/bin/cat", str(roots[0] / "readme.txt")])
    assert listing.stdout == "read me\n"


async def test_read_only_roots_refuse_writes_and_writable_roots_accept_them(run, backend, roots):
    ro, rw = roots
    refused = await sh(run, backend, f"echo x > {ro}/new.txt")
    accepted = await sh(run, backend, f"echo x > {rw}/new.txt")
    assert refused.exit_code != 0 and "Read-only file system" in refused.stderr
    assert accepted.exit_code == 0 and (rw / "new.txt").read_text() == "x\n"


async def test_a_command_cannot_leave_a_setuid_root_binary_on_the_host(run, backend, roots):
    rw = roots[1]
    result = await sh(run, backend, f"cp /bin/sh {rw}/sh && chmod 4755 {rw}/sh; chown 0:0 {rw}/sh")
    info = (rw / "sh").stat()
    assert "Operation not permitted" in result.stderr
    assert info.st_uid == 65534 and info.st_uid != 0
    assert not (info.st_mode & stat.S_ISUID and info.st_uid == 0)


async def test_commands_cannot_signal_or_read_the_server(run, backend):
    result = await sh(run, backend, "kill -KILL 1; cat /proc/1/environ; cat /proc/1/maps; echo done")
    assert result.stdout == "done\n"
    assert result.stderr.count("Operation not permitted") + result.stderr.count("Permission denied") >= 3
    assert (await run(backend, ["/bin/true"])).exit_code == 0


async def test_tmp_is_bounded_and_not_executable(run, backend):
    fill = "for i in 1 2 3 4 5 6 7 8; do dd if=/dev/zero of=/tmp/fill$i bs=1M count=8 2>&1; done; rm -f /tmp/fill*"
    result = await sh(run, backend, f"{fill}; cp /bin/true /tmp/t && /tmp/t")
    assert "No space left on device" in result.stdout
    assert "Permission denied" in result.stderr


async def test_a_fork_bomb_ends_as_a_result_and_the_next_call_works(run, backend):
    """The pids limit stops the bomb and its timeout kills it. Under the container's CPU quota a
    bomb can starve the server past the client's keepalive (SECURITY.md, "CPU sharing"): the
    call then ends with SandboxUnavailableError instead of a timed-out result."""
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    try:
        result = await run(backend, [PYTHON, "-c", bomb], timeout=3)
    except SandboxUnavailableError:
        pass
    else:
        assert result.timed_out
    events = await run(backend, ["/bin/cat", "/sys/fs/cgroup/pids/pids.events"])
    assert int(events.stdout.split()[1]) > 0  # the pids limit was what stopped it
    assert (await run(backend, ["/bin/echo", "next"])).stdout == "next\n"


async def test_one_cpu_is_a_cpuset_without_a_quota(run, backend):
    """cpus=1 (the default) on an engine with more CPUs: the sandbox runs on one of them, with no
    CFS quota (under a quota a fork bomb stalls the server for seconds: SECURITY.md)."""
    affinity = await run(backend, [PYTHON, "-c", "import os; print(len(os.sched_getaffinity(0)))"])
    assert affinity.stdout == ("1\n" if (os.cpu_count() or 1) > 1 else f"{os.cpu_count()}\n")
    quota = await run(backend, ["/bin/sh", "-c", "cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us"])
    assert quota.stdout.split()[0] in ("max", "-1"), quota


async def test_a_memory_bomb_ends_as_a_result_and_the_next_call_works(run, backend):
    bomb = "chunks = []\nwhile True:\n    chunks.append(bytearray(32 << 20))\n"
    result = await run(backend, [PYTHON, "-c", bomb], timeout=60)
    assert result.exit_code not in (0, None) and not result.timed_out
    assert (await run(backend, ["/bin/echo", "next"])).stdout == "next\n"


async def test_one_file_cannot_outgrow_the_disk_budget(run, backend, roots):
    rw = roots[1]
    result = await sh(run, backend, f"dd if=/dev/zero of={rw}/big bs=1M count=64")
    assert result.exit_code != 0
    assert (rw / "big").stat().st_size <= DISK
    (rw / "big").unlink()


async def test_many_files_past_the_disk_budget_stop_the_command(run, backend, sandbox, roots):
    rw = roots[1] / "many"
    rw.mkdir()
    os.chmod(rw, 0o777)
    script = f"i=0; while [ $i -lt 400 ]; do dd if=/dev/zero of={rw}/f$i bs=1M count=1 2>/dev/null; i=$((i+1)); done"
    result = await sh(run, backend, script, timeout=120)
    written = sum(path.stat().st_size for path in rw.iterdir())
    assert result.exit_code != 0 and not result.timed_out  # killed, not finished
    assert written < 400 * MiB
    print(f"stopped after {written / MiB:.0f} MiB of a {DISK / MiB:.0f} MiB budget")
    for path in rw.iterdir():
        path.unlink()
    assert (await run(backend, ["/bin/echo", "next"])).stdout == "next\n"


async def test_the_disk_stop_kills_commands_and_spares_the_spawner_as_it_starts_one(run, backend, sandbox):
    """The stop of a spent disk budget kills the command user's processes, but not one whose
    saved uid is another (the spawner, which holds the command user as its real uid only in
    the instant it starts a command). Two processes stand in for them, started with
    ``docker exec`` while no command runs (the stray sweep would take them otherwise)."""
    def started(marker: str) -> str | None:
        top = sandbox._container.top(ps_args="-eo pid,args")["Processes"]
        return next((pid for pid, args in top if marker in args), None)

    container = sandbox._container
    container.exec_run([PYTHON, "-c", "import time; time.sleep(60)  # a command"], user="65534:65534", detach=True)
    container.exec_run([PYTHON, "-c", "import os, time; os.setresuid(65534, 65534, 0); time.sleep(60)  # spawner"],
                       detach=True)
    for _ in range(200):
        if started("# a command") and started("# spawner"):
            break
        await asyncio.sleep(0.05)
    spawner = started("# spawner")
    assert started("# a command") and spawner

    await asyncio.to_thread(sandbox._stop_commands)

    for _ in range(100):
        if not started("# a command"):
            break
        await asyncio.sleep(0.05)
    assert not started("# a command")
    assert started("# spawner") == spawner
    os.kill(int(spawner), 9)
    assert (await run(backend, ["/bin/echo", "next"])).stdout == "next\n"


async def test_git_works_in_a_repository_the_command_user_does_not_own(run, backend, roots):
    """A mounted checkout belongs to the host user, never to the sandbox's uid: git in a
    shell command still works (the image trusts every directory; the container is the guard)."""
    ro, _ = roots
    repo = ro / "checkout"
    if not repo.exists():
        repo.mkdir()
        subprocess.run(["git", "-C", str(repo), "init", "-q", "-b", "main"], check=True)
        subprocess.run(["chmod", "-R", "a+rX", str(repo)], check=True)
    result = await sh(run, backend, f"git -C {repo} status --short --branch")
    assert (result.exit_code, result.stdout) == (0, "## No commits yet on main\n")
