"""Limits per sandbox on real sockets: connections at once, their rate, the byte budget, idleness,
a live policy change, and a flood that ends in refusals without slowing another sandbox."""

from __future__ import annotations

import asyncio
import time

import pytest

from protolink.sandbox.egress import DENY_ALL, EgressLimits, EgressPolicy
from tests.descriptors import open_descriptors

from ...net.support import pipe_ends
from .support import Origin, ScriptedNetwork, serve, until_closed, wait_for

PUBLIC = "151.101.0.223"
GIB = 1 << 30
MIB = 1 << 20


@pytest.fixture
async def origin():
    async with Origin() as server:
        yield server


def policy(*rules: str, **limits) -> EgressPolicy:
    return EgressPolicy.parse(rules or ["files.example", "other.example"], limits=EgressLimits(**limits))


def network(origin) -> ScriptedNetwork:
    return ScriptedNetwork(origin.port, {"files.example": [[PUBLIC]], "other.example": [[PUBLIC]]})


async def tunnel(served, host: str = "files.example"):
    reader, writer = await served.open()
    writer.write(f"CONNECT {host}:443 HTTP/1.1\r\n\r\n".encode())
    return reader, writer, await reader.readuntil(b"\r\n\r\n")


async def test_connections_at_once_are_limited(origin):
    async with serve(policy(max_connections=3), network(origin)) as served:
        open_ = [await tunnel(served) for _ in range(3)]
        assert all(head.startswith(b"HTTP/1.1 200") for *_, head in open_)
        *_, head = await tunnel(served)
        assert head.startswith(b"HTTP/1.1 503") and served.proxy.open_connections == 3
        assert "at most 3 at once" in served.events[-1].reason and served.events[-1].kind == "denied"
        reader, writer, _ = open_.pop()
        writer.close()
        await wait_for(lambda: served.proxy.open_connections == 2)
        *_, head = await tunnel(served)
        assert head.startswith(b"HTTP/1.1 200")


async def test_the_connection_rate_is_a_token_bucket(origin):
    async with serve(policy(max_connections_per_second=0.1), network(origin)) as served:
        heads = [(await tunnel(served))[2] for _ in range(3)]
    assert heads[0].startswith(b"HTTP/1.1 200")
    assert all(head.startswith(b"HTTP/1.1 429") for head in heads[1:])
    assert "at most 0.1 a second" in served.events[-1].reason


async def test_a_burst_beyond_the_bucket_waits_for_its_turn_instead_of_being_refused(origin):
    """A package manager opens one connection per package at once (npm: 64 for a small project);
    those beyond the bucket are admitted as their tokens come due, none refused."""
    async with serve(policy(max_connections=16, max_connections_per_second=8), network(origin)) as served:
        tunnels = await asyncio.wait_for(asyncio.gather(*(tunnel(served) for _ in range(12))), 30)
        assert all(head.startswith(b"HTTP/1.1 200") for *_, head in tunnels)
        assert served.kinds().count("allowed") == 12 and "denied" not in served.kinds()
        for _, writer, _ in tunnels:
            writer.close()


async def test_a_1_gib_download_under_a_64_mib_budget_stops_at_the_budget(origin):
    async with serve(policy(max_bytes=64 * MIB), network(origin)) as served:
        reader, writer = await served.open()
        writer.write(f"GET http://files.example/bytes/{GIB} HTTP/1.1\r\n\r\n".encode())
        received = await until_closed(reader, 120)
        writer.close()
        await wait_for(lambda: "closed" in served.kinds())
        closed = served.events[-1]
        assert closed.reason == "byte budget"
        assert closed.bytes_up + closed.bytes_down <= 64 * MIB and received <= 64 * MIB
        assert received > 32 * MIB  # it did run, up to about the budget
        assert served.proxy.bytes_relayed <= 64 * MIB
        answer = await served.ask(b"GET http://files.example/bytes/1 HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 403") and b"byte budget spent" in answer


async def test_an_idle_connection_is_closed(origin):
    async with serve(policy(idle_seconds=0.3), network(origin)) as served:
        reader, writer, head = await tunnel(served)
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"
        assert await until_closed(reader) == 0
        writer.close()
        await wait_for(lambda: "closed" in served.kinds())
        assert served.events[-1].reason == "idle" and served.events[-1].bytes_up == 4


