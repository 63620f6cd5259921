"""The inference loop: model step -> tool calls through the agent -> results in history -> next step."""

import asyncio
import json

import pytest

from protolink import BudgetExceededError, CapabilityPolicy, RunContext, Tool, ToolContext
from protolink.llm import Message, ModelResponse, ScriptedModel, ToolCall
from tests.unit.core.helpers import EchoArgs, echo_tool, make_agent, recording_prepared_tool


def last_tool_message(messages: list[Message]) -> dict:
    return json.loads([m for m in messages if m.role == "tool"][-1].content)


async def test_scripted_loop_calls_a_tool_and_continues_from_its_result():
    model = ScriptedModel([
        ModelResponse(tool_calls=(ToolCall("call-1", "echo", {"text": "ab", "times": 3}),)),
        lambda messages: f"the tool said {last_tool_message(messages)['text']}",
    ])
    agent = make_agent(llm=model)
    agent.add_tool(echo_tool())
    result = await agent.run("repeat ab three times")
    assert result.text == "the tool said ababab"
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "assistant"]
    assert result.messages[2].tool_call_id == "call-1"
    assert result.context.status == "completed"
    assert result.context.tool_calls == 1
    # The model saw the tool schemas on each step.
    assert len(model.calls) == 2


async def test_denied_tool_call_goes_back_to_the_model_as_an_error():
    log: list[str] = []
    model = ScriptedModel([
        ModelResponse(tool_calls=(ToolCall("c1", "record", {"text": "x"}),)),
        lambda messages: "gave up: " + last_tool_message(messages)["error"],
    ])
    agent = make_agent(llm=model, policy=CapabilityPolicy({"files.write": "deny"}))
    agent.add_tool(recording_prepared_tool(log))
    result = await agent.run("write x")
    assert result.text == "gave up: PolicyDeniedError"
    assert log == []


async def test_invalid_arguments_from_the_model_are_reported_back():
    model = ScriptedModel([
        ModelResponse(tool_calls=(ToolCall("c1", "echo", {"times": 2}),)),
        lambda messages: last_tool_message(messages)["message"],
    ])
    agent = make_agent(llm=model)
    agent.add_tool(echo_tool())
    result = await agent.run("go")
    assert "text: Field required" in result.text


async def test_the_run_budget_bounds_the_loop():
    calls = ModelResponse(tool_calls=(ToolCall("c", "echo", {"text": "again"}),))
    agent = make_agent(llm=ScriptedModel([calls] * 5))
    agent.add_tool(echo_tool())
    run = RunContext(max_tool_calls=2)
    with pytest.raises(BudgetExceededError):
        await agent.run("loop forever", context=run)
    assert run.tool_calls == 2
    assert run.status == "failed"


async def test_max_steps_ends_a_model_that_never_answers():
    calls = ModelResponse(tool_calls=(ToolCall("c", "echo", {"text": "again"}),))
    agent = make_agent(llm=ScriptedModel([calls] * 5))
    agent.add_tool(echo_tool())
    with pytest.raises(BudgetExceededError, match="max_steps=3"):
        await agent.run("loop", max_steps=3)


async def test_run_without_a_model_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no model"):
        await make_agent().run("hello")


async def test_max_steps_zero_is_zero_steps():
    model = ScriptedModel(["never asked"])
    with pytest.raises(BudgetExceededError, match="max_steps=0"):
        await make_agent(llm=model).run("hello", max_steps=0)
    assert model.calls == []


def failing_tool(error: Exception) -> Tool:
    async def handler(args: EchoArgs, context: ToolContext) -> None:
        raise error

    return Tool(name="fail", description="Fail.", arguments=EchoArgs, handler=handler)


@pytest.mark.parametrize("error", [FileNotFoundError(2, "No such file", "/data/missing.txt"),
                                   TypeError("unsupported operand"), OSError(28, "No space left on device")])
async def test_any_error_a_tool_raises_goes_back_to_the_model(error):
    model = ScriptedModel([
        ModelResponse(tool_calls=(ToolCall("c1", "fail", {"text": "x"}),)),
        lambda messages: "saw " + last_tool_message(messages)["error"],
    ])
    agent = make_agent(llm=model)
    agent.add_tool(failing_tool(error))
    result = await agent.run("go")
    assert result.text == f"saw {type(error).__name__}"
    assert result.context.status == "completed"


async def test_an_argument_named_context_from_the_model_is_an_argument_error():
    model = ScriptedModel([
        ModelResponse(tool_calls=(ToolCall("c1", "echo", {"text": "x", "context": 1}),)),
        lambda messages: last_tool_message(messages)["error"],
    ])
    agent = make_agent(llm=model)
    agent.add_tool(echo_tool())
    assert (await agent.run("go")).text == "ToolArgumentError"


async def test_a_tools_error_message_is_redacted_before_the_model_and_the_result_see_it():
    def redact(value):
        if isinstance(value, dict):
            return {key: redact(item) for key, item in value.items()}
        return value.replace("sk-SECRET", "[redacted]") if isinstance(value, str) else value

    model = ScriptedModel([
        ModelResponse(tool_calls=(ToolCall("c1", "fail", {"text": "x"}),)),
        lambda messages: "done",
    ])
    agent = make_agent(llm=model, redactor=redact)
    agent.add_tool(failing_tool(ValueError("bad token sk-SECRET")))
    result = await agent.run("go")
    assert last_tool_message(result.messages)["message"] == "bad token [redacted]"
    assert "sk-SECRET" not in json.dumps(result.to_dict())


class SlowModel:
    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def complete(self, messages, tools):
        self.started.set()
        await asyncio.Event().wait()


async def test_a_model_step_is_stopped_when_the_runs_time_is_spent():
    run = RunContext(max_seconds=0.2)
    with pytest.raises(BudgetExceededError, match="during a model step"):
        await make_agent(llm=SlowModel()).run("hello", context=run)
    assert run.status == "failed"
