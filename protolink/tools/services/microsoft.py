"""Outlook calendar and mailbox backends over Microsoft Graph v1.0 (``integrations`` extra).

All calls stay on https://graph.microsoft.com/v1.0. Requests ask for immutable IDs and plain-text
bodies. Continuation tokens are signed by the backend instance for one resource and one set of
query arguments, and the link inside is checked against the original HTTPS host and collection
path before it is followed, so a page token can never switch users, calendars or mailboxes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import httpx

from protolink.tools.builtins.email import check_address

from ._http import JSONClient, ServiceHTTPError, TokenSource, single_line
from ._mime import capped_body, message_result, selected_headers

__all__ = ["MicrosoftGraphError", "OutlookCalendar", "OutlookEmail"]

GRAPH_API = "https://graph.microsoft.com/v1.0"
PREFER = 'IdType="ImmutableId", outlook.body-content-type="text"'
_GRAPH_ID = re.compile(r"[A-Za-z0-9=_+/-]{1,1024}")
_MESSAGE_FIELDS = ("id,subject,from,toRecipients,ccRecipients,replyTo,receivedDateTime,sentDateTime,"
                   "internetMessageId,body,bodyPreview,hasAttachments,conversationId")


class MicrosoftGraphError(ServiceHTTPError):
    """A Microsoft Graph call failed; ``status_code`` is the HTTP status (None without one)."""


def _segment(value: str, name: str) -> str:
    return quote(single_line(value, name), safe="")


class _GraphResource:
    """One user's Graph resource, its client, and continuation tokens bound to this instance."""

    _service = "Microsoft Graph"

    def __init__(self, token: TokenSource, user_id: str, transport: httpx.AsyncBaseTransport | None,
                 timeout_seconds: float) -> None:
        self.user_id = user_id
        user = "me" if user_id == "me" else f"users/{_segment(user_id, 'user_id')}"
        self.user_url = f"{GRAPH_API}/{user}"
        self.http = JSONClient(token, service=self._service, error=MicrosoftGraphError,
                                transport=transport, timeout_seconds=timeout_seconds)
        self._secret = secrets.token_bytes(32)

    async def get(self, url: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.http.request("GET", url, params=params, headers={"Prefer": PREFER})

    async def post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.http.request("POST", url, json_body=body, headers={"Prefer": PREFER})

    async def page(self, collection: str, params: dict[str, Any], binding: list[Any],
                    page_token: str | None) -> tuple[list[dict[str, Any]], str | None]:
        """One page of ``collection``: its items and the signed token for the next page."""
        if page_token is None:
            data = await self.get(collection, params)
        else:
            data = await self.get(self._follow(page_token, collection, binding))
        items = self.http.object_list(data, "value")
        link = data.get("@odata.nextLink")
        if link is None:
            return items, None
        if not isinstance(link, str) or not _same_collection(link, collection):
            raise MicrosoftGraphError(f"{self._service} returned a continuation link outside the "
                                      "requested collection")
        return items, self._sign(link, collection, binding)

    def _mac(self, link: str, collection: str, binding: list[Any]) -> str:
        message = json.dumps([collection, binding, link]).encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:32]

    def _sign(self, link: str, collection: str, binding: list[Any]) -> str:
        encoded = base64.urlsafe_b64encode(link.encode()).decode().rstrip("=")
        return f"{encoded}.{self._mac(link, collection, binding)}"

    def _follow(self, token: str, collection: str, binding: list[Any]) -> str:
        encoded, _, mac = token.rpartition(".")
        try:
            link = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        except (binascii.Error, ValueError):
            link = ""
        if not link or not hmac.compare_digest(mac, self._mac(link, collection, binding)):
            raise ValueError("page_token does not belong to this listing: keep the same backend, "
                             "arguments and page size, or start again without a token")
        if not _same_collection(link, collection):  # defence in depth: signed links were checked
            raise ValueError("page_token points outside the original collection")
        return link


def _same_collection(link: str, collection: str) -> bool:
    """Whether ``link`` stays on the collection's HTTPS host and path (user/calendar/mailbox)."""
    try:
        got, want = urlsplit(link), urlsplit(collection)
        port = got.port
    except ValueError:
        return False
    return (got.scheme == "https" and got.hostname == want.hostname and port in (None, 443)
            and got.username is None and got.password is None and not got.fragment
            and unquote(got.path).rstrip("/").casefold() == unquote(want.path).rstrip("/").casefold())


def _utc(value: str) -> dict[str, str]:
    instant = datetime.fromisoformat(value).astimezone(timezone.utc).replace(tzinfo=None)
    return {"dateTime": instant.isoformat(), "timeZone": "UTC"}


