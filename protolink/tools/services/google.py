"""Google Calendar and Gmail backends over their REST APIs (needs the ``integrations`` extra).

Each request resolves the token again and goes through the bounded client in ``_http``.
Construction never contacts Google.
"""

from __future__ import annotations

import base64
import binascii
import html
import re
from email.message import Message
from typing import Any
from urllib.parse import quote

import httpx

from protolink.tools.builtins.email import check_address

from ._http import JSONClient, ServiceHTTPError, TokenSource, single_line
from ._mime import (
    Part,
    body_fields,
    compose,
    decode_header_value,
    message_result,
    selected_headers,
)

__all__ = ["Gmail", "GoogleAPIError", "GoogleCalendar"]

CALENDAR_API = "https://www.googleapis.com/calendar/v3"
GMAIL_API = "https://gmail.googleapis.com/gmail/v1"
_GMAIL_ID = re.compile(r"[A-Za-z0-9_-]{1,256}")


class GoogleAPIError(ServiceHTTPError):
    """A Google API call failed; ``status_code`` is the HTTP status (None without a response)."""


def _client(token: TokenSource, service: str, transport: httpx.AsyncBaseTransport | None,
            timeout_seconds: float) -> JSONClient:
    return JSONClient(token, service=service, error=GoogleAPIError, transport=transport,
                      timeout_seconds=timeout_seconds)


class GoogleCalendar:
    """Google Calendar events of one calendar (``calendar_id="primary"`` by default).

    ``token`` is an OAuth access token or a no-argument sync/async callback returning one,
    resolved for every request. Listing expands recurring events into instances
    (``singleEvents``) and keeps Google's event fields, including ``start.date`` for all-day
    events. Scopes: ``calendar.events.readonly`` (or ``calendar.events``) to read,
    ``calendar.events`` to create.
    """

    query_help = ("Google Calendar free-text search: words match the title, description, "
                  "location and attendees")

    def __init__(self, token: TokenSource, calendar_id: str = "primary", *,
                 transport: httpx.AsyncBaseTransport | None = None, timeout_seconds: float = 30.0) -> None:
        self.calendar_id = single_line(calendar_id, "calendar_id")
        self._http = _client(token, "Google Calendar", transport, timeout_seconds)
        self._events_url = f"{CALENDAR_API}/calendars/{quote(calendar_id, safe='')}/events"

    def describe_target(self) -> dict[str, Any]:
        return {"service": "Google Calendar", "calendar_id": self.calendar_id}

    async def list_events(self, *, start: str, end: str, query: str, max_results: int,
                          page_token: str | None) -> dict[str, Any]:
        params: dict[str, Any] = {"timeMin": start, "timeMax": end, "singleEvents": "true",
                                  "orderBy": "startTime", "maxResults": max_results}
        if query:
            params["q"] = query
        if page_token:
            params["pageToken"] = page_token
        data = await self._http.request("GET", self._events_url, params=params)
        items = self._http.object_list(data, "items")
        token = data.get("nextPageToken")
        return {"items": items, "next_page_token": token if isinstance(token, str) and token else None,
                "time_zone": data.get("timeZone")}

    async def create_event(self, *, title: str, start: str, end: str, description: str,
                           location: str) -> dict[str, Any]:
        event: dict[str, Any] = {"summary": title, "start": {"dateTime": start}, "end": {"dateTime": end}}
        if description:
            event["description"] = description
        if location:
            event["location"] = location
        data = await self._http.request("POST", self._events_url, params={"sendUpdates": "none"},
                                        json_body=event)
        self._http.require_id(data, "event")
        return data


