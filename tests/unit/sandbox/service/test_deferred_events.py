"""The service's events off the calls' path: its sinks hear of every event, in the order they
came, after the code that emitted them has gone on; a flush hands over what still waits."""

from __future__ import annotations

import asyncio
import threading

from protolink.sandbox.service.events import Events, ServiceEvent


class _Recorded(list):
    def record(self, event: ServiceEvent) -> None:
        self.append(event)


class _Failing:
    def record(self, event: ServiceEvent) -> None:
        raise RuntimeError("this sink is broken")


async def _heard(recorded: _Recorded, count: int) -> None:
    """Wait until ``recorded`` holds ``count`` events (a hang guard, not a timing)."""
    deadline = asyncio.get_running_loop().time() + 30
    while len(recorded) < count:
        assert asyncio.get_running_loop().time() < deadline, f"{len(recorded)} of {count} events heard after 30 s"
        await asyncio.sleep(0.001)


async def test_events_on_the_loop_reach_every_sink_later_all_of_them_in_order():
    recorded, also = _Recorded(), _Recorded()
    events = Events([recorded, _Failing(), also], loop=asyncio.get_running_loop())
    for number in range(5):
        events.emit("command.started", "tenant-1", "sb-1", id=number)
    assert recorded == []  # the emitting call goes on first
    await _heard(recorded, 5)
    assert [event.fields["id"] for event in recorded] == [0, 1, 2, 3, 4]
    assert also == recorded  # a failing sink stops none of the others
    events.emit("command.ended", "tenant-1", "sb-1", id=5)
    await _heard(recorded, 6)
    assert recorded[-1].kind == "command.ended"


async def test_a_flush_hands_over_what_waits_at_once():
    recorded = _Recorded()
    events = Events([recorded], loop=asyncio.get_running_loop())
    events.emit("request", "tenant-1", method="Create")
    events.emit("sandbox.created", "tenant-1", "sb-1")
    events.flush()
    assert [event.kind for event in recorded] == ["request", "sandbox.created"]
    await asyncio.sleep(0.01)  # the flush that was due finds nothing more
    assert len(recorded) == 2


async def test_events_from_another_thread_join_the_same_order():
    recorded = _Recorded()
    events = Events([recorded], loop=asyncio.get_running_loop())
    events.emit("request", "tenant-1", method="Create")
    thread = threading.Thread(target=lambda: [events.emit("egress", "tenant-1", "sb-1", n=n) for n in range(3)])
    thread.start()
    await asyncio.to_thread(thread.join)
    events.emit("request", "tenant-1", method="Delete")
    await _heard(recorded, 5)
    assert [event.kind for event in recorded] == ["request", "egress", "egress", "egress", "request"]
    assert [event.fields["n"] for event in recorded[1:4]] == [0, 1, 2]


def test_without_a_loop_every_sink_hears_of_an_event_at_once():
    recorded = _Recorded()
    Events([recorded]).emit("request", "tenant-1", method="List")
    assert [event.fields for event in recorded] == [{"method": "List"}]
