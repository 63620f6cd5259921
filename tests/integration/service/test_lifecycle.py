"""Warm pools, deadlines, and a service that is killed and started again."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from protolink.errors import SandboxLostError, SandboxNotFoundError
from protolink.sandbox.service import labels

pytestmark = pytest.mark.docker

#: A hang guard, never a measure.
WAIT_SECONDS = 120.0


async def eventually(check, what: str):
    """Ask ``check()`` until it answers something true; fails after WAIT_SECONDS."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not (found := await check()):
        assert time.monotonic() < deadline, f"still not {what} after {WAIT_SECONDS:g} s"
        await asyncio.sleep(0.1)
    return found


def containers(docker_client, service) -> dict[str, str]:
    """The service's containers: name -> id. One listing, no look at each container after it: one
    that the service removes meanwhile is simply not there (nor one the engine is removing, which
    it lists without a name)."""
    found = docker_client.api.containers(all=True, filters={"label": f"{labels.SERVICE}={service.name}"})
    return {container["Names"][0].lstrip("/"): container["Id"] for container in found if container.get("Names")}


async def test_the_pool_serves_a_plain_create_and_refills(make_service, docker_client, run):
    service = make_service("--pool", "1")
    client = await service.client()

    async def one_ready():
        return (await client.pool_ready()).get("default") == 1

    await eventually(one_ready, "one pooled sandbox ready")
    pooled = await client.create()
    assert pooled.status.pooled
    changed = await client.create(memory_mib=256)  # a create that changes something starts cold
    assert not changed.status.pooled
    assert (await run(pooled.backend, ["/bin/echo", "warm"])).stdout == "warm\n"
    await eventually(one_ready, "the pool refilled")
    await pooled.delete()  # single use: deleted, never returned to the pool
    await changed.delete()
    names = containers(docker_client, service)
    assert not any(pooled.id in name for name in names), names
    assert len([name for name in names if ".pool." in name]) == 1, names


async def test_a_killed_service_adopts_its_sandboxes_and_drops_its_pool(make_service, docker_client, run):
    service = make_service("--pool", "1")
    client = await service.client()
    kept = await client.create(workspace=True, labels={"job": "42"}, ttl_seconds=3600)
    made = await run(kept.backend, ["/bin/sh", "-c", "echo kept > note.txt"], cwd=kept.status.workspace)
    assert made.exit_code == 0, made.stderr

    async def pool_member():
        return [name for name in containers(docker_client, service) if ".pool." in name]

    leftover = (await eventually(pool_member, "a pool member started"))[0]
    first_expiry = kept.status.expires
    renewed = await kept.renew(7200)
    assert renewed.expires > first_expiry + 3000
    service.kill()
    service.start()
    client = await service.client()
    listed = {status.id: status for status in await client.list()}
    assert listed[kept.id].labels == {"job": "42"} and listed[kept.id].workspace == kept.status.workspace
    assert listed[kept.id].expires == pytest.approx(renewed.expires, abs=0.01)  # labels cannot keep a renewal
    again = await client.open(kept.id)
    read = await run(again.backend, ["/bin/cat", "note.txt"], cwd=kept.status.workspace)
    assert (read.exit_code, read.stdout) == (0, "kept\n")
    assert leftover not in containers(docker_client, service)  # the old pool's member is removed
    await again.delete()


async def test_a_pooled_sandbox_claimed_just_before_a_stop_is_adopted_by_the_next_run(make_service, run):
    """The claim is written into the container's name a while after it, or when the service stops."""
    service = make_service("--pool", "1")
    client = await service.client()

    async def one_ready():
        return (await client.pool_ready()).get("default") == 1

    await eventually(one_ready, "one pooled sandbox ready")
    claimed = await client.create()
    assert claimed.status.pooled
    service.stop()
    service.start()
    client = await service.client()
    again = await client.open(claimed.id)
    assert (await run(again.backend, ["/bin/echo", "kept"])).stdout == "kept\n"
    await again.delete()
    await claimed.backend.aclose()


#: A command that asks the egress proxy for a tunnel and prints its answer's status line.
ASK_THE_PROXY = """
import os, socket
host, port = os.environ["HTTPS_PROXY"].rsplit("/", 1)[1].rsplit(":", 1)
with socket.create_connection((host, int(port)), timeout=60) as proxy:
    proxy.sendall(b"CONNECT example.com:443 HTTP/1.1\\r\\nHost: example.com:443\\r\\n\\r\\n")
    print(proxy.recv(256).split(b"\\r\\n")[0].decode())
"""


async def test_a_killed_service_serves_the_egress_of_the_sandboxes_it_adopts(make_service, run):
    """The host's side of egress goes with the service; the next run dials the adopted sandbox's
    relay again, and its proxy decides: allowing nothing, it refuses."""
    service = make_service()
    client = await service.client()
    kept = await client.create(allow=[])
    service.kill()
    service.start()
    client = await service.client()
    again = await client.open(kept.id)
    asked = await run(again.backend, ["/opt/protolink/bin/python", "-c", ASK_THE_PROXY], timeout=90)
    assert (asked.exit_code, asked.stdout) == (0, "HTTP/1.1 403 Forbidden\n"), asked.stderr
    await again.delete()
    await kept.backend.aclose()


async def test_a_sandbox_past_its_time_to_live_or_idle_timeout_is_removed_and_reported(service, docker_client):
    client = await service.client()
    short = await client.create(ttl_seconds=1)
    idle = await client.create(idle_seconds=1)

    async def ended():
        states = {status.id: status.state for status in await client.list()}
        return states if states.get(short.id) == "expired" and states.get(idle.id) == "idle" else None

    await eventually(ended, "expired and idle")
    for sandbox in (short, idle):
        with pytest.raises(SandboxNotFoundError):
            await client.get(sandbox.id)
        await sandbox.backend.aclose()
    assert containers(docker_client, service) == {}


async def test_a_sandbox_whose_container_dies_is_lost_as_on_swarm_and_frees_its_quota(service, docker_client, run):
    client = await service.client(service.token("one-at-a-time", sandboxes=1))
    doomed = await client.create()
    name = next(name for name in containers(docker_client, service) if name.endswith(doomed.id))
    container = docker_client.containers.get(name)
    container.kill()  # behind the service's back (say, the kernel's OOM killer)

    async def lost():
        return {status.id: status.state for status in await client.list()}.get(doomed.id) == "lost"

    await eventually(lost, "lost")
    assert (await client.get(doomed.id)).state == "lost"
    with pytest.raises(SandboxLostError, match="is lost"):
        await run(doomed.backend, ["/bin/true"])
    why = f"its container {container.id[:12]} stopped (killed, out of memory, or removed)"

    def told() -> list[tuple[str, str | None]]:
        audit = [json.loads(line) for line in service.files.audit.read_text().splitlines()]
        return [(record["kind"], record["fields"].get("reason")) for record in audit
                if record["kind"].startswith("sandbox.") and record["fields"].get("sandbox") == doomed.id]

    async def removed() -> bool:  # it is listed lost at once, while its removal goes on
        return ("sandbox.removed", "lost") in told()

    await eventually(removed, "removed")
    assert told() == [("sandbox.created", None), ("sandbox.lost", why), ("sandbox.removed", "lost")]
    await doomed.backend.aclose()
    async with await client.create() as again:  # the quota of one is free again
        assert (await run(again.backend, ["/bin/echo", "fresh"])).stdout == "fresh\n"
    assert containers(docker_client, service) == {}

