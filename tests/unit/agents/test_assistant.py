"""Assistant: the preset's tool composition and its safe default policy."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from protolink import Agent, ApprovalDeniedError, Assistant, PolicyDeniedError
from protolink.llm import ModelResponse, ScriptedModel, ToolCall
from protolink.tools import InMemoryCalendar, InMemoryEmail

from ..core.helpers import echo_tool
from ..tools.service_support import Approvals

WEEK = {"start": "2025-03-01T00:00:00+01:00", "end": "2025-03-08T00:00:00+01:00"}
LUNCH = {"to": ["bob@example.com"], "subject": "Lunch?", "body": "Friday at noon?"}


def calendar() -> InMemoryCalendar:
    return InMemoryCalendar([{"title": "Standup", "start": "2025-03-03T09:00:00+01:00",
                              "end": "2025-03-03T09:15:00+01:00"}])


def mailbox() -> InMemoryEmail:
    return InMemoryEmail([{"from": "ana@example.org", "to": "me@example.com", "subject": "Review",
                           "body": "Please review."}])


def test_clock_and_calculator_are_always_present():
    assert sorted(Assistant().tools) == ["calculator", "current_datetime"]


def test_backends_add_read_tools_and_writes_only_on_request():
    assistant = Assistant(calendar=calendar(), email=mailbox())
    assert sorted(assistant.tools) == ["calculator", "current_datetime", "list_calendar_events",
                                       "list_email_messages", "read_email"]
    writable = Assistant(calendar=calendar(), email=mailbox(), allow_write=True, allow_send=True)
    assert {"create_calendar_event", "create_email_draft", "send_email"} <= set(writable.tools)


async def test_reads_need_no_approval():
    approvals = Approvals()
    assistant = Assistant(calendar=calendar(), email=mailbox(), approval_handler=approvals)
    events = await assistant.call_tool("list_calendar_events", **WEEK)
    assert [e["title"] for e in events["items"]] == ["Standup"]
    [item] = (await assistant.call_tool("list_email_messages"))["items"]
    assert (await assistant.call_tool("read_email", message_id=item["id"]))["headers"]["subject"] == "Review"
    assert (await assistant.call_tool("calculator", expression="(18 + 6) / 3"))["result"] == 8
    assert approvals.requests == []


async def test_writes_and_sends_fail_closed_without_an_approval_handler():
    box = mailbox()
    assistant = Assistant(calendar=calendar(), email=box, allow_write=True, allow_send=True)
    with pytest.raises(ApprovalDeniedError):
        await assistant.call_tool("send_email", **LUNCH)
    with pytest.raises(ApprovalDeniedError):
        await assistant.call_tool("create_email_draft", **LUNCH)
    with pytest.raises(ApprovalDeniedError):
        await assistant.call_tool("create_calendar_event", title="Dentist", start="2025-03-05T14:00:00Z",
                                  end="2025-03-05T15:00:00Z")
    assert box.sent == [] and box.drafts == []


async def test_approved_sends_carry_their_preview():
    box, approvals = mailbox(), Approvals()
    assistant = Assistant(email=box, allow_send=True, approval_handler=approvals)
    assert (await assistant.call_tool("send_email", **LUNCH))["status"] == "accepted"
    [request] = approvals.requests
    assert request.capabilities == ("email.send",) and request.artifacts[0].content["arguments"] == LUNCH


async def test_unlisted_capabilities_are_denied():
    assistant = Assistant()
    assistant.add_tool(echo_tool(("network.write",)))
    with pytest.raises(PolicyDeniedError):
        await assistant.call_tool("echo", text="hi")


def git_repository(path: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "notes.txt").write_text("hello\n")
    return path


async def test_shell_and_git_ask_before_running_and_git_writes_are_opt_in(tmp_path: Path):
    repo, approvals = git_repository(tmp_path / "repo"), Approvals()
    assistant = Assistant(shell_cwd=str(repo), git_cwd=str(repo), approval_handler=approvals)
    output = await assistant.call_tool("run_shell", command="cat notes.txt | tr a-z A-Z")
    assert output.stdout == "HELLO\n"
    status = await assistant.call_tool("git", operation="status")
    assert "notes.txt" in status.stdout
    assert [r.action.tool for r in approvals.requests] == ["run_shell", "git"]
    with pytest.raises(ValueError):
        await assistant.call_tool("git", operation="add", paths=["notes.txt"])
    writable = Assistant(git_cwd=str(repo), allow_git_write=True, approval_handler=approvals)
    await writable.call_tool("git", operation="add", paths=["notes.txt"])
    assert approvals.requests[-1].capabilities == ("process.execute", "git.write")


async def test_user_questions_are_allowed_and_the_model_continues_with_the_answer():
    async def answer(request) -> str:
        return "Tuesday"

    def continue_with_answer(messages) -> str:
        return f"Booked for {json.loads(messages[-1].content)['answer']}."

    model = ScriptedModel([
        ModelResponse(tool_calls=(ToolCall("c1", "ask_user", {"question": "Which day?",
                                                                "options": ["Monday", "Tuesday"]}),)),
        continue_with_answer,
    ])
    assistant = Assistant(ask_user=answer, llm=model)
    result = await assistant.run("Book a meeting")
    assert result.text == "Booked for Tuesday."


def test_a_saved_assistant_loads_as_an_agent_with_its_configured_tools_unattached():
    saved = Assistant(calendar=calendar()).to_dict()
    loaded = Assistant.from_dict(saved)
    assert type(loaded) is Agent
    assert sorted(loaded.tools) == ["calculator", "current_datetime"]
    assert loaded.unattached_tools == ("list_calendar_events",)
    assert loaded.policy.to_dict() == Assistant().policy.to_dict()