class Gmail:
    """A Gmail mailbox (``user_id="me"``: the token's account).

    ``sender`` is the fixed From address for drafts and sending; it must be the authenticated
    address or a configured send-as alias, and composing is refused without it. Reads use
    ``format=full`` (attachment bytes are not downloaded) and do not mark mail read. Scopes:
    ``gmail.readonly`` to read, ``gmail.compose`` for drafts, ``gmail.send`` or ``gmail.compose``
    to send.
    """

    query_help = "Gmail search operators, e.g. is:unread newer_than:7d from:alice@example.com subject:report"

    def __init__(self, token: TokenSource, *, sender: str | None = None, user_id: str = "me",
                 transport: httpx.AsyncBaseTransport | None = None, timeout_seconds: float = 30.0) -> None:
        self.sender = None if sender is None else check_address(sender, "sender")
        self.user_id = single_line(user_id, "user_id")
        self._http = _client(token, "Gmail", transport, timeout_seconds)
        self._base = f"{GMAIL_API}/users/{quote(user_id, safe='')}"

    def describe_target(self) -> dict[str, Any]:
        return {"service": "Gmail", "user_id": self.user_id, "sender": self.sender}

    def check_compose(self, *, send: bool) -> None:
        """Composing needs the fixed ``sender``."""
        if self.sender is None:
            raise ValueError("Gmail needs sender= (the authenticated address or a send-as alias) "
                             "to create drafts or send")

    async def list_messages(self, *, query: str, max_results: int,
                            page_token: str | None) -> dict[str, Any]:
        params: dict[str, Any] = {"maxResults": max_results}
        if query:
            params["q"] = query
        if page_token:
            params["pageToken"] = page_token
        data = await self._http.request("GET", f"{self._base}/messages", params=params)
        messages = self._http.object_list(data, "messages")
        token = data.get("nextPageToken")
        return {"items": [{"id": m.get("id"), "thread_id": m.get("threadId")} for m in messages],
                "next_page_token": token if isinstance(token, str) and token else None}

    async def get_message(self, *, message_id: str) -> dict[str, Any]:
        if not _GMAIL_ID.fullmatch(message_id):
            raise ValueError("message_id is not a Gmail message id; use ids from list_email_messages")
        data = await self._http.request("GET", f"{self._base}/messages/{message_id}",
                                        params={"format": "full"})
        payload = data.get("payload")
        if not isinstance(payload, dict):
            raise GoogleAPIError("Gmail returned a message without a payload")
        headers = selected_headers((h.get("name", ""), decode_header_value(str(h.get("value", ""))))
                                   for h in _list(payload.get("headers")))
        return message_result(message_id, headers, html.unescape(str(data.get("snippet", ""))),
                              body_fields(_part(payload)), thread_id=data.get("threadId"),
                              label_ids=_list(data.get("labelIds")))

    async def create_draft(self, *, to: list[str], subject: str, body: str) -> dict[str, Any]:
        raw = self._raw(to, subject, body)
        data = await self._http.request("POST", f"{self._base}/drafts", json_body={"message": {"raw": raw}})
        message = data.get("message") if isinstance(data.get("message"), dict) else {}
        return {"status": "drafted", "draft_id": self._http.require_id(data, "draft"),
                "message_id": message.get("id"), "thread_id": message.get("threadId")}

    async def send_message(self, *, to: list[str], subject: str, body: str) -> dict[str, Any]:
        raw = self._raw(to, subject, body)
        data = await self._http.request("POST", f"{self._base}/messages/send", json_body={"raw": raw})
        return {"status": "accepted", "message_id": self._http.require_id(data, "message"),
                "thread_id": data.get("threadId")}

    def _raw(self, to: list[str], subject: str, body: str) -> str:
        self.check_compose(send=False)
        message = compose(self.sender, to, subject, body)  # type: ignore[arg-type]
        return base64.urlsafe_b64encode(message.as_bytes()).decode("ascii")


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _part(payload: dict[str, Any]) -> Part:
    """A Part tree from Gmail's ``payload`` (headers per part, base64url body data)."""
    headers = Message()
    for header in _list(payload.get("headers")):
        if header.get("name", "").lower() in ("content-type", "content-disposition"):
            headers[header["name"]] = str(header.get("value", ""))
    body = payload.get("body") if isinstance(payload.get("body"), dict) else {}
    return Part(
        content_type=str(payload.get("mimeType") or headers.get_content_type()).lower(),
        charset=headers.get_content_charset(),
        disposition=headers.get_content_disposition(),
        filename=payload.get("filename") or None,
        data=_base64url(body.get("data")),
        external_data=bool(body.get("attachmentId")),
        children=[_part(child) for child in _list(payload.get("parts")) if isinstance(child, dict)],
    )


def _base64url(data: Any) -> bytes | None:
    if not isinstance(data, str):
        return None
    try:
        return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
    except (binascii.Error, ValueError):
        return None
