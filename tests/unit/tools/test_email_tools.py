"""email_tools(): tool sets, compose limits and header injection before approval, previews."""

from __future__ import annotations

import asyncio
import email
import email.policy
from typing import Any

import pytest

from protolink import RunContext
from protolink.errors import BudgetExceededError, ToolArgumentError
from protolink.tools import IMAPEmail, InMemoryEmail, email_tools
from protolink.tools.services._mime import compose

from .service_support import Approvals, service_agent

GOOD = {"to": ["bob@example.com"], "subject": "Lunch?", "body": "Friday at noon?"}


class RecordingMailbox:
    """An EmailBackend that records calls and can stall."""

    def __init__(self, stall: bool = False) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.stall = stall

    def describe_target(self) -> dict[str, Any]:
        return {"service": "Recording", "sender": "me@example.com"}

    async def _record(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((name, arguments))
        if self.stall:
            await asyncio.Event().wait()
        return {"status": "ok", "operation": name}

    async def list_messages(self, **arguments: Any) -> dict[str, Any]:
        return await self._record("list_messages", arguments)

    async def get_message(self, **arguments: Any) -> dict[str, Any]:
        return await self._record("get_message", arguments)

    async def create_draft(self, **arguments: Any) -> dict[str, Any]:
        return await self._record("create_draft", arguments)

    async def send_message(self, **arguments: Any) -> dict[str, Any]:
        return await self._record("send_message", arguments)


def names(tools) -> list[tuple[str, tuple[str, ...]]]:
    return [(tool.name, tool.capabilities) for tool in tools]


def test_drafts_and_sending_are_independent_opt_ins():
    backend = RecordingMailbox()
    read = [("list_email_messages", ("email.read",)), ("read_email", ("email.read",))]
    assert names(email_tools(backend)) == read
    assert names(email_tools(backend, allow_write=True)) == [*read, ("create_email_draft", ("email.write",))]
    assert names(email_tools(backend, allow_send=True)) == [*read, ("send_email", ("email.send",))]
    assert names(email_tools(backend, allow_write=True, allow_send=True)) == [
        *read, ("create_email_draft", ("email.write",)), ("send_email", ("email.send",))]
    assert backend.calls == []


def test_read_only_adapters_need_only_the_read_methods():
    class ReadOnly:
        async def list_messages(self, **arguments: Any) -> dict[str, Any]:
            return {"items": [], "next_page_token": None}

        async def get_message(self, **arguments: Any) -> dict[str, Any]:
            return {}

    assert len(email_tools(ReadOnly())) == 2
    with pytest.raises(TypeError, match="send_message"):
        email_tools(ReadOnly(), allow_send=True)


def test_backends_refuse_to_compose_when_not_configured():
    imap = IMAPEmail("me@example.com", "pw", imap_host="imap.example.com")
    email_tools(imap)  # reading needs neither SMTP nor a drafts folder
    with pytest.raises(ValueError, match="drafts_mailbox"):
        email_tools(imap, allow_write=True)
    with pytest.raises(ValueError, match="smtp_host"):
        email_tools(imap, allow_send=True)
    login_name = IMAPEmail("me", "pw", imap_host="imap.example.com", drafts_mailbox="Drafts")
    with pytest.raises(ValueError, match="sender"):
        email_tools(login_name, allow_write=True)


INVALID_COMPOSE = [
    ({"to": []}, ToolArgumentError),
    ({"to": [f"r{i}@example.com" for i in range(51)]}, ToolArgumentError),
    ({"to": ["Bob <bob@example.com>"]}, "bare ASCII"),
    ({"to": ["bob@example.com, eve@example.com"]}, "bare ASCII"),
    ({"to": ["bob@example.com\r\nBcc: eve@example.com"]}, "bare ASCII"),
    ({"to": ["bøb@example.com"]}, "bare ASCII"),
    ({"to": ["bob@localhost"]}, "bare ASCII"),
    ({"to": ["bob@example.com", "BOB@example.com"]}, "twice"),
    ({"subject": "Lunch?\r\nBcc: eve@example.com"}, "header injection"),
    ({"subject": "Lunch?\nX-Priority: 1"}, "header injection"),
    ({"subject": "Lunch?\u2028Bcc: eve@example.com"}, "header injection"),
    ({"subject": "Tab\there"}, "header injection"),
    ({"subject": "=?utf-8?q?Report=0D=0ABcc:_eve@example.com?="}, "encoded word"),
    ({"subject": "Price list =?UTF-8?B?Y2Fmw6k=?= attached"}, "encoded word"),
    ({"subject": "=?utf-8?q?_?="}, "encoded word"),
    ({"subject": "   "}, "subject"),
    ({"subject": "x" * 1001}, ToolArgumentError),
    ({"body": " \n "}, "body"),
    ({"body": "x" * 200_001}, ToolArgumentError),
    ({"body": "nul\x00byte"}, "NUL"),
]


@pytest.mark.parametrize("tool", ["create_email_draft", "send_email"])
@pytest.mark.parametrize(("change", "error"), INVALID_COMPOSE)
async def test_compose_arguments_are_rejected_before_approval_or_backend(tool, change, error):
    backend, approvals = RecordingMailbox(), Approvals()
    agent = service_agent(email_tools(backend, allow_write=True, allow_send=True), approvals)
    if isinstance(error, str):
        with pytest.raises(ValueError, match=error):
            await agent.call_tool(tool, **{**GOOD, **change})
    else:
        with pytest.raises(error):
            await agent.call_tool(tool, **{**GOOD, **change})
    assert approvals.requests == [] and backend.calls == []


async def test_compose_limits_are_inclusive():
    backend = RecordingMailbox()
    agent = service_agent(email_tools(backend, allow_write=True))
    await agent.call_tool("create_email_draft", to=[f"r{i}@example.com" for i in range(50)],
                          subject="é" * 1000, body="x" * 200_000)
    assert len(backend.calls[0][1]["to"]) == 50


async def test_sending_is_approved_with_the_target_and_exact_arguments():
    backend, approvals = RecordingMailbox(), Approvals()
    agent = service_agent(email_tools(backend, allow_send=True), approvals)
    assert await agent.call_tool("send_email", **GOOD) == {"status": "ok", "operation": "send_message"}
    [request] = approvals.requests
    assert request.capabilities == ("email.send",)
    assert request.artifacts[0].content == {
        "target": {"service": "Recording", "sender": "me@example.com"},
        "operation": "send_message", "arguments": GOOD}
    assert backend.calls == [("send_message", GOOD)]


async def test_declined_sending_never_reaches_the_backend():
    backend = RecordingMailbox()
    agent = service_agent(email_tools(backend, allow_send=True), Approvals(approve=False))
    with pytest.raises(PermissionError):
        await agent.call_tool("send_email", **GOOD)
    assert backend.calls == []


async def test_reads_are_allowed_without_approval():
    backend, approvals = RecordingMailbox(), Approvals()
    agent = service_agent(email_tools(backend), approvals)
    await agent.call_tool("list_email_messages", query="is:unread", max_results=5)
    await agent.call_tool("read_email", message_id="m-1")
    assert approvals.requests == []
    assert backend.calls == [("list_messages", {"query": "is:unread", "max_results": 5, "page_token": None}),
                             ("get_message", {"message_id": "m-1"})]


@pytest.mark.parametrize("arguments", [{"max_results": 0}, {"max_results": 101}, {"query": "q" * 1001},
                                       {"page_token": ""}])
async def test_listing_arguments_outside_their_limits_are_rejected(arguments):
    agent = service_agent(email_tools(RecordingMailbox()))
    with pytest.raises(ToolArgumentError):
        await agent.call_tool("list_email_messages", **arguments)


async def test_each_operation_is_bounded_by_timeout_and_run_budget():
    agent = service_agent(email_tools(RecordingMailbox(stall=True), timeout_seconds=0.05))
    with pytest.raises(TimeoutError):
        await agent.call_tool("read_email", message_id="m-1")
    slow = service_agent(email_tools(RecordingMailbox(stall=True), timeout_seconds=3600))
    with pytest.raises(BudgetExceededError):
        await slow.call_tool("read_email", message_id="m-1", context=RunContext(max_seconds=0.05))


# -- the in-memory backend ---------------------------------------------------------------

def offline_mailbox() -> InMemoryEmail:
    return InMemoryEmail([
        {"from": "ana@example.org", "to": "me@example.com", "subject": "Review", "body": "Please review."},
        {"from": "billing@example.net", "to": "me@example.com", "subject": "Invoice", "body": "x" * 25_000,
         "attachments": ["invoice.pdf"]},
        {"from": "ana@example.org", "to": "me@example.com", "subject": "Lunch", "body": "Friday?"},
    ])


async def test_in_memory_mailbox_lists_newest_first_and_reads_bounded_bodies():
    agent = service_agent(email_tools(offline_mailbox()))
    first = await agent.call_tool("list_email_messages", max_results=2)
    assert first["items"] == [{"id": "msg-3"}, {"id": "msg-2"}]
    second = await agent.call_tool("list_email_messages", max_results=2, page_token=first["next_page_token"])
    assert second == {"items": [{"id": "msg-1"}], "next_page_token": None}
    invoice = await agent.call_tool("read_email", message_id="msg-2")
    assert len(invoice["body"]) == 20_000 and invoice["body_truncated"] is True
    assert invoice["has_attachments"] is True and invoice["html_body_omitted"] is False
    assert invoice["headers"]["from"] == "billing@example.net"


async def test_in_memory_search_matches_sender_subject_and_body():
    agent = service_agent(email_tools(offline_mailbox()))
    assert (await agent.call_tool("list_email_messages", query="ANA@"))["items"] == [{"id": "msg-3"}, {"id": "msg-1"}]
    assert (await agent.call_tool("list_email_messages", query="friday"))["items"] == [{"id": "msg-3"}]


async def test_in_memory_drafts_and_sending_are_recorded_not_delivered():
    mailbox = offline_mailbox()
    agent = service_agent(email_tools(mailbox, allow_write=True, allow_send=True))
    draft = await agent.call_tool("create_email_draft", **GOOD)
    sent = await agent.call_tool("send_email", **GOOD)
    assert draft["status"] == "drafted" and sent["status"] == "accepted"
    assert sent["accepted"] == ["bob@example.com"] and sent["refused"] == []
    assert [d["subject"] for d in mailbox.drafts] == ["Lunch?"] and len(mailbox.sent) == 1
    assert sent["message_id"].startswith("<") and sent["message_id"].endswith("@example.com>")


@pytest.mark.parametrize("subject", ["=?utf-8?q?Report=0D=0ABcc:_eve@example.com?=", "x=?y?q?z?= glued"])
def test_a_message_is_never_composed_with_a_subject_other_than_the_one_given(subject):
    with pytest.raises(ValueError, match="would not be sent as written"):
        compose("me@example.com", ["bob@example.com"], subject, "hello")
    sent = compose("me@example.com", ["bob@example.com"], "Café =? and ?= stay", "hello")
    assert email.message_from_bytes(sent.as_bytes(), policy=email.policy.default)["Subject"] == "Café =? and ?= stay"
