"""The one call pipeline: validation, policy, approval, budgets, execution, events."""

import asyncio

import pytest
from pydantic import BaseModel

from protolink import (
    ApprovalDecision,
    ApprovalDeniedError,
    BudgetExceededError,
    CapabilityPolicy,
    DirectCallError,
    PolicyDeniedError,
    Preparation,
    PreparedTool,
    RunContext,
    ToolArgumentError,
    Tool,
    ToolNotFoundError,
)
from protolink.core.events import Event
from tests.unit.core.helpers import EchoArgs, echo_tool, make_agent, recording_prepared_tool


async def test_plain_tool_runs_directly_and_through_agent():
    tool = echo_tool()
    assert await tool(text="ab", times=2) == {"text": "abab"}
    agent = make_agent()
    agent.add_tool(tool)
    assert await agent.call_tool("echo", text="x") == {"text": "x"}


async def test_prepared_tool_direct_call_raises_and_does_nothing():
    log: list[str] = []
    with pytest.raises(DirectCallError, match="call_tool"):
        await recording_prepared_tool(log)(text="never")
    assert log == []


async def test_invalid_arguments_name_the_field():
    agent = make_agent()
    agent.add_tool(echo_tool())
    with pytest.raises(ToolArgumentError, match="times") as raised:
        await agent.call_tool("echo", text="x", times="many")
    assert isinstance(raised.value, ValueError)
    with pytest.raises(ValueError, match="extra: Extra inputs are not permitted"):
        await agent.call_tool("echo", text="x", extra=1)


async def test_unknown_tool_and_duplicate_registration():
    agent = make_agent()
    agent.add_tool(echo_tool())
    with pytest.raises(ToolNotFoundError):
        await agent.call_tool("missing")
    with pytest.raises(ValueError, match="already registered"):
        agent.add_tool(echo_tool())


async def test_deny_prevents_execution():
    log: list[str] = []
    agent = make_agent(policy=CapabilityPolicy({"files.*": "deny"}))
    agent.add_tool(recording_prepared_tool(log))
    with pytest.raises(PolicyDeniedError, match="files.write"):
        await agent.call_tool("record", text="secret")
    assert log == []


async def test_require_approval_without_handler_is_a_clear_denial():
    log: list[str] = []
    agent = make_agent(policy=CapabilityPolicy({"files.write": "require_approval"}))
    agent.add_tool(recording_prepared_tool(log))
    with pytest.raises(ApprovalDeniedError, match="no approval handler"):
        await agent.call_tool("record", text="x")
    assert log == []


async def test_approval_sees_exact_preview_and_approves():
    log: list[str] = []
    seen = []

    async def approve(request, context):
        seen.append(request)
        return ApprovalDecision(approved=True, request_id=request.request_id)

    agent = make_agent(policy=CapabilityPolicy({"files.write": "require_approval"}), approval_handler=approve)
    agent.add_tool(recording_prepared_tool(log))
    assert await agent.call_tool("record", text="hello") == "hello"
    assert log == ["hello"]
    (request,) = seen
    assert request.capabilities == ("files.write",)
    assert request.action.arguments == {"text": "hello", "times": 1}
    assert request.artifacts[0].content == {"text": "hello"}
    assert request.to_dict()["action"]["tool"] == "record"
    assert request.action_id == request.action.action_id


async def test_bool_answers_are_accepted_and_decline_prevents_execution():
    log: list[str] = []

    async def decline(request, context):
        return False

    agent = make_agent(policy=CapabilityPolicy({"files.write": "require_approval"}), approval_handler=decline)
    agent.add_tool(recording_prepared_tool(log))
    with pytest.raises(ApprovalDeniedError, match="declined"):
        await agent.call_tool("record", text="x")
    assert log == []


