"""All five calendar/email backends on the same Assistant, offline.

Google Calendar, Gmail, Outlook Calendar and Outlook Email answer from recorded API payloads
(tests/fixtures/services) through an ``httpx.MockTransport``: the backends build exactly the
requests they would send to Google and Microsoft, and each is printed. IMAP/SMTP runs against a
tiny loopback stand-in (examples/_loopback_mail.py, TLS with a demonstration certificate) to
show its IDs, page tokens, UIDVALIDITY checks and partial SMTP acceptance::

    pip install 'protolink[integrations]'
    python examples/service_backends.py

Reads are allowed; drafts, sends and event creation require approval, which this demonstration
grants automatically while printing the configured target and exact arguments. No account is
contacted and no mail is delivered.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from _loopback_mail import LoopbackMail
from protolink import ApprovalRequest, Assistant, RunContext
from protolink.tools import (
    Gmail,
    GoogleCalendar,
    IMAPEmail,
    MailBackendError,
    OutlookCalendar,
    OutlookEmail,
)

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "services"
WEEK = {"start": "2025-03-01T00:00:00+01:00", "end": "2025-03-08T00:00:00+01:00"}
LUNCH = {"to": ["bob@example.com"], "subject": "Lunch on Friday?", "body": "Shall we have lunch at noon?"}

# (method, path, True when continuing a page) -> (status, recorded payload)
RECORDED: dict[tuple[str, str, bool], tuple[int, str | None]] = {
    ("GET", "/calendar/v3/calendars/primary/events", False): (200, "google_calendar_events_page1.json"),
    ("GET", "/calendar/v3/calendars/primary/events", True): (200, "google_calendar_events_page2.json"),
    ("POST", "/calendar/v3/calendars/primary/events", False): (200, "google_calendar_event_created.json"),
    ("GET", "/gmail/v1/users/me/messages", False): (200, "gmail_messages_page1.json"),
    ("GET", "/gmail/v1/users/me/messages", True): (200, "gmail_messages_page2.json"),
    ("GET", "/gmail/v1/users/me/messages/18f3c2a9d4e5b601", False): (200, "gmail_message_nested.json"),
    ("GET", "/gmail/v1/users/me/messages/18f3b9e0c7a1d502", False): (200, "gmail_message_html_only.json"),
    ("POST", "/gmail/v1/users/me/drafts", False): (200, "gmail_draft_created.json"),
    ("POST", "/gmail/v1/users/me/messages/send", False): (200, "gmail_message_sent.json"),
    ("GET", "/v1.0/me/calendar/calendarView", False): (200, "graph_calendarview_page1.json"),
    ("GET", "/v1.0/me/calendar/calendarView", True): (200, "graph_calendarview_page2.json"),
    ("POST", "/v1.0/me/calendar/events", False): (201, "graph_event_created.json"),
    ("GET", "/v1.0/me/messages", False): (200, "graph_messages_page1.json"),
    ("GET", "/v1.0/me/messages", True): (200, "graph_messages_page2.json"),
    ("POST", "/v1.0/me/messages", False): (201, "graph_draft_created.json"),
    ("POST", "/v1.0/me/sendMail", False): (202, None),
}
GRAPH_MESSAGES = {json.loads((FIXTURES / name).read_text())["id"]: name
                  for name in ("graph_message_text.json", "graph_message_html.json")}


def recorded_services(request: httpx.Request) -> httpx.Response:
    """The offline stand-in for Google's and Microsoft's APIs."""
    print(f"    -> {request.method} {request.url.host}{request.url.path}")
    continuing = "pageToken" in request.url.params or "$skip" in request.url.params
    key = (request.method, request.url.path, continuing)
    message_id = request.url.path.rpartition("/")[2]
    if key not in RECORDED and request.url.path.startswith("/v1.0/me/messages/") and message_id in GRAPH_MESSAGES:
        status, name = 200, GRAPH_MESSAGES[message_id]
    else:
        status, name = RECORDED.get(key, (404, None))
    payload = json.loads((FIXTURES / name).read_text(encoding="utf-8")) if name else None
    return httpx.Response(status, json=payload) if payload is not None else httpx.Response(status)


OFFLINE = httpx.MockTransport(recorded_services)


async def approve_and_show(request: ApprovalRequest, run: RunContext) -> bool:
    for artifact in request.artifacts:
        content = artifact.content
        print(f"  approval for {request.action.tool}: target={json.dumps(content['target'])}")
        print(f"    arguments={json.dumps(content['arguments'], ensure_ascii=False)}")
    return True


def show(label: str, value: Any) -> None:
    print(f"  {label}: {json.dumps(value, ensure_ascii=False)}")


async def refreshed_token() -> str:
    """An application's token callback: resolved again for every request."""
    return "ya29.offline-demo-token"


