"""The egress daemon's control loop, on a real control socket, with the egress service replaced
by a recorder (the proxy and the relay have tests of their own): the policy changes live, a
bad rule is refused and changes nothing, the daemon ends on ``stop`` and when the container is
gone, and leaves neither its socket nor its pid file."""

from __future__ import annotations

import asyncio
import json
import os
import stat

import pytest

from protolink.sandbox.egress import daemon as daemon_module
from protolink.sandbox.egress.control import EgressFiles, EgressRequestError, ask
from protolink.sandbox.egress.daemon import Daemon
from protolink.sandbox.egress.policy import TEST_ALLOW_LOOPBACK, parse_policy


class Recorder:
    """Stands for EgressService: records what the daemon asks of it."""

    started: list[Recorder] = []

    def __init__(self, channel_dir, policy, sandbox, on_event) -> None:
        self.channel_dir, self.policy, self.sandbox, self.on_event = channel_dir, policy, sandbox, on_event
        self.closed = False

    @classmethod
    async def start(cls, channel_dir, policy, *, sandbox, on_event=None):
        service = cls(channel_dir, policy, sandbox, on_event)
        cls.started.append(service)
        return service

    def set_policy(self, policy) -> None:
        self.policy = policy

    async def aclose(self) -> None:
        self.closed = True


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    monkeypatch.setenv("PROTOLINK_RUNTIME_DIR", str(path))
    monkeypatch.setattr(daemon_module, "EgressService", Recorder)
    Recorder.started.clear()
    return path


def make(tmp_path, monkeypatch, allow, alive=lambda: True) -> Daemon:
    channel = tmp_path / "channel"
    channel.mkdir(exist_ok=True)
    monkeypatch.setattr(daemon_module, "container_watch", lambda container_id, pid: (alive, 0.02))
    return Daemon("box", channel, "0123456789ab", 0, allow)


async def running(daemon: Daemon) -> asyncio.Task:
    task = asyncio.create_task(daemon.run())
    for _ in range(500):
        if EgressFiles.of("box").socket.exists():
            return task
        await asyncio.sleep(0.01)
    raise AssertionError("the daemon did not open its control socket")


async def test_the_policy_changes_live_and_a_bad_rule_changes_nothing(runtime, tmp_path, monkeypatch):
    daemon = make(tmp_path, monkeypatch, ["pypi.org:443"])
    task = await running(daemon)
    files = EgressFiles.of("box")
    assert stat.S_IMODE(files.socket.stat().st_mode) == 0o600
    assert json.loads(files.pid.read_text())["pid"] == os.getpid()
    service = Recorder.started[-1]
    assert service.channel_dir == tmp_path / "channel" and service.sandbox == "box"
    assert service.on_event.__self__.path == files.events  # decisions go to the log

    status = await ask("box", "status")
    assert status["allow"] == ["pypi.org:443"] and status["deny_all"] is False

    with pytest.raises(EgressRequestError):
        await ask("box", "set", allow=["pypi.org:443", "two words"])
    assert (await ask("box", "status"))["allow"] == ["pypi.org:443"]

    denied = await ask("box", "set", allow=[])
    assert denied["deny_all"] is True and service.policy.denies_all
    reopened = await ask("box", "set", allow=["*.pythonhosted.org:443"])
    assert reopened["allow"] == ["*.pythonhosted.org:443"] and not service.policy.denies_all

    for request in ({"op": "nope"}, {"op": "set", "allow": "pypi.org"}):
        with pytest.raises(EgressRequestError):
            await ask("box", **request)

    await ask("box", "stop")
    await asyncio.wait_for(task, 10)
    assert service.closed and not files.socket.exists() and not files.pid.exists()


async def test_it_ends_by_itself_when_the_container_is_gone(runtime, tmp_path, monkeypatch):
    alive = [True]
    task = await running(make(tmp_path, monkeypatch, ["pypi.org"], alive=lambda: alive[0]))
    await asyncio.sleep(0.1)
    assert not task.done()
    alive[0] = False
    await asyncio.wait_for(task, 10)
    assert Recorder.started[-1].closed and not EgressFiles.of("box").socket.exists()


async def test_it_ends_when_down_removed_the_channel_directory(runtime, tmp_path, monkeypatch):
    task = await running(make(tmp_path, monkeypatch, ["pypi.org"]))
    (tmp_path / "channel").rmdir()
    await asyncio.wait_for(task, 10)


def test_loopback_is_reachable_only_under_the_test_only_opt_in(monkeypatch):
    monkeypatch.delenv(TEST_ALLOW_LOOPBACK, raising=False)
    assert parse_policy(["127.0.0.1/32:80"]).addresses.denial("127.0.0.1") is not None
    monkeypatch.setenv(TEST_ALLOW_LOOPBACK, "1")
    assert parse_policy(["127.0.0.1/32:80"]).addresses.denial("127.0.0.1") is None
    assert parse_policy([]).denies_all
