"""The inference loop: model step -> tool calls through the agent -> results in history -> next step.

It drives an agent through its public face (``llm``, ``call_tool``, ``tool_schemas``,
``new_run``, the event bus's redaction) and never imports the agent's module: ``Agent.run``
calls it, with the agent as its first argument.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from protolink.errors import BudgetExceededError, ProtoLinkError

from .events import EventBus
from .models import Message, Model
from .runs import RunContext
from .tools import jsonable


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
    """Drive ``agent.llm`` until it answers with text, bounded by ``max_steps`` and the run budget.

    Tool failures that the model can act on (bad arguments, denial, tool errors) go back into
    history as tool results; budget exhaustion and cancellation end the run.
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
            run.check_time()
            response = await agent.llm.complete(messages, agent.tool_schemas())
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


async def _tool_result(agent: Driven, run: RunContext, name: str, arguments: dict[str, Any]) -> str:
    try:
        result = await agent.call_tool(name, context=run, **arguments)
    except BudgetExceededError:
        raise
    except (ProtoLinkError, ValueError, RuntimeError, PermissionError, LookupError) as error:
        return json.dumps({"error": type(error).__name__, "message": str(error)})
    return json.dumps(agent.events.redact({"result": jsonable(result)})["result"], ensure_ascii=False)
