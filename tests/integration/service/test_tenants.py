"""Tokens keep tenants apart, and quotas refuse at once."""

from __future__ import annotations

from dataclasses import replace

import pytest

from protolink.errors import QuotaExceededError, SandboxAuthenticationError, SandboxError, SandboxNotFoundError
from protolink.sandbox.service.client import Sandbox, SandboxStatus, ServiceClient

pytestmark = pytest.mark.docker


async def refusals(client: ServiceClient, sandbox_id: str) -> list[str]:
    """What each call on ``sandbox_id`` raised: the error's type and message."""
    seen = []
    for call in (client.get(sandbox_id), client.renew(sandbox_id, 60), client.delete(sandbox_id),
                 client.open(sandbox_id)):
        with pytest.raises(SandboxNotFoundError) as raised:
            await call
        seen.append(f"{type(raised.value).__name__}: {raised.value}".replace(sandbox_id, "ID"))
    return seen


async def forwarded_refusal(client: ServiceClient, status: SandboxStatus, run) -> str:
    """What a command in ``status``'s sandbox raises, through ``client``."""
    intruder = await Sandbox.open(client, status)  # the server's info is at hand: no call yet
    try:
        with pytest.raises(SandboxError) as raised:
            await run(intruder.backend, ["/bin/true"])
    finally:
        await intruder.backend.aclose()
    return f"{type(raised.value).__name__}: {raised.value}".replace(status.id, "ID")


async def test_a_token_sees_and_reaches_only_its_own_sandboxes(service, run):
    alice = await service.client(service.token("alice"))
    bob = await service.client(service.token("bob"))
    async with await alice.create() as mine:
        assert [status.id for status in await alice.list()] == [mine.id]
        assert await bob.list() == []
        # another token's sandbox looks exactly like one that does not exist
        assert await refusals(bob, mine.id) == await refusals(bob, "0123456789abcdef")
        with pytest.raises(SandboxNotFoundError):  # a forwarded call with bob's token
            await Sandbox.open(bob, replace(mine.status, info=b""))
        assert await forwarded_refusal(bob, mine.status, run) == await forwarded_refusal(
            bob, replace(mine.status, id="0123456789abcdef"), run)
        result = await run(mine.backend, ["/bin/echo", "still mine"])
        assert (result.exit_code, result.stdout) == (0, "still mine\n")


async def test_a_call_without_a_known_token_is_refused(service, run):
    with pytest.raises(SandboxAuthenticationError):
        await service.client("not-a-token")
    known = await service.client(service.token("carol"))
    async with await known.create() as sandbox:
        stranger = ServiceClient(known.channel, "not-a-token", owns_channel=False)
        with pytest.raises(SandboxAuthenticationError):
            await stranger.list()
        assert (await forwarded_refusal(stranger, sandbox.status, run)).startswith("SandboxAuthenticationError")


async def test_quotas_refuse_at_once_and_free_up_on_delete(service):
    one = await service.client(service.token("one", sandboxes=1))
    first = await one.create()
    with pytest.raises(QuotaExceededError, match="at most 1 sandboxes"):
        await one.create()
    await first.delete()
    async with await one.create():
        pass
    small = await service.client(service.token("small", memory_bytes=256 << 20, cpus=0.5))
    with pytest.raises(QuotaExceededError, match="MiB of memory"):
        await small.create()  # the default template asks 512 MiB
    with pytest.raises(QuotaExceededError, match="CPUs"):
        await small.create(memory_mib=128)  # and 1 CPU
    assert await small.list() == []


async def test_a_refused_command_is_refused_with_its_type_every_time(service, run):
    """Twenty commands of a stranger in a row are each refused with the typed refusal (never
    the transport's INTERNAL, whatever the order the refusal and the request meet in), and the
    owner's sandbox keeps working."""
    known = await service.client(service.token("dave"))
    async with await known.create() as sandbox:
        stranger = ServiceClient(known.channel, "not-a-token", owns_channel=False)
        intruder = await Sandbox.open(stranger, sandbox.status)
        try:
            for _ in range(20):
                with pytest.raises(SandboxAuthenticationError):
                    await run(intruder.backend, ["/bin/true"])
        finally:
            await intruder.backend.aclose()
        result = await run(sandbox.backend, ["/bin/echo", "still here"])
        assert (result.exit_code, result.stdout) == (0, "still here\n")
