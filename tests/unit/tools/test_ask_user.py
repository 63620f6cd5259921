"""ask_user_tool(): questions, answers, declines, timeouts, budgets, cancellation and events."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from protolink import Agent, AgentCard, CapabilityPolicy
from protolink.core.events import Event
from protolink.core.runs import RunContext
from protolink.errors import BudgetExceededError, DirectCallError, PolicyDeniedError
from protolink.tools import UserInputRequest, ask_user_tool
from protolink.tools.builtins import UserInputResult
from tests.held_loop import DEADLINE_SECONDS, hold_up


def agent_with(callback, **options: Any) -> tuple[Agent, list[Event]]:
    agent = Agent(AgentCard(name="a", description="d", url="runtime://a"),
                  policy=CapabilityPolicy({"user.interact": "allow"}, default_effect="deny"))
    agent.add_tool(ask_user_tool(callback, **options))
    events: list[Event] = []
    agent.events.add_sink(lambda event: events.append(event) if event.type.startswith("user_input.") else None)
    return agent, events


async def test_an_answer_is_returned_exactly_with_correlated_request():
    seen: list[UserInputRequest] = []

    async def answer(request: UserInputRequest) -> str:
        seen.append(request)
        return "  CSV, please  "

    agent, events = agent_with(answer)
    run = RunContext(task_id="task-7")
    result = await agent.call_tool("ask_user", context=run, question="Which format?", options=["JSON", "CSV"])

    request = seen[0]
    assert result == UserInputResult(request.request_id, "answered", "  CSV, please  ")
    assert request.question == "Which format?"
    assert request.options == ("JSON", "CSV") and isinstance(request.options, tuple)
    assert (request.run_id, request.task_id) == (run.run_id, "task-7")
    assert request.action_id == events[0].action_id
    assert [event.type for event in events] == ["user_input.requested", "user_input.answered"]
    assert events[0].data == {"request": request.to_dict()}
    assert events[1].data == {"result": result.to_dict()}
    assert request.to_dict()["options"] == ["JSON", "CSV"]


async def test_a_standalone_call_has_no_task_id_and_free_text_is_allowed():
    seen: list[UserInputRequest] = []

    async def answer(request: UserInputRequest) -> str:
        seen.append(request)
        return "Neither: XML"

    agent, _ = agent_with(answer)
    result = await agent.call_tool("ask_user", question="Which format?", options=["JSON", "CSV"])

    assert seen[0].task_id is None and result.answer == "Neither: XML"


async def test_none_declines_without_an_answer():
    async def decline(request: UserInputRequest) -> None:
        return None

    agent, events = agent_with(decline)
    result = await agent.call_tool("ask_user", question="Proceed?")

    assert (result.status, result.answer) == ("declined", None)
    assert [e.type for e in events] == ["user_input.requested", "user_input.declined"]
    assert events[1].data == {"result": result.to_dict()}


async def test_the_question_timeout_returns_timed_out_and_interrupts_the_callback():
    released = asyncio.Event()

    async def never(request: UserInputRequest) -> str:
        try:
            await asyncio.Event().wait()
        finally:
            released.set()  # pending UI state is released

    agent, events = agent_with(never, timeout_seconds=0.05)
    result = await agent.call_tool("ask_user", question="Still there?")

    assert (result.status, result.answer) == ("timed_out", None)
    assert released.is_set()
    assert [e.type for e in events] == ["user_input.requested", "user_input.timed_out"]
    assert events[1].data == {"request_id": result.request_id}


async def test_an_answer_typed_while_the_loop_was_held_past_the_timeout_is_answered():
    """A blocking step of the caller's held its loop past the question's timeout while the user
    answered on a terminal thread: the answer waits unread behind the timeout's own callback, and
    the question is answered with it instead of timing out."""

    async def typed(request: UserInputRequest) -> str:  # input() offloaded to a thread
        held = hold_up(asyncio.get_running_loop())
        return await asyncio.to_thread(lambda: held.wait(30) and "CSV")

    agent, events = agent_with(typed, timeout_seconds=DEADLINE_SECONDS)
    result = await agent.call_tool("ask_user", question="Which format?")

    assert (result.status, result.answer) == ("answered", "CSV")
    assert [e.type for e in events] == ["user_input.requested", "user_input.answered"]


async def test_the_run_budget_bounds_the_wait_and_raises_the_budget_error():
    async def never(request: UserInputRequest) -> str:
        await asyncio.Event().wait()

    agent, events = agent_with(never, timeout_seconds=300)

    with pytest.raises(BudgetExceededError):
        await agent.call_tool("ask_user", context=RunContext(max_seconds=0.2), question="Still there?")
    assert [e.type for e in events] == ["user_input.requested", "user_input.timed_out"]


async def test_a_callback_exception_is_a_tool_failure():
    async def broken(request: UserInputRequest) -> str:
        raise ConnectionError("UI went away")

    agent, events = agent_with(broken)

    with pytest.raises(RuntimeError, match="UI went away") as caught:
        await agent.call_tool("ask_user", question="Hello?")
    assert isinstance(caught.value.__cause__, ConnectionError)
    assert [e.type for e in events] == ["user_input.requested", "user_input.failed"]
    assert set(events[1].data) == {"request_id"}


async def test_a_timeout_error_inside_the_callback_is_a_failure_not_a_timeout():
    async def broken(request: UserInputRequest) -> str:
        raise TimeoutError("backend timeout")

    agent, events = agent_with(broken)

    with pytest.raises(RuntimeError, match="backend timeout"):
        await agent.call_tool("ask_user", question="Hello?")
    assert events[-1].type == "user_input.failed"


@pytest.mark.parametrize("answer", ["", "   \n", "x" * 11, 42, b"bytes"])
async def test_invalid_answers_are_tool_failures(answer):
    async def reply(request: UserInputRequest) -> Any:
        return answer

    agent, events = agent_with(reply, max_answer_chars=10)

    with pytest.raises(RuntimeError, match="nonblank text"):
        await agent.call_tool("ask_user", question="Hello?")
    assert events[-1].type == "user_input.failed"


async def test_answers_up_to_max_answer_chars_are_kept():
    async def reply(request: UserInputRequest) -> str:
        return "y" * 10

    agent, _ = agent_with(reply, max_answer_chars=10)
    assert (await agent.call_tool("ask_user", question="Hello?")).answer == "y" * 10


async def test_cancellation_interrupts_the_callback():
    started, released = asyncio.Event(), asyncio.Event()

    async def waiting(request: UserInputRequest) -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            released.set()

    agent, events = agent_with(waiting)
    call = asyncio.create_task(agent.call_tool("ask_user", question="Hello?"))
    await asyncio.wait_for(started.wait(), 30)

    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert released.is_set()
    assert [e.type for e in events] == ["user_input.requested", "user_input.canceled"]


@pytest.mark.parametrize(
    "arguments",
    [
        {"question": ""},
        {"question": "  \n "},
        {"question": "q" * 8001},
        {"question": "q", "options": [str(n) for n in range(11)]},
        {"question": "q", "options": ["JSON", "JSON"]},
        {"question": "q", "options": ["JSON", "  "]},
        {"question": "q", "options": ["o" * 501]},
        {"question": "q", "default": "JSON"},
    ],
)
async def test_question_and_option_limits(arguments):
    called = []

    async def reply(request: UserInputRequest) -> str:
        called.append(request)
        return "x"

    agent, _ = agent_with(reply)
    with pytest.raises(ValueError):
        await agent.call_tool("ask_user", **arguments)
    assert called == []


async def test_limits_at_their_bounds_are_accepted():
    async def reply(request: UserInputRequest) -> str:
        return request.options[-1]

    agent, _ = agent_with(reply)
    options = [f"{n}" * 500 for n in range(10)]
    result = await agent.call_tool("ask_user", question="q" * 8000, options=options)
    assert result.answer == options[-1]


async def test_the_capability_is_user_interact_and_policy_applies():
    called = []

    async def reply(request: UserInputRequest) -> str:
        called.append(request)
        return "x"

    tool = ask_user_tool(reply)
    agent = Agent(AgentCard(name="a", description="d", url="runtime://a"),
                  policy=CapabilityPolicy({"user.interact": "deny"}))
    agent.add_tool(tool)

    assert tool.name == "ask_user" and tool.capabilities == ("user.interact",)
    with pytest.raises(PolicyDeniedError):
        await agent.call_tool("ask_user", question="Hello?")
    with pytest.raises(DirectCallError):
        await tool(question="Hello?")
    assert called == []


@pytest.mark.parametrize(("options", "error"), [({"timeout_seconds": 0}, ValueError),
                                                 ({"max_answer_chars": 0}, ValueError)])
async def test_factory_arguments_are_checked(options, error):
    async def reply(request: UserInputRequest) -> str:
        return "x"

    with pytest.raises(error):
        ask_user_tool(reply, **options)
    with pytest.raises(TypeError):
        ask_user_tool("not callable")  # type: ignore[arg-type]
