"""calendar_tools(): prepared tools, interval validation before approval, previews, timeouts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from protolink import RunContext
from protolink.errors import (
    BudgetExceededError,
    DirectCallError,
    ToolArgumentError,
    ToolExecutionError,
)
from protolink.tools import InMemoryCalendar, calendar_tools
from tests.held_loop import DEADLINE_SECONDS, hold_up

from .service_support import Approvals, service_agent

WEEK = {"start": "2025-03-01T00:00:00+01:00", "end": "2025-03-08T00:00:00+01:00"}


class RecordingCalendar:
    """A CalendarBackend that records calls and can stall."""

    query_help = "words matched in the title"

    def __init__(self, stall: bool = False) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.stall = stall

    def describe_target(self) -> dict[str, Any]:
        return {"service": "Recording", "calendar_id": "work"}

    async def list_events(self, **arguments: Any) -> dict[str, Any]:
        self.calls.append(("list_events", arguments))
        if self.stall:
            await asyncio.Event().wait()
        return {"items": [], "next_page_token": None}

    async def create_event(self, **arguments: Any) -> dict[str, Any]:
        self.calls.append(("create_event", arguments))
        return {"id": "evt-1", **arguments}


def test_listing_by_default_and_creation_only_when_allowed():
    backend = RecordingCalendar()
    assert [(t.name, t.capabilities) for t in calendar_tools(backend)] == [
        ("list_calendar_events", ("calendar.read",))]
    assert [(t.name, t.capabilities) for t in calendar_tools(backend, allow_write=True)] == [
        ("list_calendar_events", ("calendar.read",)), ("create_calendar_event", ("calendar.write",))]
    assert backend.calls == []  # construction contacts nothing


async def test_prepared_tools_refuse_direct_calls():
    tool = calendar_tools(RecordingCalendar())[0]
    with pytest.raises(DirectCallError):
        await tool(**WEEK)


def test_query_help_extends_the_listing_description():
    listing = calendar_tools(RecordingCalendar())[0]
    assert "words matched in the title" in listing.description


def test_a_backend_without_create_event_cannot_enable_writes():
    class ReadOnly:
        async def list_events(self, **arguments: Any) -> dict[str, Any]:
            return {"items": [], "next_page_token": None}

    assert len(calendar_tools(ReadOnly())) == 1
    with pytest.raises(TypeError, match="create_event"):
        calendar_tools(ReadOnly(), allow_write=True)


@pytest.mark.parametrize(("start", "end", "problem"), [
    ("2025-03-01T10:00:00", "2025-03-01T11:00:00+01:00", "explicit offset"),
    ("2025-03-01T10:00:00+01:00", "2025-03-01T11:00:00", "explicit offset"),
    ("2025-03-01", "2025-03-02T00:00:00Z", "explicit offset"),
    ("tomorrow", "2025-03-02T00:00:00Z", "ISO 8601"),
    ("2025-03-01T11:00:00+01:00", "2025-03-01T10:00:00+01:00", "must follow start"),
    ("2025-03-01T10:00:00+01:00", "2025-03-01T09:00:00Z", "must follow start"),  # same instant
])
async def test_invalid_intervals_are_rejected_before_approval_or_backend(start, end, problem):
    backend, approvals = RecordingCalendar(), Approvals()
    agent = service_agent(calendar_tools(backend, allow_write=True), approvals)
    with pytest.raises(ValueError, match=problem):
        await agent.call_tool("create_calendar_event", title="Dentist", start=start, end=end)
    with pytest.raises(ValueError, match=problem):
        await agent.call_tool("list_calendar_events", start=start, end=end)
    assert approvals.requests == [] and backend.calls == []


@pytest.mark.parametrize("arguments", [
    {**WEEK, "max_results": 0}, {**WEEK, "max_results": 101}, {**WEEK, "page_token": ""},
    {**WEEK, "surprise": 1}, {"start": WEEK["start"]},
])
async def test_listing_arguments_outside_their_limits_are_rejected(arguments):
    backend = RecordingCalendar()
    agent = service_agent(calendar_tools(backend))
    with pytest.raises(ToolArgumentError):
        await agent.call_tool("list_calendar_events", **arguments)
    assert backend.calls == []


async def test_blank_title_is_rejected_before_approval():
    backend, approvals = RecordingCalendar(), Approvals()
    agent = service_agent(calendar_tools(backend, allow_write=True), approvals)
    with pytest.raises(ValueError, match="title"):
        await agent.call_tool("create_calendar_event", title="   ", start="2025-03-01T10:00:00Z",
                              end="2025-03-01T11:00:00Z")
    assert approvals.requests == [] and backend.calls == []


async def test_creation_is_approved_with_the_target_and_exact_arguments():
    backend, approvals = RecordingCalendar(), Approvals()
    agent = service_agent(calendar_tools(backend, allow_write=True), approvals)
    event = await agent.call_tool("create_calendar_event", title="Dentist", start="2025-03-05T14:00:00+01:00",
                                  end="2025-03-05T15:00:00+01:00", location="Bahnhofstrasse 1")
    assert event["id"] == "evt-1"
    [request] = approvals.requests
    assert request.capabilities == ("calendar.write",)
    [preview] = request.artifacts
    assert preview.content == {
        "target": {"service": "Recording", "calendar_id": "work"},
        "operation": "create_event",
        "arguments": {"title": "Dentist", "start": "2025-03-05T14:00:00+01:00",
                      "end": "2025-03-05T15:00:00+01:00", "description": "", "location": "Bahnhofstrasse 1"},
    }
    assert backend.calls == [("create_event", preview.content["arguments"])]


async def test_declined_creation_never_reaches_the_backend():
    backend = RecordingCalendar()
    agent = service_agent(calendar_tools(backend, allow_write=True), Approvals(approve=False))
    with pytest.raises(PermissionError):
        await agent.call_tool("create_calendar_event", title="Dentist", start="2025-03-05T14:00:00Z",
                              end="2025-03-05T15:00:00Z")
    assert backend.calls == []


async def test_timestamps_reach_the_backend_normalized():
    backend = RecordingCalendar()
    agent = service_agent(calendar_tools(backend))
    await agent.call_tool("list_calendar_events", start="2025-03-01T00:00:00Z", end="20250302T000000+0100")
    assert backend.calls[0][1]["start"] == "2025-03-01T00:00:00+00:00"
    assert backend.calls[0][1]["end"] == "2025-03-02T00:00:00+01:00"


async def test_each_operation_times_out():
    agent = service_agent(calendar_tools(RecordingCalendar(stall=True), timeout_seconds=0.05))
    with pytest.raises(TimeoutError, match="did not finish within"):
        await agent.call_tool("list_calendar_events", **WEEK)


async def test_an_answer_that_came_while_the_loop_was_held_past_the_timeout_is_returned():
    """A blocking step of the caller's held its loop past the operation's timeout while the
    backend's worker thread (as IMAP's are) answered: the answer waits unread behind the
    timeout's own callback, and the call returns it instead of failing as one that timed out."""

    class AnsweredWhileHeld(RecordingCalendar):
        async def list_events(self, **arguments: Any) -> dict[str, Any]:
            held = hold_up(asyncio.get_running_loop())
            return await asyncio.to_thread(lambda: held.wait(30) and {"items": [], "next_page_token": None})

    agent = service_agent(calendar_tools(AnsweredWhileHeld(), timeout_seconds=DEADLINE_SECONDS))
    assert await agent.call_tool("list_calendar_events", **WEEK) == {"items": [], "next_page_token": None}


