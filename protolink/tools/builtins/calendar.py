"""calendar_tools(): list events and, when allowed, create personal timed events.

The tools talk to a :class:`CalendarBackend`; Google, Microsoft and in-memory backends live in
``protolink.tools.services``. Intervals are validated before approval or any backend call.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from protolink.core.tools import Preparation, PreparedTool, ToolContext

from ._services import (
    BUILTIN_TAGS,
    MAX_TOKEN_CHARS,
    check_interval,
    describe_tool,
    require_method,
    service_preparation,
)

MAX_QUERY_CHARS = 500
MAX_TIMESTAMP_CHARS = 64

_PAGE_SCHEMA = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "items": {"type": "object"}},
        "next_page_token": {"type": ["string", "null"]},
    },
    "required": ["items", "next_page_token"],
}


@runtime_checkable
class CalendarBackend(Protocol):
    """A calendar service. Timestamps arrive as ISO 8601 strings with explicit offsets.

    ``list_events`` returns ``{"items": [...], "next_page_token": str | None}`` with events that
    overlap ``[start, end)``; ``create_event`` returns the service's event object with its ``id``.
    An optional ``query_help`` string extends the listing tool's description.
    """

    async def list_events(self, *, start: str, end: str, query: str, max_results: int,
                          page_token: str | None) -> dict[str, Any]: ...

    async def create_event(self, *, title: str, start: str, end: str, description: str,
                           location: str) -> dict[str, Any]: ...


class ListCalendarEvents(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start: str = Field(max_length=MAX_TIMESTAMP_CHARS, description=(
        "Interval start, ISO 8601 with an explicit offset, e.g. 2025-03-01T00:00:00+01:00."))
    end: str = Field(max_length=MAX_TIMESTAMP_CHARS,
                     description="Interval end, ISO 8601 with an explicit offset; must follow start.")
    query: str = Field("", max_length=MAX_QUERY_CHARS, description="Optional text to match in events.")
    max_results: int = Field(20, ge=1, le=100, description="Events per page (1-100).")
    page_token: str | None = Field(None, min_length=1, max_length=MAX_TOKEN_CHARS,
                                   description="next_page_token of the previous page, with the same "
                                               "interval, query and max_results.")


class CreateCalendarEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=1000, description="Event title.")
    start: str = Field(max_length=MAX_TIMESTAMP_CHARS, description="Start, ISO 8601 with an explicit offset.")
    end: str = Field(max_length=MAX_TIMESTAMP_CHARS, description="End, ISO 8601 with an explicit offset.")
    description: str = Field("", max_length=20000, description="Optional plain-text description.")
    location: str = Field("", max_length=1000, description="Optional location.")


def calendar_tools(backend: CalendarBackend, *, allow_write: bool = False,
                   timeout_seconds: float = 30) -> list[PreparedTool]:
    """Prepared tools over ``backend``: ``list_calendar_events`` (``calendar.read``) and, with
    ``allow_write=True``, ``create_calendar_event`` (``calendar.write``).

    ``timeout_seconds`` bounds each backend call, further bounded by the run's remaining budget.
    Construction never contacts the service.
    """
    if not timeout_seconds > 0:
        raise ValueError("timeout_seconds must be > 0")
    require_method(backend, "list_events")
    tools = [_list_tool(backend, timeout_seconds)]
    if allow_write:
        require_method(backend, "create_event")
        tools.append(_create_tool(backend, timeout_seconds))
    return tools


def _list_tool(backend: CalendarBackend, timeout_seconds: float) -> PreparedTool:
    async def prepare(args: ListCalendarEvents, context: ToolContext) -> Preparation:
        start, end = check_interval(args.start, args.end)
        call = {"start": start.isoformat(), "end": end.isoformat(), "query": args.query,
                "max_results": args.max_results, "page_token": args.page_token}
        return service_preparation(backend, "list_events", call, tool="list_calendar_events",
                                   capability="calendar.read", timeout_seconds=timeout_seconds)

    return PreparedTool(
        name="list_calendar_events",
        description=describe_tool(
            "List calendar events overlapping [start, end), including recurring instances and all-day "
            "events. Returns items and next_page_token; pass the token back with the same interval, "
            "query and max_results for the next page (a page can be empty and still have a token).",
            backend),
        arguments=ListCalendarEvents, prepare=prepare, capabilities=("calendar.read",),
        tags=(*BUILTIN_TAGS, "calendar", "read-only"), output_schema=_PAGE_SCHEMA)


def _create_tool(backend: CalendarBackend, timeout_seconds: float) -> PreparedTool:
    async def prepare(args: CreateCalendarEvent, context: ToolContext) -> Preparation:
        if not args.title.strip():
            raise ValueError("title must not be blank")
        start, end = check_interval(args.start, args.end)
        call = {"title": args.title, "start": start.isoformat(), "end": end.isoformat(),
                "description": args.description, "location": args.location}
        return service_preparation(backend, "create_event", call, tool="create_calendar_event",
                                   capability="calendar.write", timeout_seconds=timeout_seconds)

    return PreparedTool(
        name="create_calendar_event",
        description="Create a personal timed event (no attendees, not recurring) and return the "
                    "service's event object with its id.",
        arguments=CreateCalendarEvent, prepare=prepare, capabilities=("calendar.write",),
        tags=(*BUILTIN_TAGS, "calendar", "write"))
