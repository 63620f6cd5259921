"""GoogleCalendar and Gmail against recorded payloads through httpx's transport layer."""

from __future__ import annotations

import asyncio
import base64
import email
import email.policy
import json

import httpx
import pytest

from protolink.tools import (
    Gmail,
    GoogleAPIError,
    GoogleCalendar,
    calendar_tools,
    email_tools,
)
from protolink.tools.services._http import MAX_RESPONSE_BYTES

from .service_support import Approvals, Replay, fixture, ok, service_agent

WEEK = {"start": "2025-03-01T00:00:00+01:00", "end": "2025-03-08T00:00:00+01:00"}


def calendar_agent(replay: Replay, token="ya29.token", calendar_id="primary", approvals=None):
    backend = GoogleCalendar(token, calendar_id=calendar_id, transport=replay.transport)
    return service_agent(calendar_tools(backend, allow_write=True), approvals)


def gmail_agent(replay: Replay, sender="me@example.com", approvals=None):
    backend = Gmail("ya29.token", sender=sender, transport=replay.transport)
    return service_agent(email_tools(backend, allow_write=True, allow_send=True), approvals)


# -- Google Calendar -----------------------------------------------------------------------

async def test_listing_expands_recurrences_and_keeps_google_fields_across_pages():
    replay = Replay(ok("google_calendar_events_page1.json"), ok("google_calendar_events_page2.json"))
    agent = calendar_agent(replay)
    first = await agent.call_tool("list_calendar_events", **WEEK, query="standup offsite", max_results=2)
    request = replay.requests[0]
    assert (request.method, request.url.host, request.url.path) == (
        "GET", "www.googleapis.com", "/calendar/v3/calendars/primary/events")
    assert dict(request.url.params) == {
        "timeMin": "2025-03-01T00:00:00+01:00", "timeMax": "2025-03-08T00:00:00+01:00",
        "singleEvents": "true", "orderBy": "startTime", "maxResults": "2", "q": "standup offsite"}
    assert request.headers["authorization"] == "Bearer ya29.token"
    standup, offsite = first["items"]
    assert standup["recurringEventId"] == "58teqv06sj4ubb7l9mb1r4ogf2"
    assert standup["start"] == {"dateTime": "2025-03-03T09:00:00+01:00", "timeZone": "Europe/Zurich"}
    assert offsite["start"] == {"date": "2025-03-04"} and offsite["end"] == {"date": "2025-03-06"}
    assert first["next_page_token"] == fixture("google_calendar_events_page1.json")["nextPageToken"]

    second = await agent.call_tool("list_calendar_events", **WEEK, query="standup offsite", max_results=2,
                                   page_token=first["next_page_token"])
    assert replay.requests[1].url.params["pageToken"] == first["next_page_token"]
    assert [e["id"] for e in second["items"]] == ["58teqv06sj4ubb7l9mb1r4ogf2_20250304T080000Z"]
    assert second["next_page_token"] is None


async def test_calendar_ids_are_one_path_segment():
    replay = Replay(ok("google_calendar_events_page2.json"))
    agent = calendar_agent(replay, calendar_id="../../users/me/settings?x=1")
    await agent.call_tool("list_calendar_events", **WEEK)
    assert replay.requests[0].url.raw_path.startswith(
        b"/calendar/v3/calendars/..%2F..%2Fusers%2Fme%2Fsettings%3Fx%3D1/events?")


async def test_creation_sends_a_personal_timed_event_and_returns_the_service_object():
    replay, approvals = Replay(ok("google_calendar_event_created.json")), Approvals()
    agent = calendar_agent(replay, approvals=approvals)
    event = await agent.call_tool("create_calendar_event", title="Dentist", start="2025-03-05T14:00:00+01:00",
                                  end="2025-03-05T15:00:00+01:00", location="Bahnhofstrasse 1")
    assert event == fixture("google_calendar_event_created.json")
    request = replay.requests[0]
    assert request.method == "POST" and request.url.params["sendUpdates"] == "none"
    assert json.loads(request.content) == {
        "summary": "Dentist", "location": "Bahnhofstrasse 1",
        "start": {"dateTime": "2025-03-05T14:00:00+01:00"}, "end": {"dateTime": "2025-03-05T15:00:00+01:00"}}
    preview = approvals.requests[0].artifacts[0].content
    assert preview["target"] == {"service": "Google Calendar", "calendar_id": "primary"}
    assert "ya29" not in str(approvals.requests[0].to_dict())