async def google_section() -> None:
    print("\n== Google Calendar and Gmail (recorded API payloads)")
    assistant = Assistant(
        calendar=GoogleCalendar(refreshed_token, calendar_id="primary", transport=OFFLINE),
        email=Gmail(refreshed_token, sender="me@example.com", transport=OFFLINE),
        allow_write=True, allow_send=True, approval_handler=approve_and_show)
    page = await assistant.call_tool("list_calendar_events", **WEEK, max_results=2)
    show("events", [(e["summary"], e["start"]) for e in page["items"]])
    page = await assistant.call_tool("list_calendar_events", **WEEK, max_results=2, page_token=page["next_page_token"])
    show("next page", [(e["summary"], e["recurringEventId"]) for e in page["items"]])
    event = await assistant.call_tool("create_calendar_event", title="Dentist", start="2025-03-05T14:00:00+01:00",
                                      end="2025-03-05T15:00:00+01:00", location="Bahnhofstrasse 1")
    show("created", {"id": event["id"], "start": event["start"]})
    listed = await assistant.call_tool("list_email_messages", query="is:unread newer_than:7d", max_results=2)
    show("messages", listed)
    nested = await assistant.call_tool("read_email", message_id="18f3c2a9d4e5b601")
    show("nested MIME (ISO-8859-1 text part)", {key: nested[key] for key in (
        "body", "has_attachments", "html_body_omitted")} | {"subject": nested["headers"]["subject"]})
    html_only = await assistant.call_tool("read_email", message_id="18f3b9e0c7a1d502")
    show("HTML-only", {"body": html_only["body"], "html_body_omitted": html_only["html_body_omitted"]})
    show("draft", await assistant.call_tool("create_email_draft", **LUNCH))
    show("sent", await assistant.call_tool("send_email", **LUNCH))


async def microsoft_section() -> None:
    print("\n== Outlook calendar and mailbox (recorded Microsoft Graph payloads)")
    assistant = Assistant(calendar=OutlookCalendar(refreshed_token, transport=OFFLINE),
                          email=OutlookEmail(refreshed_token, transport=OFFLINE),
                          allow_write=True, allow_send=True, approval_handler=approve_and_show)
    week = {"start": "2025-03-01T00:00:00+00:00", "end": "2025-03-08T00:00:00+00:00"}
    page = await assistant.call_tool("list_calendar_events", **week, max_results=2, query="lakeside")
    show("filtered page", [(e["subject"], e["isAllDay"]) for e in page["items"]])
    page = await assistant.call_tool("list_calendar_events", **week, max_results=2, query="lakeside",
                                     page_token=page["next_page_token"])
    show("next filtered page (empty is fine)", page)
    page = await assistant.call_tool("list_calendar_events", **week, max_results=2)
    try:
        await assistant.call_tool("list_calendar_events", **week, max_results=5, page_token=page["next_page_token"])
    except ValueError as error:
        print(f"  a token reused with other arguments is refused: {error}")
    event = await assistant.call_tool("create_calendar_event", title="Dentist", start="2025-03-05T14:00:00+01:00",
                                      end="2025-03-05T15:00:00+01:00")
    show("created (sent as UTC)", {"id": event["id"][-12:], "start": event["start"]})
    listed = await assistant.call_tool("list_email_messages", max_results=2)
    message = await assistant.call_tool("read_email", message_id=listed["items"][0]["id"])
    show("read", {"from": message["headers"]["from"], "subject": message["headers"]["subject"],
                  "has_attachments": message["has_attachments"]})
    draft = await assistant.call_tool("create_email_draft", **LUNCH)
    show("draft", {"status": draft["status"], "isDraft": draft["draft"]["isDraft"]})
    show("sent", await assistant.call_tool("send_email", **LUNCH))


async def imap_section() -> None:
    print("\n== IMAP and SMTP (loopback stand-in; the tests use Dovecot and aiosmtpd)")
    with LoopbackMail() as server:
        for subject in ("Agenda", "Minutes", "Invoice #4711"):
            server.folders["INBOX"].add(f"From: ana@example.org\r\nTo: me@example.com\r\nSubject: {subject}\r\n"
                                        f"\r\n{subject} for Thursday.\r\n".encode())
        mail = IMAPEmail("me@example.com", lambda: "app-password", imap_host="localhost",
                         imap_port=server.imap_port, smtp_host="localhost", smtp_port=server.smtp_port,
                         drafts_mailbox="Drafts", ssl_context=server.client_context())
        # A Microsoft calendar and an IMAP mailbox on one assistant.
        assistant = Assistant(calendar=OutlookCalendar(refreshed_token, transport=OFFLINE), email=mail,
                              allow_write=True, allow_send=True, approval_handler=approve_and_show)
        first = await assistant.call_tool("list_email_messages", max_results=2)
        show("page 1 (newest UID first)", first)
        second = await assistant.call_tool("list_email_messages", max_results=2, page_token=first["next_page_token"])
        show("page 2", second)
        message = await assistant.call_tool("read_email", message_id=first["items"][0]["id"])
        show("read", {"subject": message["headers"]["subject"], "body": message["body"]})
        show("draft", await assistant.call_tool("create_email_draft", **LUNCH))
        sent = await assistant.call_tool("send_email", to=["bob@example.com", "nobody@example.com"],
                                         subject="Agenda", body="See you Thursday.")
        show("send", {key: sent[key] for key in ("status", "accepted", "refused")})
        server.recreate("INBOX")
        try:
            await assistant.call_tool("read_email", message_id=first["items"][0]["id"])
        except MailBackendError as error:
            print(f"  after the folder was recreated: {error}")


async def main() -> None:
    await google_section()
    await microsoft_section()
    await imap_section()


if __name__ == "__main__":
    asyncio.run(main())