async def test_decision_for_another_request_is_rejected():
    log: list[str] = []

    async def confused(request, context):
        return ApprovalDecision(approved=True, request_id="apr_someone_else")

    agent = make_agent(policy=CapabilityPolicy({"files.write": "require_approval"}), approval_handler=confused)
    agent.add_tool(recording_prepared_tool(log))
    with pytest.raises(ApprovalDeniedError, match="apr_someone_else"):
        await agent.call_tool("record", text="x")
    assert log == []


async def test_tool_call_budget_is_shared_by_calls_with_the_same_context():
    agent = make_agent()
    agent.add_tool(echo_tool())
    run = RunContext(max_tool_calls=2)
    await agent.call_tool("echo", context=run, text="1")
    await agent.call_tool("echo", context=run, text="2")
    with pytest.raises(BudgetExceededError, match="tool-call budget"):
        await agent.call_tool("echo", context=run, text="3")
    assert run.tool_calls == 2
    # A call without a context gets a fresh run.
    assert await agent.call_tool("echo", text="4") == {"text": "4"}


async def test_time_spent_awaiting_approval_counts_against_the_budget():
    log: list[str] = []
    clock = [0.0]

    async def slow_human(request, context):
        clock[0] += 5.0  # the human took five seconds
        return True

    agent = make_agent(policy=CapabilityPolicy({"files.write": "require_approval"}), approval_handler=slow_human)
    agent.add_tool(recording_prepared_tool(log))
    run = RunContext(max_seconds=3.0, clock=lambda: clock[0])
    with pytest.raises(BudgetExceededError, match="time budget"):
        await agent.call_tool("record", context=run, text="late")
    assert log == []


async def test_approval_wait_is_bounded_by_the_remaining_budget():
    log: list[str] = []
    never = asyncio.Event()

    async def absent_human(request, context):
        await never.wait()

    agent = make_agent(policy=CapabilityPolicy({"files.write": "require_approval"}), approval_handler=absent_human)
    agent.add_tool(recording_prepared_tool(log))
    with pytest.raises(BudgetExceededError, match="awaiting approval"):
        await agent.call_tool("record", context=RunContext(max_seconds=0.05), text="x")
    assert log == []


async def test_an_approval_handlers_own_timeout_is_its_failure_not_the_budgets():
    async def timing_out_ui(request, context):
        raise TimeoutError("the approval UI timed out")

    events: list[Event] = []
    agent = make_agent(policy=CapabilityPolicy({"files.write": "require_approval"}), approval_handler=timing_out_ui)
    agent.events.add_sink(events.append)
    agent.add_tool(recording_prepared_tool([]))
    with pytest.raises(TimeoutError, match="approval UI"):
        await agent.call_tool("record", text="x")
    assert [event.type for event in events][-1] == "action.failed"


async def test_a_call_canceled_or_failing_while_awaiting_approval_says_how_it_ended():
    waiting = asyncio.Event()

    async def slow_human(request, context):
        waiting.set()
        await asyncio.Event().wait()

    async def broken_handler(request, context):
        raise KeyError("no such reviewer")

    for handler, ending, status in ((slow_human, "action.canceled", "canceled"),
                                    (broken_handler, "action.failed", "working")):
        events: list[Event] = []
        agent = make_agent(policy=CapabilityPolicy({"files.write": "require_approval"}), approval_handler=handler)
        agent.events.add_sink(events.append)
        agent.add_tool(recording_prepared_tool([]))
        run = RunContext()
        call = asyncio.ensure_future(agent.call_tool("record", context=run, text="x"))
        if handler is slow_human:
            await waiting.wait()
            call.cancel()
        with pytest.raises((asyncio.CancelledError, KeyError)):
            await call
        assert [event.type for event in events][-1] == ending
        assert all(event.action_id == events[0].action_id for event in events)
        assert run.status == status  # a failed call leaves the run to its caller, as a failed tool does


def test_capabilities_given_as_one_string_are_refused():
    with pytest.raises(TypeError, match="not the string 'echo.use'"):
        echo_tool(capabilities="echo.use")