async def test_token_callbacks_sync_and_async_are_resolved_for_every_request():
    tokens = iter(["first-token", "second-token"])

    async def refreshing() -> str:
        return next(tokens)

    replay = Replay(ok("google_calendar_events_page2.json"), ok("google_calendar_events_page2.json"))
    agent = calendar_agent(replay, token=refreshing)
    await agent.call_tool("list_calendar_events", **WEEK)
    await agent.call_tool("list_calendar_events", **WEEK)
    assert [r.headers["authorization"] for r in replay.requests] == ["Bearer first-token", "Bearer second-token"]

    calls = []
    sync_replay = Replay(ok("google_calendar_events_page2.json"))
    await calendar_agent(sync_replay, token=lambda: calls.append(1) or "sync-token").call_tool(
        "list_calendar_events", **WEEK)
    assert calls == [1] and sync_replay.requests[0].headers["authorization"] == "Bearer sync-token"


async def test_a_callback_returning_no_token_fails_without_a_request():
    replay = Replay()
    agent = calendar_agent(replay, token=lambda: None)
    with pytest.raises(ValueError, match="access token"):
        await agent.call_tool("list_calendar_events", **WEEK)
    assert replay.requests == []


def test_construction_rejects_unusable_tokens_and_contacts_nothing():
    with pytest.raises(ValueError):
        GoogleCalendar("token with\r\nheader")
    with pytest.raises(TypeError):
        GoogleCalendar(42)  # type: ignore[arg-type]
    GoogleCalendar(lambda: "later")


# -- HTTP failures, shared by every Google and Microsoft request ----------------------------

async def test_http_errors_expose_the_status_but_not_the_remote_body():
    replay = Replay(httpx.Response(403, json={"error": {"message": "secret-internal-detail for me@example.com"}}))
    with pytest.raises(GoogleAPIError) as raised:
        await calendar_agent(replay).call_tool("list_calendar_events", **WEEK)
    assert raised.value.status_code == 403
    assert "secret-internal-detail" not in str(raised.value) and "403" in str(raised.value)


async def test_server_errors_are_not_retried():
    replay = Replay(httpx.Response(503), ok("google_calendar_events_page2.json"))
    with pytest.raises(GoogleAPIError) as raised:
        await calendar_agent(replay).call_tool("list_calendar_events", **WEEK)
    assert raised.value.status_code == 503 and len(replay.requests) == 1


async def test_redirects_are_refused():
    replay = Replay(httpx.Response(302, headers={"Location": "https://attacker.example/steal"}))
    with pytest.raises(GoogleAPIError, match="redirect") as raised:
        await calendar_agent(replay).call_tool("list_calendar_events", **WEEK)
    assert raised.value.status_code == 302 and len(replay.requests) == 1


class Chunks(httpx.AsyncByteStream):
    """A streamed body of ``count`` chunks, optionally stalling after the first; records closing."""

    def __init__(self, chunk: bytes, count: int, stall: bool = False) -> None:
        self.chunk, self.count, self.stall, self.closed = chunk, count, stall, False

    async def __aiter__(self):
        for index in range(self.count):
            yield self.chunk
            if self.stall and index == 0:
                await asyncio.Event().wait()

    async def aclose(self) -> None:
        self.closed = True


