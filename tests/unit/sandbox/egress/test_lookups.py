"""Connections that ask for one name at once share one lookup; later ones ask again."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from protolink.sandbox.egress.lookups import MAX_LOOKUPS, Lookups

from .support import wait_for

PUBLIC = "151.101.0.223"


class HeldNetwork:
    """A resolver whose answers wait until the test releases them; it counts what it is asked."""

    def __init__(self, answers: dict[str, Sequence[str]]) -> None:
        self.answers = answers
        self.asked: list[str] = []
        self.running = 0
        self.most_at_once = 0
        self.release = asyncio.Event()

    async def resolve(self, host: str, port: int) -> Sequence[str]:
        self.asked.append(host)
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            await self.release.wait()
        finally:
            self.running -= 1
        if host not in self.answers:
            raise OSError(f"unknown name {host}")
        return self.answers[host]

    async def connect_tcp(self, address, port):  # pragma: no cover - never reached here
        raise AssertionError("lookups never connect")


async def test_fifty_askers_of_one_name_at_once_cause_one_lookup():
    network = HeldNetwork({"registry.example": [PUBLIC]})
    lookups = Lookups(network)
    askers = [asyncio.create_task(lookups.resolve("registry.example", 443)) for _ in range(50)]
    await wait_for(lambda: network.running == 1)
    network.release.set()
    assert await asyncio.gather(*askers) == [[PUBLIC]] * 50
    assert network.asked == ["registry.example"]
    assert await lookups.resolve("registry.example", 443) == [PUBLIC]  # ended: the next asks again
    assert network.asked == ["registry.example"] * 2


async def test_different_names_are_looked_up_apart_and_at_most_a_few_at_once():
    names = [f"host{index}.example" for index in range(MAX_LOOKUPS * 3)]
    network = HeldNetwork({name: [PUBLIC] for name in names})
    lookups = Lookups(network)
    askers = [asyncio.create_task(lookups.resolve(name, 443)) for name in names]
    await wait_for(lambda: network.running == MAX_LOOKUPS)
    network.release.set()
    await asyncio.gather(*askers)
    assert sorted(network.asked) == sorted(names) and network.most_at_once == MAX_LOOKUPS


async def test_a_failure_reaches_every_asker_and_is_not_kept():
    network = HeldNetwork({})
    lookups = Lookups(network)
    askers = [asyncio.create_task(lookups.resolve("missing.example", 443)) for _ in range(3)]
    await wait_for(lambda: network.running == 1)
    network.release.set()
    results = await asyncio.gather(*askers, return_exceptions=True)
    assert [str(result) for result in results] == ["unknown name missing.example"] * 3
    network.answers["missing.example"] = [PUBLIC]
    assert await lookups.resolve("missing.example", 443) == [PUBLIC]


async def test_an_asker_that_gives_up_leaves_the_lookup_to_the_others():
    network = HeldNetwork({"registry.example": [PUBLIC]})
    lookups = Lookups(network)
    impatient = asyncio.create_task(lookups.resolve("registry.example", 443))
    patient = asyncio.create_task(lookups.resolve("registry.example", 443))
    await wait_for(lambda: network.running == 1)
    impatient.cancel()
    with pytest.raises(asyncio.CancelledError):
        await impatient
    network.release.set()
    assert await patient == [PUBLIC] and network.asked == ["registry.example"]