async def test_a_prepared_action_with_capabilities_as_one_string_is_refused_before_authorization():
    log: list[str] = []

    async def prepare(args, context):
        return Preparation(execute=lambda ctx: log.append("ran"), capabilities="files.write")

    agent = make_agent(policy=CapabilityPolicy({"files.write": "deny"}))
    agent.add_tool(PreparedTool(name="record", description="Record.", arguments=EchoArgs, prepare=prepare,
                                capabilities=("files.write",)))
    with pytest.raises(TypeError, match="collection of names"):
        await agent.call_tool("record", text="x")
    assert log == []


def test_a_tool_cannot_take_an_argument_named_context():
    class Shadowing(BaseModel):
        context: str

    with pytest.raises(ValueError, match="'context'"):
        Tool(name="shadow", description="d", arguments=Shadowing, handler=lambda args, ctx: None)


async def test_delegated_calls_count_against_the_parent():
    agent = make_agent()
    agent.add_tool(echo_tool())
    parent = RunContext(max_tool_calls=1)
    child = parent.child(task_id="task-2")
    await agent.call_tool("echo", context=child, text="1")
    with pytest.raises(BudgetExceededError):
        await agent.call_tool("echo", context=parent.child(), text="2")
    assert parent.tool_calls == 1


async def test_cancellation_keeps_native_canceled_state():
    started = asyncio.Event()

    async def prepare(args, context):
        async def execute(ctx):
            started.set()
            await asyncio.sleep(60)

        from protolink import Preparation
        return Preparation(execute=execute, capabilities=())

    from protolink import PreparedTool
    from tests.unit.core.helpers import EchoArgs

    agent = make_agent()
    agent.add_tool(PreparedTool(name="wait", description="", arguments=EchoArgs, prepare=prepare))
    run = RunContext()
    events: list[Event] = []
    agent.events.add_sink(events.append)
    task = asyncio.create_task(agent.call_tool("wait", context=run, text="x"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert run.status == "canceled"
    assert events[-1].type == "action.canceled"


async def test_events_are_ordered_and_correlated():
    log: list[str] = []
    agent = make_agent(policy=CapabilityPolicy({"files.write": "require_approval"}),
                       approval_handler=lambda request, context: asyncio.sleep(0, True))
    agent.add_tool(recording_prepared_tool(log))
    run = RunContext(task_id="task-1")
    events: list[Event] = []
    agent.events.add_sink(events.append)
    await agent.call_tool("record", context=run, text="x")
    assert [e.type for e in events] == [
        "action.requested", "action.approval_requested", "action.approved",
        "action.started", "record.written", "action.completed",
    ]
    assert {e.run_id for e in events} == {run.run_id}
    assert {e.task_id for e in events} == {"task-1"}
    assert len({e.action_id for e in events}) == 1
    assert [e.sequence for e in events] == sorted(e.sequence for e in events)


async def test_failures_and_denials_are_events():
    agent = make_agent(policy=CapabilityPolicy({"files.write": "deny"}))
    agent.add_tool(recording_prepared_tool([]))
    events: list[Event] = []
    agent.events.add_sink(events.append)
    with pytest.raises(PolicyDeniedError):
        await agent.call_tool("record", text="x")
    assert [e.type for e in events] == ["action.requested", "action.denied"]


async def test_subscription_receives_events_as_async_iterator():
    agent = make_agent()
    agent.add_tool(echo_tool())
    subscription = agent.events.subscribe()
    await agent.call_tool("echo", text="x")
    subscription.close()
    types = [event.type async for event in subscription]
    assert types == ["action.requested", "action.started", "action.completed"]


async def test_redaction_applies_before_events_leave():
    def redact(payload):
        return {key: ("[redacted]" if key in {"action", "result"} else value) for key, value in payload.items()}

    agent = make_agent(redactor=redact)
    agent.add_tool(echo_tool())
    events: list[Event] = []
    agent.events.add_sink(events.append)
    await agent.call_tool("echo", text="my password")
    assert all("my password" not in repr(event.to_dict()) for event in events)
    assert events[0].data["action"] == "[redacted]"