class OutlookCalendar:
    """A Microsoft 365 / Outlook calendar through Graph's ``calendarView``.

    ``user_id="me"`` uses the delegated token's user; application tokens need an explicit user
    ID or principal name. ``calendar_id=None`` selects that user's default calendar. ``token``
    is an access token or a sync/async callback returning one for every request. Permissions:
    ``Calendars.Read`` to list, ``Calendars.ReadWrite`` to create.
    """

    query_help = ("case-insensitive text matched in each returned page's subject, body preview and "
                  "location; follow next_page_token even when a filtered page is empty")

    def __init__(self, token: TokenSource, user_id: str = "me", calendar_id: str | None = None, *,
                 transport: httpx.AsyncBaseTransport | None = None, timeout_seconds: float = 30.0) -> None:
        self._graph = _GraphResource(token, user_id, transport, timeout_seconds)
        self.user_id = user_id
        self.calendar_id = calendar_id
        calendar = "calendar" if calendar_id is None else f"calendars/{_segment(calendar_id, 'calendar_id')}"
        self._calendar_url = f"{self._graph.user_url}/{calendar}"

    def describe_target(self) -> dict[str, Any]:
        return {"service": "Outlook Calendar", "user_id": self.user_id,
                "calendar_id": self.calendar_id or "default"}

    async def list_events(self, *, start: str, end: str, query: str, max_results: int,
                          page_token: str | None) -> dict[str, Any]:
        params = {"startDateTime": start, "endDateTime": end, "$top": max_results,
                  "$orderby": "start/dateTime"}
        items, token = await self._graph.page(f"{self._calendar_url}/calendarView", params,
                                               ["events", start, end, query, max_results], page_token)
        needle = query.casefold()
        if needle:
            items = [event for event in items if needle in _event_text(event)]
        return {"items": items, "next_page_token": token}

    async def create_event(self, *, title: str, start: str, end: str, description: str,
                           location: str) -> dict[str, Any]:
        event: dict[str, Any] = {"subject": title, "start": _utc(start), "end": _utc(end),
                                 "body": {"contentType": "text", "content": description},
                                 "attendees": []}
        if location:
            event["location"] = {"displayName": location}
        data = await self._graph.post(f"{self._calendar_url}/events", event)
        self._graph.http.require_id(data, "event")
        return data


def _event_text(event: dict[str, Any]) -> str:
    location = event.get("location")
    place = location.get("displayName", "") if isinstance(location, dict) else ""
    return " ".join(str(part or "") for part in (event.get("subject"), event.get("bodyPreview"), place)).casefold()


class OutlookEmail:
    """A Microsoft 365 / Outlook mailbox through Graph.

    Queries use Graph message search (``subject:review``, ``from:person@example.com``), capped by
    Graph at 1,000 matches; an empty query lists newest first. Reads request plain text with
    immutable IDs and do not change read status. Sending saves a copy to Sent Items and returns
    ``{"status": "accepted"}`` (HTTP 202, no message id, not a delivery confirmation).
    Permissions: ``Mail.Read``, ``Mail.ReadWrite`` (drafts), ``Mail.Send``.
    """

    query_help = "Microsoft Graph message search (KQL), e.g. subject:review or from:person@example.com"

    def __init__(self, token: TokenSource, user_id: str = "me", *,
                 transport: httpx.AsyncBaseTransport | None = None, timeout_seconds: float = 30.0) -> None:
        self._graph = _GraphResource(token, user_id, transport, timeout_seconds)
        self.user_id = user_id
        self._messages_url = f"{self._graph.user_url}/messages"

    def describe_target(self) -> dict[str, Any]:
        return {"service": "Outlook Email", "user_id": self.user_id}

    async def list_messages(self, *, query: str, max_results: int,
                            page_token: str | None) -> dict[str, Any]:
        params: dict[str, Any] = {"$top": max_results, "$select": "id"}
        if query:
            params["$search"] = '"' + query.replace("\\", "\\\\").replace('"', '\\"') + '"'
        else:
            params["$orderby"] = "receivedDateTime desc"
        items, token = await self._graph.page(self._messages_url, params,
                                               ["messages", query, max_results], page_token)
        return {"items": [{"id": item.get("id")} for item in items], "next_page_token": token}

    async def get_message(self, *, message_id: str) -> dict[str, Any]:
        if not _GRAPH_ID.fullmatch(message_id):
            raise ValueError("message_id is not a Graph message id; use ids from list_email_messages")
        data = await self._graph.get(f"{self._messages_url}/{quote(message_id, safe='')}",
                                      {"$select": _MESSAGE_FIELDS})
        body = data.get("body") if isinstance(data.get("body"), dict) else {}
        is_html = str(body.get("contentType", "text")).lower() == "html"
        headers = selected_headers([
            ("From", _addresses([data.get("from")])), ("To", _addresses(data.get("toRecipients"))),
            ("Cc", _addresses(data.get("ccRecipients"))), ("Reply-To", _addresses(data.get("replyTo"))),
            ("Date", data.get("receivedDateTime") or data.get("sentDateTime") or ""),
            ("Subject", data.get("subject") or ""), ("Message-ID", data.get("internetMessageId") or ""),
        ])
        fields = {**capped_body("" if is_html else str(body.get("content") or "")),
                  "has_attachments": bool(data.get("hasAttachments")),
                  "html_body_omitted": is_html}
        return message_result(message_id, headers, " ".join(str(data.get("bodyPreview") or "").split()),
                              fields, conversation_id=data.get("conversationId"))

    async def create_draft(self, *, to: list[str], subject: str, body: str) -> dict[str, Any]:
        data = await self._graph.post(self._messages_url, _graph_message(to, subject, body))
        return {"status": "drafted", "id": self._graph.http.require_id(data, "draft"), "draft": data}

    async def send_message(self, *, to: list[str], subject: str, body: str) -> dict[str, Any]:
        await self._graph.post(f"{self._graph.user_url}/sendMail",
                                {"message": _graph_message(to, subject, body), "saveToSentItems": True})
        return {"status": "accepted"}


def _graph_message(to: list[str], subject: str, body: str) -> dict[str, Any]:
    return {"subject": subject, "body": {"contentType": "Text", "content": body},
            "toRecipients": [{"emailAddress": {"address": check_address(a, "recipient")}} for a in to]}


def _addresses(entries: Any) -> str:
    """Graph recipients as ``Name <address>`` joined by commas."""
    shown = []
    for entry in entries if isinstance(entries, list) else []:
        address = entry.get("emailAddress") if isinstance(entry, dict) else None
        if isinstance(address, dict):
            name, mail = address.get("name") or "", address.get("address") or ""
            shown.append(f"{name} <{mail}>" if name and name != mail else mail)
    return ", ".join(shown)
