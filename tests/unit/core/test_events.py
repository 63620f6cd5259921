"""Subscriptions: what ``close`` keeps, what ``dropped`` counts, and when iteration ends; sinks
that fail."""

import asyncio

import pytest

from protolink.core.events import Event, EventBus
from tests.unit.core.helpers import make_agent, recording_prepared_tool


async def publish(bus: EventBus, *types: str) -> None:
    for type in types:
        await bus.publish(type, {})


@pytest.mark.parametrize("maxsize", [2, 3])  # a full queue, and one with room
async def test_close_keeps_every_queued_event(maxsize):
    bus = EventBus()
    subscription = bus.subscribe(maxsize=maxsize)
    await publish(bus, "e0", "e1")
    subscription.close()
    assert [event.type async for event in subscription] == ["e0", "e1"]
    assert subscription.dropped == 0


async def test_events_past_maxsize_are_counted_and_events_after_close_are_not_delivered():
    bus = EventBus()
    subscription = bus.subscribe(maxsize=2)
    await publish(bus, "e0", "e1", "e2")
    subscription.close()
    subscription.close()
    await publish(bus, "after")
    assert [event.type async for event in subscription] == ["e0", "e1"]
    assert subscription.dropped == 1
    assert [event.type async for event in subscription] == []


async def test_close_ends_a_reader_waiting_on_an_empty_subscription():
    bus = EventBus()
    async with bus.subscribe() as subscription:
        reader = asyncio.create_task(anext(subscription, None))
        await asyncio.sleep(0)
        assert not reader.done()
    assert await asyncio.wait_for(reader, 1) is None


async def test_a_sink_that_raises_is_skipped_and_does_not_fail_the_call(caplog):
    done: list[str] = []
    seen: list[str] = []

    def broken(event: Event) -> None:
        raise RuntimeError("the dashboard is down")

    agent = make_agent()
    agent.events.add_sink(broken)
    agent.events.add_sink(lambda event: seen.append(event.type))
    agent.add_tool(recording_prepared_tool(done))
    assert await agent.call_tool("record", text="once") == "once"
    assert done == ["once"] and seen[-1] == "action.completed"
    assert "the dashboard is down" in caplog.text
