"""OutlookCalendar and OutlookEmail against recorded Microsoft Graph payloads."""

from __future__ import annotations

import base64
import json

import httpx
import pytest

from protolink.tools import (
    MicrosoftGraphError,
    OutlookCalendar,
    OutlookEmail,
    calendar_tools,
    email_tools,
)

from .service_support import Replay, fixture, ok, service_agent

WEEK = {"start": "2025-03-01T00:00:00+00:00", "end": "2025-03-08T00:00:00+00:00"}
PREFER = 'IdType="ImmutableId", outlook.body-content-type="text"'


def calendar_agent(replay: Replay, **options):
    backend = OutlookCalendar("eyJ0.token", transport=replay.transport, **options)
    return service_agent(calendar_tools(backend, allow_write=True))


def mail_agent(replay: Replay, **options):
    backend = OutlookEmail("eyJ0.token", transport=replay.transport, **options)
    return service_agent(email_tools(backend, allow_write=True, allow_send=True))


def page_with_next_link(name: str, link: str) -> httpx.Response:
    payload = fixture(name)
    payload["@odata.nextLink"] = link
    return httpx.Response(200, json=payload)


# -- calendar ------------------------------------------------------------------------------

async def test_calendar_view_lists_occurrences_with_immutable_ids_and_follows_next_links():
    replay = Replay(ok("graph_calendarview_page1.json"), ok("graph_calendarview_page2.json"))
    agent = calendar_agent(replay)
    first = await agent.call_tool("list_calendar_events", **WEEK, max_results=2)
    request = replay.requests[0]
    assert (request.url.host, request.url.path) == ("graph.microsoft.com", "/v1.0/me/calendar/calendarView")
    assert dict(request.url.params) == {"startDateTime": WEEK["start"], "endDateTime": WEEK["end"],
                                        "$top": "2", "$orderby": "start/dateTime"}
    assert request.headers["prefer"] == PREFER
    assert request.headers["authorization"] == "Bearer eyJ0.token"
    standup, offsite = first["items"]
    assert standup["type"] == "occurrence" and standup["seriesMasterId"] == "AAMkAGI2TG93AAA="
    assert offsite["isAllDay"] is True and offsite["start"]["dateTime"] == "2025-03-04T00:00:00.0000000"

    second = await agent.call_tool("list_calendar_events", **WEEK, max_results=2,
                                   page_token=first["next_page_token"])
    assert str(replay.requests[1].url) == fixture("graph_calendarview_page1.json")["@odata.nextLink"]
    assert replay.requests[1].headers["prefer"] == PREFER
    assert [e["subject"] for e in second["items"]] == ["Team standup"] and second["next_page_token"] is None


async def test_explicit_user_and_calendar_are_single_path_segments():
    replay = Replay(ok("graph_calendarview_page2.json"))
    agent = calendar_agent(replay, user_id="me@example.com", calendar_id="AAMk/../../other")
    await agent.call_tool("list_calendar_events", **WEEK)
    assert replay.requests[0].url.raw_path.startswith(
        b"/v1.0/users/me%40example.com/calendars/AAMk%2F..%2F..%2Fother/calendarView?")


async def test_query_filters_each_page_and_empty_pages_keep_their_token():
    replay = Replay(ok("graph_calendarview_page1.json"), ok("graph_calendarview_page2.json"))
    agent = calendar_agent(replay)
    first = await agent.call_tool("list_calendar_events", **WEEK, max_results=2, query="LAKESIDE")
    assert [e["subject"] for e in first["items"]] == ["Company offsite"]  # matched by location
    second = await agent.call_tool("list_calendar_events", **WEEK, max_results=2, query="LAKESIDE",
                                   page_token=first["next_page_token"])
    assert second == {"items": [], "next_page_token": None}

    replay = Replay(ok("graph_calendarview_page1.json"))
    empty = await calendar_agent(replay).call_tool("list_calendar_events", **WEEK, max_results=2, query="nothing")
    assert empty["items"] == [] and empty["next_page_token"]


