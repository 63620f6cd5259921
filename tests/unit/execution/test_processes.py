"""LocalProcesses details: no pidfd (a waiter thread reaps), spawn failures, another launcher
and its own kill at the deadline."""

import asyncio
import os
import signal

import pytest

from protolink.execution.local_processes import (
    HostLauncher,
    LocalProcesses,
    start_process,
)
from protolink.execution.process_types import ProcessSpec
from tests.descriptors import open_descriptors


class Exited:
    """A leader that has already been reaped."""

    def __init__(self, pid, code, *, killed_at_deadline=False):
        self.pid, self.exit_code, self.killed_at_deadline = pid, code, killed_at_deadline
        self.exited = asyncio.get_running_loop().create_future()
        self.exited.set_result(None)

    def close(self):
        pass


class Events:
    def __init__(self):
        self.seen = []

    async def emit(self, type, **data):
        self.seen.append((type, data))


@pytest.fixture
def without_pidfd(monkeypatch):
    monkeypatch.delattr(os, "pidfd_open")


async def test_exit_code_and_output_without_pidfd(without_pidfd, tmp_path):
    events = Events()
    spec = ProcessSpec(("/bin/sh", "-c", "echo hi; exit 3"), str(tmp_path), {}, 30, 100)
    result = await LocalProcesses(HostLauncher()).execute(spec, events)
    assert (result.exit_code, result.stdout, result.timed_out) == (3, "hi\n", False)
    assert events.seen == [("process.output", {"channel": "stdout", "text": "hi\n"})]


async def test_timeout_without_pidfd(without_pidfd, tmp_path):
    spec = ProcessSpec(("/bin/sh", "-c", "exec sleep 30"), str(tmp_path), {"PATH": "/usr/bin:/bin"},
                       0.3, 100)
    result = await LocalProcesses(HostLauncher()).execute(spec, Events())
    assert result.timed_out and result.exit_code == -15


async def test_a_command_that_cannot_start_is_a_clear_error(tmp_path):
    spec = ProcessSpec((str(tmp_path / "missing"),), str(tmp_path), {}, 5, 100)
    before = open_descriptors()
    with pytest.raises(RuntimeError, match="could not start"):
        await LocalProcesses(HostLauncher()).execute(spec, Events())
    assert open_descriptors() == before


async def test_a_launcher_of_its_own_starts_every_command(tmp_path):
    class Private(HostLauncher):
        async def launch(self, spec, stdout, stderr, stdin=None):
            popen = start_process(spec.argv, spec.cwd, spec.env, stdout, stderr, stdin, umask=0o077)
            popen.wait()
            return Exited(popen.pid, popen.returncode)

    spec = ProcessSpec(("/bin/sh", "-c", "echo x > made"), str(tmp_path), {}, 5, 100)
    assert (await LocalProcesses(Private()).execute(spec, Events())).exit_code == 0
    assert (tmp_path / "made").stat().st_mode & 0o777 == 0o600


async def test_a_group_its_launcher_killed_at_the_deadline_timed_out(tmp_path):
    """A launcher may kill the group at the deadline itself (the sandbox's keeper, when the server
    is starved): the exit may reach this process before its own timer, and is still a timeout."""
    class Guarded(HostLauncher):
        async def launch(self, spec, stdout, stderr, stdin=None):
            popen = start_process(spec.argv, spec.cwd, spec.env, stdout, stderr, stdin)
            popen.kill()
            popen.wait()
            return Exited(popen.pid, popen.returncode, killed_at_deadline=self.kills)

    spec = ProcessSpec(("/bin/sleep", "60"), str(tmp_path), {}, 30, 100)
    launcher = Guarded()
    for launcher.kills in (True, False):
        result = await LocalProcesses(launcher).execute(spec, Events())
        assert (result.exit_code, result.timed_out) == (-signal.SIGKILL, launcher.kills)


async def test_a_process_started_as_its_call_is_canceled_is_killed(tmp_path):
    """The launch finished, but the call was canceled before it could supervise the process: the
    process dies rather than run on unwatched."""
    started = []

    class Racing(HostLauncher):
        async def launch(self, spec, stdout, stderr, stdin=None):
            leader = await super().launch(spec, stdout, stderr, stdin)
            started.append(leader)
            call.cancel()  # the call is canceled as the launch returns
            return leader

    spec = ProcessSpec(("/bin/sleep", "60"), str(tmp_path), {}, 30, 100)
    call = asyncio.ensure_future(LocalProcesses(Racing()).execute(spec, Events()))
    with pytest.raises(asyncio.CancelledError):
        await call
    [leader] = started
    assert await asyncio.to_thread(leader._popen.wait, 10) == -signal.SIGKILL


async def test_an_emitter_that_fails_ends_the_call_with_its_error_once_the_command_ends(tmp_path):
    class Failing:
        async def emit(self, type, **data):
            raise RuntimeError("the subscriber broke")

    script = "head -c 8000000 /dev/zero; echo done > finished"
    spec = ProcessSpec(("/bin/sh", "-c", script), str(tmp_path), {"PATH": "/usr/bin:/bin"}, 60, 10**8)
    with pytest.raises(RuntimeError, match="the subscriber broke"):
        await asyncio.wait_for(LocalProcesses(HostLauncher()).execute(spec, Failing()), 30)
    assert (tmp_path / "finished").read_text() == "done\n"  # the command was not held back
