"""The inference loop: model step -> tool calls through the agent -> results in history -> next step.

It drives an agent through its public face (``llm``, ``call_tool``, ``tool_schemas``,
``new_run``, the event bus's redaction) and never imports the agent's module: ``Agent.run``
calls it, with the agent as its first argument.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from protolink.errors import BudgetExceededError, ToolArgumentError

from .events import EventBus
from .models import Message, Model, ModelResponse
from .runs import RunContext
from .tools import RESERVED_ARGUMENT, jsonable


class Driven(Protocol):
    """What the loop uses of an agent."""

    llm: Model | None
    system_prompt: str | None
    events: EventBus

    def new_run(self, *, task_id: str | None = None) -> RunContext: ...

    def tool_schemas(self) -> list[dict[str, Any]]: ...

    async def call_tool(self, name: str, /, *, context: RunContext | None = None, **arguments: Any) -> Any: ...


@dataclass
class RunResult:
    """The final text of a run, its full history and the context that bounded it."""

    text: str
    messages: list[Message] = field(default_factory=list)
    context: RunContext | None = None
    steps: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "steps": self.steps, "messages": [m.to_dict() for m in self.messages]}


async def run_inference(agent: Driven, prompt: str, *, context: RunContext | None, max_steps: int) -> RunResult:
    """Drive ``agent.llm`` until it answers with text, bounded by ``max_steps`` and the run budget
    (a model step is stopped when the run's time is spent).

    Tool failures go back into history as tool results (bad arguments, denial, any error a tool
    raises, redacted as events are); budget exhaustion and cancellation end the run.
    """
    if agent.llm is None:
        raise RuntimeError("this agent has no model: pass llm= to Agent to use run()")
    run = context or agent.new_run()
    messages: list[Message] = []
    if agent.system_prompt:
        messages.append(Message("system", agent.system_prompt))
    messages.append(Message("user", prompt))
    try:
        for step in range(1, max_steps + 1):
            response = await _step(agent.llm, messages, agent.tool_schemas(), run)
            messages.append(Message("assistant", response.text, tool_calls=tuple(response.tool_calls)))
            if not response.tool_calls:
                run.status = "completed"
                return RunResult(response.text, messages, run, step)
            for call in response.tool_calls:
                content = await _tool_result(agent, run, call.name, call.arguments)
                messages.append(Message("tool", content, tool_call_id=call.id, name=call.name))
    except BaseException as error:
        run.status = "canceled" if not isinstance(error, Exception) else "failed"
        raise
    run.status = "failed"
    raise BudgetExceededError(f"run {run.run_id} reached max_steps={max_steps} without a final answer")


async def _step(llm: Model, messages: list[Message], tools: list[dict[str, Any]], run: RunContext) -> ModelResponse:
    """The model's next response, within the run's remaining time."""
    run.check_time()
    scope = asyncio.timeout(run.remaining_seconds())
    try:
        async with scope:
            return await llm.complete(messages, tools)
    except TimeoutError:
        if not scope.expired():  # the model's own
            raise
        raise BudgetExceededError(f"run {run.run_id} exhausted its time budget during a model step") from None


async def _tool_result(agent: Driven, run: RunContext, name: str, arguments: dict[str, Any]) -> str:
    try:
        if RESERVED_ARGUMENT in arguments:
            raise ToolArgumentError(f"{RESERVED_ARGUMENT!r} is not an argument of any tool")
        result = await agent.call_tool(name, context=run, **arguments)
    except BudgetExceededError:
        raise
    except Exception as error:  # the model can act on it: a bad argument, a denial, a missing file
        return json.dumps(agent.events.redact({"error": type(error).__name__, "message": str(error)}),
                          ensure_ascii=False)
    return json.dumps(agent.events.redact({"result": jsonable(result)})["result"], ensure_ascii=False)
