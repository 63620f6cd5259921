"""Egress of a sandbox on a Swarm node: its node's gateway dials the task's relay and carries its
commands' connections to the service, whose proxy decides them, as on one host. The test's HTTP
server listens on this host's loopback, which a policy reaches only through the test-only opt-in
``PROTOLINK_EGRESS_TEST_ALLOW_LOOPBACK=1`` (in this process: the service runs here)."""

from __future__ import annotations

import asyncio
import secrets
from contextlib import closing
from dataclasses import replace

import pytest

from protolink.sandbox.client import attach
from protolink.sandbox.egress.policy import DENY_ALL, TEST_ALLOW_LOOPBACK
from protolink.sandbox.service import sandboxes
from protolink.sandbox.service.config import Overrides
from protolink.sandbox.service.events import Events, ServiceEvent
from protolink.sandbox.service.on_swarm import OnSwarm
from protolink.sandbox.service.tokens import DIGEST_ID_CHARS
from tests.conftest import TEST_NAME_PREFIX
from tests.integration.test_sandbox_cli_egress import FETCH, server  # noqa: F401 (a fixture)
from tests.swarm_cluster import eventually, wait_until

# Root: the cluster makes a veth pair and removes its nodes' cgroups.
pytestmark = [pytest.mark.docker, pytest.mark.root, pytest.mark.timeout(900)]
#: The image's Python.
PYTHON = "/opt/protolink/bin/python"


@pytest.fixture(autouse=True)
def loopback_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEST_ALLOW_LOOPBACK, "1")


def _now(check):
    """``check`` as the async check :func:`eventually` takes."""

    async def checked():
        return check()

    return checked


def _containers_left(cluster) -> list[str]:
    found = []
    for node in cluster.nodes:
        with closing(node.client()) as client:
            found += [f"{node.container}: {c['Names']}" for c in client.api.containers(all=True)]
    return found


async def test_a_swarm_sandbox_fetches_from_an_allowed_host_and_a_host_not_listed_is_refused_and_audited(
        swarm_service, run, server):  # noqa: F811 (the fixture)
    sandbox = await swarm_service.client.create(allow=[f"127.0.0.1/32:{server}"])
    fetched = await run(sandbox.backend, [PYTHON, "-c", FETCH, f"http://127.0.0.1:{server}/"])
    refused = await run(sandbox.backend, [PYTHON, "-c", FETCH, f"http://not-listed.example:{server}/"])
    assert (fetched.exit_code, fetched.stdout) == (0, "hello through the proxy\n"), fetched.stderr
    assert refused.exit_code != 0 and "403" in refused.stderr, refused.stderr
    await sandbox.delete()

    def decisions() -> list[tuple[str, str]]:
        return [(record["fields"]["decision"], record["fields"]["host"]) for record in swarm_service.audit()
                if record["kind"] == "egress" and record["fields"]["sandbox"] == sandbox.id]

    await eventually(_now(lambda: ("closed", "127.0.0.1") in decisions()), "the allowed connection's end in the audit log")
    assert ("allowed", "127.0.0.1") in decisions()
    (denial,) = [record["fields"] for record in swarm_service.audit()
                 if record["kind"] == "egress" and record["fields"]["decision"] == "denied"]
    assert denial["host"] == "not-listed.example" and "not-listed.example" in denial["reason"], denial
    wait_until(lambda: not _containers_left(swarm_service.cluster), "every node to have no container left")


async def test_a_restarted_service_serves_the_egress_of_the_swarm_sandbox_it_adopts(
        swarm_service, run, server):  # noqa: F811
    sandbox = await swarm_service.client.create(allow=[f"127.0.0.1/32:{server}"])
    before = await run(sandbox.backend, [PYTHON, "-c", FETCH, f"http://127.0.0.1:{server}/"])
    await sandbox.backend.aclose()
    await swarm_service.stop()
    client = await swarm_service.start()
    again = await client.open(sandbox.id)
    after = await run(again.backend, [PYTHON, "-c", FETCH, f"http://127.0.0.1:{server}/"])
    assert [before.stdout, after.stdout] == ["hello through the proxy\n"] * 2, after.stderr
    await again.delete()


class _Recorded:
    def __init__(self) -> None:
        self.events: list[ServiceEvent] = []

    def record(self, event: ServiceEvent) -> None:
        self.events.append(event)

    def egress(self, decision: str) -> list[dict]:
        return [event.fields for event in self.events if event.kind == "egress" and event.fields["decision"] == decision]


async def test_deny_all_closes_a_swarm_sandboxs_open_connections(swarm_service, run, server):  # noqa: F811
    """The service's placement on Swarm (:class:`OnSwarm`) with a sink of its own: the test holds
    the sandbox's egress, as the service does, and changes its policy."""
    recorded = _Recorded()
    placement = OnSwarm(f"{TEST_NAME_PREFIX}eg-{secrets.token_hex(3)}", swarm_service.config.swarm, Events([recorded]))
    template = replace(swarm_service.config.templates["default"], allow=(f"127.0.0.1/32:{server}",))
    placed = sandboxes.new_placed(sandboxes.new_id(), secrets.token_hex(DIGEST_ID_CHARS // 2), template, Overrides())
    await placement.open()
    try:
        await placement.start(placed, Overrides())
        assert placed.node in swarm_service.config.swarm.gateways and placed.egress is not None
        backend = await attach(placed.channel())
        try:
            downloading = asyncio.ensure_future(run(backend, [PYTHON, "-c", FETCH, f"http://127.0.0.1:{server}/slow"],
                                                    timeout=300))
            await eventually(_now(lambda: recorded.egress("allowed") or downloading.done()), "the download to be allowed")
            placed.egress.set_policy(DENY_ALL)
            cut = await downloading
        finally:
            await backend.aclose()
        assert cut.exit_code != 0, cut.stdout
        await eventually(_now(lambda: recorded.egress("closed")), "the download's connection to close")
        (closed,) = recorded.egress("closed")
        assert closed["reason"] == "deny-all" and closed["bytes_down"] < 600 * 1024, closed
    finally:
        await placement.remove(placed)
        await placement.close()
