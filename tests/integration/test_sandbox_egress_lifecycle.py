"""A sandbox's host side of egress lives exactly as long as the sandbox: started once its server
answers, closed on every exit, never left running after a failed start."""

from __future__ import annotations

import asyncio
import os

import pytest

from protolink.errors import SandboxUnavailableError
from protolink.sandbox import docker as sandbox_docker
from protolink.sandbox import leftovers
from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.egress import dialer, service
from protolink.sandbox.egress.policy import DENY_ALL, EgressPolicy

pytestmark = pytest.mark.docker


def _dialing() -> list[asyncio.Task]:
    """The RelayDialer tasks of this loop that keep standby connections."""
    return [task for task in asyncio.all_tasks() if task.get_coro().__qualname__ == "RelayDialer._keep"]


def _containers(client, session: str) -> list:
    return client.containers.list(all=True, filters={"label": f"{leftovers.SESSION_LABEL}={session}"})


async def test_egress_starts_with_the_sandbox_and_stops_with_it(docker_client, sandbox_image, tmp_path):
    sandbox = DockerSandbox([tmp_path], image=sandbox_image, egress=["example.org:443"])
    async with sandbox:
        assert sandbox.egress == EgressPolicy.parse(["example.org:443"])
        assert len(_dialing()) == 4
        await sandbox.set_egress(DENY_ALL)
        assert sandbox.egress is DENY_ALL
        await sandbox.set_egress(["example.org"])  # rule texts will do
        assert sandbox.egress == EgressPolicy.parse(["example.org"])
    assert _dialing() == []
    with pytest.raises(RuntimeError, match="running sandbox"):
        await sandbox.set_egress(DENY_ALL)


async def test_a_sandbox_without_egress_cannot_be_opened_later(sandbox_image, tmp_path):
    sandbox = DockerSandbox([tmp_path], image=sandbox_image)
    async with sandbox:
        assert sandbox.egress is None and _dialing() == []
        with pytest.raises(RuntimeError, match="started with egress="):
            await sandbox.set_egress(["example.org"])


async def test_a_relay_that_does_not_answer_fails_the_start_and_leaves_nothing(docker_client, sandbox_image,
                                                                                 tmp_path, monkeypatch):
    monkeypatch.setattr(service, "SOCKET_NAME", "not-the-relay.sock")
    monkeypatch.setattr(dialer, "START_SECONDS", 0.5)
    sandbox = DockerSandbox([tmp_path], image=sandbox_image, egress=DENY_ALL)
    with pytest.raises(SandboxUnavailableError, match="egress relay does not answer"):
        await sandbox.start()
    assert _containers(docker_client, sandbox.session) == [] and _dialing() == []
    assert sandbox.address is not None
    assert not os.path.exists(os.path.dirname(sandbox.address.removeprefix("unix://")))


async def test_a_failure_after_egress_started_closes_it(docker_client, sandbox_image, tmp_path, monkeypatch):
    writable = tmp_path / "rw"
    writable.mkdir()
    os.chown(writable, 65534, 65534)

    async def refuse(self) -> None:
        raise OSError("the disk watch could not start")

    monkeypatch.setattr(sandbox_docker.DiskWatch, "start", refuse)
    sandbox = DockerSandbox(writable=[writable], image=sandbox_image, egress=DENY_ALL)
    with pytest.raises(OSError, match="disk watch"):
        await sandbox.start()
    assert _dialing() == [] and _containers(docker_client, sandbox.session) == []