async def test_the_run_budget_bounds_the_timeout():
    agent = service_agent(calendar_tools(RecordingCalendar(stall=True), timeout_seconds=3600))
    with pytest.raises(BudgetExceededError):
        await agent.call_tool("list_calendar_events", context=RunContext(max_seconds=0.05), **WEEK)


async def test_cancellation_propagates():
    agent = service_agent(calendar_tools(RecordingCalendar(stall=True)))
    task = asyncio.create_task(agent.call_tool("list_calendar_events", **WEEK))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_backend_answer_that_is_not_a_dictionary_fails_the_call():
    class Broken(RecordingCalendar):
        async def list_events(self, **arguments: Any) -> Any:
            return ["not", "a", "page"]

    agent = service_agent(calendar_tools(Broken()))
    with pytest.raises(ToolExecutionError, match="JSON-compatible dictionary"):
        await agent.call_tool("list_calendar_events", **WEEK)


# -- the in-memory backend ---------------------------------------------------------------

def offline_calendar() -> InMemoryCalendar:
    return InMemoryCalendar([
        {"title": "Night shift", "start": "2025-02-28T22:00:00+01:00", "end": "2025-03-01T06:00:00+01:00"},
        {"title": "Company offsite", "start": "2025-03-04", "end": "2025-03-06", "location": "Lakeside"},
        {"title": "Standup", "start": "2025-03-03T09:00:00+01:00", "end": "2025-03-03T09:15:00+01:00"},
        {"title": "Next month", "start": "2025-04-01T09:00:00+02:00", "end": "2025-04-01T10:00:00+02:00"},
    ])


async def test_in_memory_listing_returns_overlapping_events_in_start_order_across_pages():
    agent = service_agent(calendar_tools(offline_calendar()))
    first = await agent.call_tool("list_calendar_events", **WEEK, max_results=2)
    assert [event["title"] for event in first["items"]] == ["Night shift", "Standup"]
    second = await agent.call_tool("list_calendar_events", **WEEK, max_results=2,
                                   page_token=first["next_page_token"])
    assert [event["title"] for event in second["items"]] == ["Company offsite"]
    assert second["items"][0]["all_day"] is True and second["next_page_token"] is None


async def test_in_memory_page_tokens_belong_to_their_arguments():
    agent = service_agent(calendar_tools(offline_calendar()))
    first = await agent.call_tool("list_calendar_events", **WEEK, max_results=1)
    with pytest.raises(ValueError, match="does not belong"):
        await agent.call_tool("list_calendar_events", **WEEK, max_results=1, query="stand",
                              page_token=first["next_page_token"])


async def test_in_memory_creation_is_listed_afterwards():
    calendar = offline_calendar()
    agent = service_agent(calendar_tools(calendar, allow_write=True))
    created = await agent.call_tool("create_calendar_event", title="Dentist", start="2025-03-05T14:00:00+01:00",
                                    end="2025-03-05T15:00:00+01:00")
    listed = await agent.call_tool("list_calendar_events", **WEEK, query="dentist")
    assert [event["id"] for event in listed["items"]] == [created["id"]]
