"""The Assistant preset offline: shell, all six Git operations, a model that asks the user a
question and continues with the answer, an in-memory calendar and mailbox, clock and calculator.

Runs in a temporary Git repository with a scripted model; nothing leaves the machine::

    python examples/builtin_assistants.py

The Assistant allows reads, and asks before writes, sends, shell commands and Git. This
demonstration approves automatically while printing what it was asked to approve; a real
application shows the request in its own authenticated UI.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from protolink import ApprovalRequest, Assistant, RunContext
from protolink.llm import Message, ModelResponse, ScriptedModel, ToolCall
from protolink.tools import InMemoryCalendar, InMemoryEmail, UserInputRequest


async def approve_and_show(request: ApprovalRequest, run: RunContext) -> bool:
    action = request.action
    shown = shlex.join(action.process["argv"]) if action.process else json.dumps(action.arguments)
    print(f"  approved {action.tool} ({', '.join(request.capabilities)}): {shown}")
    return True


async def answer_from_user(request: UserInputRequest) -> str | None:
    """The application's UI would ask a person; this demonstration answers itself."""
    print(f"  user asked: {request.question} options={list(request.options)} -> answering 'Thursday'")
    return "Thursday"


def show(label: str, value: Any) -> None:
    print(f"  {label}: {json.dumps(value, ensure_ascii=False)}")


def last_tool_result(messages: Sequence[Message]) -> dict[str, Any]:
    return json.loads(messages[-1].content)


def book_the_answered_day(messages: Sequence[Message]) -> ModelResponse:
    """Model step 2: continue from the user's answer by creating the event on that day."""
    day = last_tool_result(messages)["answer"]
    start = {"Tuesday": "2025-03-04", "Thursday": "2025-03-06"}[day]
    return ModelResponse(tool_calls=(ToolCall("call-2", "create_calendar_event", {
        "title": "Deck review", "start": f"{start}T15:00:00+01:00", "end": f"{start}T15:30:00+01:00"}),))


def confirm(messages: Sequence[Message]) -> str:
    """Model step 3: the final answer, citing what the tool returned."""
    event = last_tool_result(messages)
    return f"Booked '{event['title']}' on {event['start']} (event {event['id']})."


def scripted_model() -> ScriptedModel:
    return ScriptedModel([
        ModelResponse(tool_calls=(ToolCall("call-1", "ask_user", {
            "question": "Which day works for the deck review?", "options": ["Tuesday", "Thursday"]}),)),
        book_the_answered_day,
        confirm,
    ])


def git_repository(root: Path) -> Path:
    repo = root / "project"
    repo.mkdir()
    for command in (["init", "-q"], ["config", "user.name", "Demo"], ["config", "user.email", "demo@example.com"]):
        subprocess.run(["git", *command], cwd=repo, check=True)
    (repo / "README.md").write_text("# Project\n", encoding="utf-8")
    return repo


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="protolink-assistant-") as temporary:
        repo = git_repository(Path(temporary))
        calendar = InMemoryCalendar([
            {"title": "Standup", "start": "2025-03-03T09:00:00+01:00", "end": "2025-03-03T09:15:00+01:00"},
            {"title": "Company offsite", "start": "2025-03-04", "end": "2025-03-05", "location": "Lakeside"},
        ])
        mailbox = InMemoryEmail([
            {"from": "ana@example.org", "to": "me@example.com", "subject": "Review the deck",
             "body": "Could we review the Q1 deck this week?", "date": "Fri, 28 Feb 2025 10:00:00 +0100"},
        ])
        assistant = Assistant(
            calendar=calendar, email=mailbox, allow_write=True, allow_send=True,
            shell_cwd=str(repo), git_cwd=str(repo), allow_git_write=True, ask_user=answer_from_user,
            llm=scripted_model(), approval_handler=approve_and_show)
        print("tools:", ", ".join(sorted(assistant.tools)))

        print("\n== clock and calculator")
        now = await assistant.call_tool("current_datetime", timezone="Europe/Zurich")
        show("current_datetime", {key: now[key] for key in ("timezone", "weekday")})
        show("calculator", await assistant.call_tool("calculator", expression="(18 + 6) / 3"))

        print("\n== shell")
        result = await assistant.call_tool("run_shell", command="printf 'pear\\napple\\n' | sort > fruit.txt && cat fruit.txt")
        show("run_shell", {"exit_code": result.exit_code, "stdout": result.stdout})

        print("\n== git: status, add, diff, commit, log, show")
        show("status", (await assistant.call_tool("git", operation="status")).stdout)
        await assistant.call_tool("git", operation="add", paths=["README.md", "fruit.txt"])
        diff = await assistant.call_tool("git", operation="diff", staged=True)
        show("diff --staged", [line for line in diff.stdout.splitlines() if line.startswith("+++")])
        show("commit", (await assistant.call_tool("git", operation="commit", message="Add fruit list")).exit_code)
        show("log", (await assistant.call_tool("git", operation="log", max_count=1)).stdout.splitlines()[-1].strip())
        shown = await assistant.call_tool("git", operation="show", paths=["fruit.txt"])
        show("show", [line for line in shown.stdout.splitlines() if line.startswith("+") and not line.startswith("+++")])

        print("\n== in-memory calendar and mailbox")
        week = await assistant.call_tool("list_calendar_events", start="2025-03-03T00:00:00+01:00",
                                         end="2025-03-08T00:00:00+01:00")
        show("this week", [(event["title"], event["start"]) for event in week["items"]])
        [item] = (await assistant.call_tool("list_email_messages", query="deck"))["items"]
        message = await assistant.call_tool("read_email", message_id=item["id"])
        show("read", {"from": message["headers"]["from"], "body": message["body"]})
        show("draft", await assistant.call_tool("create_email_draft", to=["ana@example.org"], subject="Re: Review the deck",
                                                body="Thursday works for me."))

        print("\n== the model asks the user, then continues with the answer")
        run = await assistant.run("Find a slot for the deck review with Ana.")
        print(f"  model: {run.text}")
        sent = await assistant.call_tool("send_email", to=["ana@example.org"], subject="Deck review",
                                         body=run.text)
        show("sent (recorded, not delivered)", {"status": sent["status"], "outbox": len(mailbox.sent)})


if __name__ == "__main__":
    asyncio.run(main())