async def test_responses_are_capped_at_two_mebibytes_while_streaming():
    body = Chunks(b" " * 65536, MAX_RESPONSE_BYTES // 65536 + 1)
    replay = Replay(httpx.Response(200, stream=body))
    with pytest.raises(GoogleAPIError, match="exceeds") as raised:
        await calendar_agent(replay).call_tool("list_calendar_events", **WEEK)
    assert raised.value.status_code is None and body.closed


async def test_a_declared_oversized_response_is_refused_before_reading():
    body = Chunks(b"{}", 1)
    replay = Replay(httpx.Response(200, stream=body, headers={"Content-Length": str(MAX_RESPONSE_BYTES + 1)}))
    with pytest.raises(GoogleAPIError, match="exceeds"):
        await calendar_agent(replay).call_tool("list_calendar_events", **WEEK)
    assert body.closed


async def test_a_stalled_response_is_closed_on_timeout_and_on_cancellation():
    stalled = Chunks(b'{"items": [', 2, stall=True)
    backend = GoogleCalendar("t", transport=Replay(httpx.Response(200, stream=stalled)).transport)
    agent = service_agent(calendar_tools(backend, timeout_seconds=0.1))
    with pytest.raises(TimeoutError):
        await agent.call_tool("list_calendar_events", **WEEK)
    assert stalled.closed

    stalled = Chunks(b'{"items": [', 2, stall=True)
    replay = Replay(httpx.Response(200, stream=stalled))
    task = asyncio.create_task(calendar_agent(replay).call_tool("list_calendar_events", **WEEK))
    while not replay.requests:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stalled.closed


@pytest.mark.parametrize("body", [b"<html>Sign in</html>", b"[1, 2]"])
async def test_bodies_that_are_not_json_objects_are_rejected(body):
    replay = Replay(httpx.Response(200, content=body))
    with pytest.raises(GoogleAPIError, match="JSON"):
        await calendar_agent(replay).call_tool("list_calendar_events", **WEEK)


async def test_proxy_environment_variables_are_ignored(monkeypatch):
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    replay = Replay(ok("google_calendar_events_page2.json"))
    await calendar_agent(replay).call_tool("list_calendar_events", **WEEK)
    assert len(replay.requests) == 1


# -- Gmail ------------------------------------------------------------------------------

async def test_gmail_lists_message_identifiers_with_provider_query_and_pages():
    replay = Replay(ok("gmail_messages_page1.json"), ok("gmail_messages_page2.json"))
    agent = gmail_agent(replay)
    first = await agent.call_tool("list_email_messages", query="is:unread newer_than:7d", max_results=2)
    assert replay.requests[0].url.path == "/gmail/v1/users/me/messages"
    assert dict(replay.requests[0].url.params) == {"q": "is:unread newer_than:7d", "maxResults": "2"}
    assert first == {"items": [{"id": "18f3c2a9d4e5b601", "thread_id": "18f3c2a9d4e5b601"},
                               {"id": "18f3b9e0c7a1d502", "thread_id": "18f3b7d2a0c9e400"}],
                     "next_page_token": "09876543210987654321"}
    second = await agent.call_tool("list_email_messages", query="is:unread newer_than:7d", max_results=2,
                                   page_token=first["next_page_token"])
    assert replay.requests[1].url.params["pageToken"] == "09876543210987654321"
    assert second["next_page_token"] is None
    assert "is:unread newer_than:7d" in agent.tools["list_email_messages"].description


async def test_gmail_decodes_nested_mime_and_declared_charsets_without_attachments():
    replay = Replay(ok("gmail_message_nested.json"))
    message = await gmail_agent(replay).call_tool("read_email", message_id="18f3c2a9d4e5b601")
    assert len(replay.requests) == 1 and replay.requests[0].url.params["format"] == "full"
    assert message["body"] == "Grüße aus Zürich!\nDie Präsentation ist im Anhang."
    assert message["has_attachments"] is True and message["html_body_omitted"] is False
    assert message["body_truncated"] is False
    assert message["headers"]["subject"] == "Präsentation Q1"
    assert message["headers"]["from"] == "Jürg Müller <juerg@example.org>"
    assert message["headers"]["cc"] == "team@example.org" and message["headers"]["reply_to"] is None
    assert message["snippet"].endswith("It's attached.")
    assert message["thread_id"] == "18f3c2a9d4e5b601" and "UNREAD" in message["label_ids"]


async def test_gmail_omits_html_only_bodies():
    message = await gmail_agent(Replay(ok("gmail_message_html_only.json"))).call_tool(
        "read_email", message_id="18f3b9e0c7a1d502")
    assert message["body"] == "" and message["html_body_omitted"] is True
    assert message["has_attachments"] is False


async def test_gmail_bodies_are_capped_at_twenty_thousand_characters():
    payload = fixture("gmail_message_html_only.json")
    text = ("ä" * 30_000).encode("utf-8")
    payload["payload"].update(mimeType="text/plain", headers=[{"name": "Content-Type", "value": "text/plain; charset=utf-8"}],
                              body={"size": len(text), "data": base64.urlsafe_b64encode(text).decode()})
    message = await gmail_agent(Replay(httpx.Response(200, json=payload))).call_tool(
        "read_email", message_id="18f3b9e0c7a1d502")
    assert message["body"] == "ä" * 20_000 and message["body_truncated"] is True


@pytest.mark.parametrize(("charset", "data", "expected"), [
    ("windows-1252", "Caf\xe9 \x80 5".encode("latin-1"), "Café € 5"),
    ("x-unknown-charset", "Grüße".encode("utf-8"), "Grüße"),  # unknown: UTF-8
    ("us-ascii", "naïve".encode("utf-8"), "naïve"),  # mislabelled UTF-8
])
async def test_gmail_text_parts_use_their_declared_charset(charset, data, expected):
    payload = fixture("gmail_message_html_only.json")
    payload["payload"].update(mimeType="text/plain", body={"data": base64.urlsafe_b64encode(data).decode()},
                              headers=[{"name": "Content-Type", "value": f"text/plain; charset={charset}"}])
    message = await gmail_agent(Replay(httpx.Response(200, json=payload))).call_tool(
        "read_email", message_id="18f3b9e0c7a1d502")
    assert message["body"] == expected


async def test_gmail_message_ids_cannot_change_the_request_path():
    replay = Replay()
    with pytest.raises(ValueError, match="Gmail message id"):
        await gmail_agent(replay).call_tool("read_email", message_id="../drafts/r-1")
    assert replay.requests == []


def test_gmail_composing_requires_the_fixed_sender():
    email_tools(Gmail("t"))  # reading works without one
    with pytest.raises(ValueError, match="sender"):
        email_tools(Gmail("t"), allow_write=True)
    with pytest.raises(ValueError, match="sender"):
        email_tools(Gmail("t"), allow_send=True)
    with pytest.raises(ValueError, match="bare ASCII"):
        Gmail("t", sender="Me <me@example.com>")


def raw_message(request: httpx.Request, *path: str) -> email.message.EmailMessage:
    data = json.loads(request.content)
    for key in path:
        data = data[key]
    return email.message_from_bytes(base64.urlsafe_b64decode(data), policy=email.policy.default)


async def test_gmail_drafts_carry_the_fixed_sender_and_return_draft_and_message_ids():
    replay, approvals = Replay(ok("gmail_draft_created.json")), Approvals()
    result = await gmail_agent(replay, approvals=approvals).call_tool(
        "create_email_draft", to=["bob@example.com", "carol@example.com"], subject="Lunch on Friday?",
        body="Shall we have lunch on Friday at noon?\nÀ bientôt")
    assert result == {"status": "drafted", "draft_id": "r-5837261940182736451",
                      "message_id": "18f3d0e1f2a3b4c5", "thread_id": "18f3d0e1f2a3b4c5"}
    request = replay.requests[0]
    assert (request.method, request.url.path) == ("POST", "/gmail/v1/users/me/drafts")
    sent = raw_message(request, "message", "raw")
    assert sent["From"] == "me@example.com" and sent["To"] == "bob@example.com, carol@example.com"
    assert sent["Subject"] == "Lunch on Friday?" and sent["Message-ID"]
    assert sent.get_content().splitlines() == ["Shall we have lunch on Friday at noon?", "À bientôt"]
    assert approvals.requests[0].artifacts[0].content["target"]["sender"] == "me@example.com"


async def test_gmail_sending_returns_the_service_message_and_thread_ids():
    replay = Replay(ok("gmail_message_sent.json"))
    result = await gmail_agent(replay).call_tool("send_email", to=["bob@example.com"], subject="Hi", body="Hello")
    assert result == {"status": "accepted", "message_id": "18f3d1a2b3c4d5e6", "thread_id": "18f3d1a2b3c4d5e6"}
    assert replay.requests[0].url.path == "/gmail/v1/users/me/messages/send"
    assert raw_message(replay.requests[0], "raw")["To"] == "bob@example.com"