@pytest.mark.parametrize("link", [
    "https://graph.microsoft.com/v1.0/users/ceo@example.com/calendar/calendarView?$skip=2",
    "https://graph.microsoft.com/v1.0/me/calendars/other-calendar/calendarView?$skip=2",
    "https://graph.microsoft.com/v1.0/me/messages?$skip=2",
    "https://attacker.example/v1.0/me/calendar/calendarView?$skip=2",
    "http://graph.microsoft.com/v1.0/me/calendar/calendarView?$skip=2",
    "https://graph.microsoft.com:8443/v1.0/me/calendar/calendarView?$skip=2",
    "https://user:pw@graph.microsoft.com/v1.0/me/calendar/calendarView?$skip=2",
    "https://graph.microsoft.com/v1.0/me/calendar/calendarView/../../../users/ceo/calendar/calendarView",
])
async def test_continuation_links_outside_the_original_collection_are_refused(link):
    replay = Replay(page_with_next_link("graph_calendarview_page1.json", link))
    with pytest.raises(MicrosoftGraphError, match="outside the requested collection"):
        await calendar_agent(replay).call_tool("list_calendar_events", **WEEK, max_results=2)


async def test_page_tokens_belong_to_one_instance_and_one_set_of_arguments():
    replay = Replay(ok("graph_calendarview_page1.json"))
    agent = calendar_agent(replay)
    token = (await agent.call_tool("list_calendar_events", **WEEK, max_results=2))["next_page_token"]
    for changed in ({"max_results": 3}, {"query": "standup"}, {"end": "2025-03-09T00:00:00+00:00"}):
        with pytest.raises(ValueError, match="does not belong"):
            await agent.call_tool("list_calendar_events", **{**WEEK, "max_results": 2, **changed},
                                  page_token=token)
    with pytest.raises(ValueError, match="does not belong"):  # a recreated backend
        await calendar_agent(Replay()).call_tool("list_calendar_events", **WEEK, max_results=2, page_token=token)
    encoded, _, mac = token.rpartition(".")
    forged_link = "https://graph.microsoft.com/v1.0/users/ceo@example.com/calendar/calendarView"
    forged = base64.urlsafe_b64encode(forged_link.encode()).decode().rstrip("=") + "." + mac
    with pytest.raises(ValueError, match="does not belong"):
        await agent.call_tool("list_calendar_events", **WEEK, max_results=2, page_token=forged)
    assert len(replay.requests) == 1


async def test_creation_converts_offsets_to_utc_and_invites_nobody():
    replay = Replay(ok("graph_event_created.json", status=201))
    event = await calendar_agent(replay).call_tool(
        "create_calendar_event", title="Dentist", start="2025-03-05T14:00:00+01:00",
        end="2025-03-05T15:00:00+01:00", description="Check-up", location="Bahnhofstrasse 1")
    assert event["id"] == fixture("graph_event_created.json")["id"]
    request = replay.requests[0]
    assert (request.method, request.url.path) == ("POST", "/v1.0/me/calendar/events")
    assert json.loads(request.content) == {
        "subject": "Dentist", "attendees": [],
        "start": {"dateTime": "2025-03-05T13:00:00", "timeZone": "UTC"},
        "end": {"dateTime": "2025-03-05T14:00:00", "timeZone": "UTC"},
        "body": {"contentType": "text", "content": "Check-up"},
        "location": {"displayName": "Bahnhofstrasse 1"}}


async def test_graph_errors_expose_the_status_but_not_the_remote_body():
    replay = Replay(httpx.Response(401, json={"error": {"code": "InvalidAuthenticationToken",
                                                        "message": "secret tenant detail"}}))
    with pytest.raises(MicrosoftGraphError) as raised:
        await calendar_agent(replay).call_tool("list_calendar_events", **WEEK)
    assert raised.value.status_code == 401 and "secret tenant detail" not in str(raised.value)


# -- mail ------------------------------------------------------------------------------------

async def test_empty_query_lists_newest_first_and_search_uses_graph_search():
    replay = Replay(ok("graph_messages_page1.json"), ok("graph_messages_page2.json"), ok("graph_messages_page2.json"))
    agent = mail_agent(replay)
    first = await agent.call_tool("list_email_messages", max_results=2)
    assert replay.requests[0].url.path == "/v1.0/me/messages"
    assert dict(replay.requests[0].url.params) == {"$top": "2", "$select": "id",
                                                   "$orderby": "receivedDateTime desc"}
    assert [item["id"][-8:] for item in first["items"]] == ["B6Ab1AAA", "B6Ab2AAA"]
    second = await agent.call_tool("list_email_messages", max_results=2, page_token=first["next_page_token"])
    assert str(replay.requests[1].url) == fixture("graph_messages_page1.json")["@odata.nextLink"]
    assert second["next_page_token"] is None

    await agent.call_tool("list_email_messages", query='subject:"Q1 review"', max_results=5)
    assert dict(replay.requests[2].url.params) == {"$top": "5", "$select": "id",
                                                   "$search": '"subject:\\"Q1 review\\""'}


