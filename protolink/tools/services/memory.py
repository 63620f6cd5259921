"""In-memory calendar and mailbox: the offline backends for examples, tests and demos.

Nothing leaves the process. Drafts and sent messages are kept on the instance (``drafts``,
``sent``) so an application or test can inspect what an agent did.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime, time, timezone
from typing import Any

from protolink.tools.builtins.email import check_address

from ._mime import capped_body, compose, selected_headers, snippet_of

__all__ = ["InMemoryCalendar", "InMemoryEmail"]


def _page(items: Sequence[dict[str, Any]], arguments: Sequence[Any], max_results: int,
          page_token: str | None) -> dict[str, Any]:
    """One page of ``items``; tokens name an offset and the arguments they belong to."""
    binding = hashlib.sha256(repr(tuple(arguments)).encode()).hexdigest()[:12]
    offset = 0
    if page_token is not None:
        prefix, _, number = page_token.rpartition(":")
        if prefix != f"mem:{binding}" or not number.isdigit():
            raise ValueError("page_token does not belong to this listing: keep the same "
                             "arguments and page size, or start again without a token")
        offset = int(number)
    end = offset + max_results
    return {"items": list(items[offset:end]),
            "next_page_token": f"mem:{binding}:{end}" if end < len(items) else None}


def _instant(value: str) -> datetime:
    """An event boundary: a timestamp with offset, or a date (an all-day boundary, in UTC)."""
    if "T" in value.upper():
        instant = datetime.fromisoformat(value)
        if instant.tzinfo is None:
            raise ValueError(f"event timestamp {value!r} needs an explicit offset")
        return instant
    return datetime.combine(date.fromisoformat(value), time(), tzinfo=timezone.utc)


class InMemoryCalendar:
    """A calendar held in memory, implementing CalendarBackend.

    ``events`` are dictionaries with ``title``, ``start`` and ``end`` (ISO 8601 timestamps with
    offsets, or dates for all-day events whose end date is exclusive) and optional
    ``description`` and ``location``.
    """

    query_help = "case-insensitive text matched in the title, description or location"

    def __init__(self, events: Iterable[Mapping[str, Any]] = ()) -> None:
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        for event in events:
            self._store(dict(event))

    def describe_target(self) -> dict[str, Any]:
        return {"service": "in-memory calendar"}

    def _store(self, event: dict[str, Any]) -> dict[str, Any]:
        for key in ("title", "start", "end"):
            if not isinstance(event.get(key), str):
                raise ValueError(f"an event needs a string {key!r}")
        if _instant(event["end"]) <= _instant(event["start"]):
            raise ValueError(f"event {event['title']!r} must end after it starts")
        event.setdefault("description", "")
        event.setdefault("location", "")
        event["all_day"] = "T" not in event["start"].upper()
        event["id"] = f"evt-{next(self._ids)}"
        self.events.append(event)
        return event

    async def list_events(self, *, start: str, end: str, query: str, max_results: int,
                          page_token: str | None) -> dict[str, Any]:
        begin, finish = datetime.fromisoformat(start), datetime.fromisoformat(end)
        needle = query.casefold()
        matches = sorted(
            (dict(event) for event in self.events
             if _instant(event["start"]) < finish and _instant(event["end"]) > begin
             and needle in " ".join((event["title"], event["description"], event["location"])).casefold()),
            key=lambda event: _instant(event["start"]))
        return _page(matches, ("events", start, end, query, max_results), max_results, page_token)

    async def create_event(self, *, title: str, start: str, end: str, description: str,
                           location: str) -> dict[str, Any]:
        return dict(self._store({"title": title, "start": start, "end": end,
                                 "description": description, "location": location}))


class InMemoryEmail:
    """A mailbox held in memory, implementing EmailBackend.

    ``messages`` are dictionaries with ``from``, ``to``, ``subject``, ``body`` and optional
    ``date`` and ``attachments`` (names only). Listing is newest first (last given first).
    Drafts and sent messages are recorded in ``drafts`` and ``sent``; nothing is delivered.
    """

    query_help = "case-insensitive text matched in the sender, recipients, subject or body"

    def __init__(self, messages: Iterable[Mapping[str, Any]] = (), *,
                 sender: str = "me@example.com") -> None:
        self.sender = check_address(sender, "sender")
        self._ids = itertools.count(1)
        self.messages: list[dict[str, Any]] = [
            {**dict(message), "id": f"msg-{next(self._ids)}"} for message in messages]
        self.drafts: list[dict[str, Any]] = []
        self.sent: list[dict[str, Any]] = []

    def describe_target(self) -> dict[str, Any]:
        return {"service": "in-memory mailbox", "sender": self.sender}

    async def list_messages(self, *, query: str, max_results: int,
                            page_token: str | None) -> dict[str, Any]:
        needle = query.casefold()
        searched = ("from", "to", "subject", "body")
        matches = [
            {"id": message["id"]} for message in reversed(self.messages)
            if needle in " ".join(str(message.get(key, "")) for key in searched).casefold()
        ]
        return _page(matches, ("messages", query, max_results), max_results, page_token)

    async def get_message(self, *, message_id: str) -> dict[str, Any]:
        message = next((m for m in self.messages if m["id"] == message_id), None)
        if message is None:
            raise ValueError(f"no message with id {message_id!r}; use ids from list_email_messages")
        body = str(message.get("body", ""))
        return {
            "id": message_id,
            "headers": selected_headers(
                (name, message[key]) for name, key in
                (("From", "from"), ("To", "to"), ("Date", "date"), ("Subject", "subject")) if key in message),
            "snippet": snippet_of(body),
            **capped_body(body),
            "has_attachments": bool(message.get("attachments")),
            "html_body_omitted": False,
        }

    def _compose(self, to: list[str], subject: str, body: str) -> dict[str, Any]:
        message = compose(self.sender, to, subject, body)
        return {"message_id": message["Message-ID"], "from": self.sender, "to": list(to),
                "subject": subject, "body": body}

    async def create_draft(self, *, to: list[str], subject: str, body: str) -> dict[str, Any]:
        draft = self._compose(to, subject, body)
        self.drafts.append(draft)
        return {"status": "drafted", "draft_id": f"draft-{len(self.drafts)}",
                "message_id": draft["message_id"]}

    async def send_message(self, *, to: list[str], subject: str, body: str) -> dict[str, Any]:
        message = self._compose(to, subject, body)
        self.sent.append(message)
        return {"status": "accepted", "message_id": message["message_id"], "accepted": list(to),
                "refused": []}