async def test_deny_all_closes_an_open_download_within_a_second(origin):
    async with serve(policy(), network(origin)) as served:
        reader, writer = await served.open()
        writer.write(f"GET http://files.example/bytes/{100 * GIB} HTTP/1.1\r\n\r\n".encode())
        await reader.readexactly(MIB)
        served.proxy.set_policy(DENY_ALL)
        cut = time.monotonic()
        await until_closed(reader)
        assert time.monotonic() - cut < 1.0
        writer.close()
        await wait_for(lambda: "closed" in served.kinds())
        assert served.events[-1].reason == "deny-all" and served.proxy.policy is DENY_ALL
        answer = await served.ask(b"GET http://files.example/bytes/1 HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 403") and b"deny-all" in answer


async def test_a_narrower_policy_closes_only_what_it_no_longer_allows(origin):
    async with serve(policy(), network(origin)) as served:
        kept = await tunnel(served, "files.example")
        cut = await tunnel(served, "other.example")
        served.proxy.set_policy(policy("files.example"))
        assert await until_closed(cut[0]) == 0
        kept[1].write(b"still here")
        assert await kept[0].readexactly(10) == b"still here"
        await wait_for(lambda: "closed" in served.kinds())
        closed = [e for e in served.events if e.kind == "closed"]
        assert [(e.host, e.reason) for e in closed] == [("other.example", "policy changed: other.example is not on the allow-list")]
        for _, writer, _ in (kept, cut):
            writer.close()


@pytest.mark.parametrize("limits", [EgressLimits(), EgressLimits(max_connections_per_second=100_000)],
                         ids=["default limits", "connections at once"])
async def test_a_flood_ends_in_refusals_and_another_sandbox_still_answers(origin, limits):
    """1,000 connections at once at one proxy, each held open until all are answered: the limits
    hold, and a second proxy in the same process answers while they are open."""
    async with serve(EgressPolicy.parse(["files.example"], limits=limits), network(origin), sandbox="flooded") \
            as flooded, serve(policy(), network(origin), sandbox="other") as other:
        most = 0
        answered = asyncio.Event()

        async def one() -> bytes:
            nonlocal most
            reader, writer = await flooded.open()
            try:
                writer.write(b"CONNECT files.example:443 HTTP/1.1\r\n\r\n")
                head = await reader.readuntil(b"\r\n\r\n")
                most = max(most, flooded.proxy.open_connections)
                await answered.wait()
                return head
            finally:
                writer.close()

        flood = [asyncio.create_task(one()) for _ in range(1000)]
        await asyncio.sleep(0)
        reader, writer, head = await asyncio.wait_for(tunnel(other), 30)
        assert head.startswith(b"HTTP/1.1 200")
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 30) == b"ping"
        writer.close()
        await wait_for(lambda: flooded.kinds().count("denied") + flooded.kinds().count("allowed") == 1000, 120)
        answered.set()
        heads = await asyncio.wait_for(asyncio.gather(*flood), 120)
        codes = [int(head[9:12]) for head in heads]
        assert set(codes) <= {200, 429, 503}
        assert codes.count(200) <= limits.max_connections and most <= limits.max_connections
        assert codes.count(429) + codes.count(503) >= 1000 - limits.max_connections
        # Beyond the bucket's second's worth, connections wait for their tokens (counted as open),
        # so the bound on connections at once refuses the rest first.
        assert flooded.kinds().count("denied") == 1000 - codes.count(200)


async def test_deny_all_also_drops_connections_still_sending_their_request(origin):
    async with serve(policy(), network(origin)) as served:
        reader, writer = await served.open()
        writer.write(b"CONNECT files.exa")
        await wait_for(lambda: served.proxy.open_connections == 1)
        served.proxy.set_policy(DENY_ALL)
        assert await until_closed(reader) == 0
        writer.close()
        await wait_for(lambda: served.events)
        assert served.events[-1].kind == "denied" and served.events[-1].reason == "deny-all"


async def test_deny_all_closes_a_tunnel_moving_in_the_kernel_and_frees_its_pipes(origin):
    before, pipes_before = open_descriptors(), pipe_ends()
    async with serve(policy(), network(origin)) as served:
        reader, writer, answer = await tunnel(served)
        assert answer.startswith(b"HTTP/1.1 200")
        writer.write(f"GET /bytes/{100 * GIB} HTTP/1.1\r\n\r\n".encode())
        await reader.readexactly(MIB)
        assert pipe_ends() - pipes_before == 4  # spliced: one pipe a direction
        served.proxy.set_policy(DENY_ALL)
        await until_closed(reader)  # no duplicate descriptor keeps either connection open
        writer.close()
        await wait_for(lambda: "closed" in served.kinds())
        assert served.events[-1].reason == "deny-all" and pipe_ends() == pipes_before
    await wait_for(lambda: open_descriptors() <= before)