async def test_mail_continuation_cannot_switch_mailboxes():
    link = "https://graph.microsoft.com/v1.0/users/ceo@example.com/messages?$skip=2"
    replay = Replay(page_with_next_link("graph_messages_page1.json", link))
    with pytest.raises(MicrosoftGraphError, match="outside"):
        await mail_agent(replay).call_tool("list_email_messages", max_results=2)


async def test_reads_request_plain_text_with_immutable_ids():
    message_id = fixture("graph_message_text.json")["id"]
    replay = Replay(ok("graph_message_text.json"))
    message = await mail_agent(replay).call_tool("read_email", message_id=message_id)
    request = replay.requests[0]
    assert request.method == "GET" and request.url.path == f"/v1.0/me/messages/{message_id}"
    assert request.headers["prefer"] == PREFER and "body" in request.url.params["$select"]
    assert message["body"] == "Hi,\r\n\r\nplease review the attached deck by Friday.\r\n\r\nThanks, Ana\r\n"
    assert message["headers"] == {
        "from": "Ana Silva <ana@contoso.example>", "to": "Me <me@example.com>",
        "cc": "review-board@contoso.example", "reply_to": None, "date": "2025-02-28T10:00:02Z",
        "subject": "Review: Q1 deck",
        "message_id": "<DB9PR01MB0001.review@DB9PR01MB0001.eurprd01.prod.outlook.com>"}
    assert message["has_attachments"] is True and message["html_body_omitted"] is False
    assert message["snippet"].startswith("Hi, please review")


async def test_html_bodies_are_omitted():
    message = await mail_agent(Replay(ok("graph_message_html.json"))).call_tool(
        "read_email", message_id=fixture("graph_message_html.json")["id"])
    assert message["body"] == "" and message["html_body_omitted"] is True


async def test_message_ids_cannot_leave_the_messages_collection():
    replay = Replay(ok("graph_message_text.json"))
    await mail_agent(replay).call_tool("read_email", message_id="AAk/users+ceo=")  # legacy ids have / and +
    assert replay.requests[0].url.raw_path.startswith(b"/v1.0/me/messages/AAk%2Fusers%2Bceo%3D?")
    for hostile in ("AAk/../../users/ceo/messages/X", "id with spaces?", "AAk#fragment"):
        with pytest.raises(ValueError, match="Graph message id"):
            await mail_agent(Replay()).call_tool("read_email", message_id=hostile)


async def test_drafts_return_the_graph_object_and_sending_is_accepted_with_a_sent_copy():
    replay = Replay(ok("graph_draft_created.json", status=201), httpx.Response(202))
    agent = mail_agent(replay)
    draft = await agent.call_tool("create_email_draft", to=["bob@example.com"], subject="Lunch on Friday?",
                                  body="Shall we have lunch on Friday at noon?")
    assert draft["status"] == "drafted" and draft["id"] == fixture("graph_draft_created.json")["id"]
    assert draft["draft"] == fixture("graph_draft_created.json")
    assert json.loads(replay.requests[0].content) == {
        "subject": "Lunch on Friday?",
        "body": {"contentType": "Text", "content": "Shall we have lunch on Friday at noon?"},
        "toRecipients": [{"emailAddress": {"address": "bob@example.com"}}]}

    sent = await agent.call_tool("send_email", to=["bob@example.com", "carol@example.com"], subject="Hi",
                                 body="Hello")
    assert sent == {"status": "accepted"}
    request = replay.requests[1]
    assert (request.method, request.url.path) == ("POST", "/v1.0/me/sendMail")
    body = json.loads(request.content)
    assert body["saveToSentItems"] is True
    assert [r["emailAddress"]["address"] for r in body["message"]["toRecipients"]] == [
        "bob@example.com", "carol@example.com"]


async def test_application_tokens_select_an_explicit_mailbox():
    replay = Replay(ok("graph_messages_page2.json"))
    await mail_agent(replay, user_id="shared-desk@example.com").call_tool("list_email_messages")
    assert replay.requests[0].url.path == "/v1.0/users/shared-desk@example.com/messages"
