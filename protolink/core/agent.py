"""Agent: registered tools behind one authorization pipeline.

Every call takes the same path::

    validate arguments -> prepare (capabilities + exact preview) -> policy -> approval
    -> budget checks -> execute -> typed result -> events
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from protolink.errors import (
    ApprovalDeniedError,
    BudgetExceededError,
    PolicyDeniedError,
    ToolNotFoundError,
)

from .approvals import ApprovalDecision, ApprovalHandler, ApprovalRequest
from .cards import AgentCard
from .events import EventBus, Redactor
from .ids import new_id
from .inference import RunResult, run_inference
from .policy import CapabilityPolicy, Policy
from .runs import RunContext
from .tools import Action, Tool, ToolContext, capability_names, jsonable

if TYPE_CHECKING:
    from .models import Model


class Agent:
    """An agent: a card, tools, a capability policy, an approval handler and an event stream.

    ``policy`` defaults to allow-everything (the spec's backward-compatible default).
    ``max_tool_calls`` and ``max_run_seconds`` configure the budget of each new run.
    ``redactor`` rewrites every event payload and report before it leaves the runtime.
    """

    def __init__(
        self,
        card: AgentCard,
        *,
        policy: Policy | None = None,
        approval_handler: ApprovalHandler | None = None,
        llm: Model | None = None,
        redactor: Redactor | None = None,
        max_tool_calls: int | None = None,
        max_run_seconds: float | None = None,
        max_steps: int = 20,
        system_prompt: str | None = None,
    ) -> None:
        self.card = card
        self.policy: Policy = policy if policy is not None else CapabilityPolicy()
        self.approval_handler = approval_handler
        self.llm = llm
        self.events = EventBus(redactor)
        self.max_tool_calls = max_tool_calls
        self.max_run_seconds = max_run_seconds
        self.max_steps = max_steps
        self.system_prompt = system_prompt
        self.tools: dict[str, Tool] = {}
        #: Configured tools named in a loaded configuration that must be registered again.
        self.unattached_tools: tuple[str, ...] = ()

    # -- registration -------------------------------------------------------------------

    def add_tool(self, tool: Tool) -> None:
        """Register a tool; names are unique within an agent."""
        if not isinstance(tool, Tool):
            raise TypeError(f"expected a Tool, got {type(tool).__name__}")
        if tool.name in self.tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self.tools[tool.name] = tool
        self.unattached_tools = tuple(name for name in self.unattached_tools if name != tool.name)

    def remove_tool(self, name: str) -> None:
        self._tool(name)
        del self.tools[name]

    def tool_schemas(self) -> list[dict[str, Any]]:
        """Model-facing schemas of every registered tool."""
        return [tool.schema() for tool in self.tools.values()]

    def new_run(self, *, task_id: str | None = None) -> RunContext:
        """A fresh RunContext carrying this agent's configured budgets."""
        return RunContext(task_id=task_id, max_tool_calls=self.max_tool_calls,
                          max_seconds=self.max_run_seconds)

    # -- the call pipeline -------------------------------------------------------------

    async def call_tool(self, name: str, /, *, context: RunContext | None = None, **arguments: Any) -> Any:
        """Validate, prepare, authorize, budget and execute one tool call; return its result."""
        tool = self._tool(name)
        run = context or self.new_run()
        run.check_time()
        args = tool.validate(arguments)
        action_id = new_id("act")
        tool_context = ToolContext(run, action_id, self.events)
        preparation = await tool.prepare(args, tool_context)
        action = Action(
            action_id=action_id,
            tool=tool.name,
            arguments=args.model_dump(mode="json"),
            capabilities=capability_names(preparation.capabilities),
            artifacts=tuple(preparation.artifacts),
            process=preparation.process,
            run_id=run.run_id,
            task_id=run.task_id,
        )
        ids = {"run_id": run.run_id, "task_id": run.task_id, "action_id": action_id}
        await self.events.publish("action.requested", {"action": action.to_dict()}, **ids)
        try:
            await self._authorize(action, run)
            run.begin_tool_call()
        except (PolicyDeniedError, ApprovalDeniedError) as error:
            await self.events.publish("action.denied", {"tool": tool.name, "reason": str(error)}, **ids)
            raise
        except asyncio.CancelledError:
            await self._canceled(run, tool.name, None, ids)
            raise
        except Exception as error:  # the budget, or the approval handler's own failure
            await self._failed(error, tool.name, ids)
            raise
        await self.events.publish("action.started", {"tool": tool.name}, **ids)
        try:
            result = await preparation.execute(tool_context)
        except asyncio.CancelledError as cancel:
            await self._canceled(run, tool.name, getattr(cancel, "result", None), ids)
            raise
        except Exception as error:
            await self._failed(error, tool.name, ids)
            raise
        await self.events.publish("action.completed", {"tool": tool.name, "result": jsonable(result)}, **ids)
        return result

    async def _authorize(self, action: Action, run: RunContext) -> None:
        effect = self.policy.evaluate(action.capabilities)
        if effect == "allow":
            return
        if effect == "deny":
            raise PolicyDeniedError(
                f"policy denies {action.tool} (capabilities: {', '.join(action.capabilities)})"
            )
        if self.approval_handler is None:
            raise ApprovalDeniedError(
                f"{action.tool} requires approval but the agent has no approval handler"
            )
        request = ApprovalRequest(action=action, capabilities=action.capabilities, run_id=run.run_id,
                                  task_id=run.task_id, action_id=action.action_id)
        ids = {"run_id": run.run_id, "task_id": run.task_id, "action_id": action.action_id}
        await self.events.publish("action.approval_requested", {"request": request.to_dict()}, **ids)
        scope = asyncio.timeout(run.remaining_seconds())
        try:
            async with scope:
                answer = await self.approval_handler(request, run)
        except TimeoutError:
            if not scope.expired():  # the handler's own
                raise
            raise BudgetExceededError(
                f"run {run.run_id} exhausted its time budget while awaiting approval"
            ) from None
        decision = _decision(answer, request)
        if not decision.approved:
            reason = f": {decision.reason}" if decision.reason else ""
            raise ApprovalDeniedError(f"approval declined for {action.tool}{reason}")
        await self.events.publish(
            "action.approved",
            {"request_id": request.request_id, "approver": decision.approver, "reason": decision.reason},
            **ids,
        )

    async def _canceled(self, run: RunContext, tool: str, partial: Any, ids: Mapping[str, Any]) -> None:
        run.status = "canceled"
        await asyncio.shield(self.events.publish(
            "action.canceled", {"tool": tool, "partial_result": jsonable(partial)}, **ids))

    async def _failed(self, error: Exception, tool: str, ids: Mapping[str, Any]) -> None:
        await self.events.publish(
            "action.failed", {"tool": tool, "error": type(error).__name__, "message": str(error)}, **ids
        )

    def _tool(self, name: str) -> Tool:
        try:
            return self.tools[name]
        except KeyError:
            if name in self.unattached_tools:
                raise ToolNotFoundError(
                    f"tool {name!r} was configured when this agent was saved; configured tools "
                    "are not serialized: register its factory again after loading"
                ) from None
            raise ToolNotFoundError(f"no tool named {name!r} is registered") from None

    # -- inference ---------------------------------------------------------------------

    async def run(self, prompt: str, *, context: RunContext | None = None,
                  max_steps: int | None = None) -> RunResult:
        """Run the inference loop: model step, tool calls through call_tool, repeat."""
        return await run_inference(self, prompt, context=context,
                                   max_steps=self.max_steps if max_steps is None else max_steps)

    # -- serialization -----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        from .serialization import agent_to_dict

        return agent_to_dict(self)

    def to_yaml(self) -> str:
        from .serialization import dump_yaml

        return dump_yaml(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, policy: Policy | None = None,
                  approval_handler: ApprovalHandler | None = None, llm: Model | None = None,
                  redactor: Redactor | None = None, tools: Iterable[Tool] = ()) -> Agent:
        """Load a configuration; callbacks, backends and configured tools are supplied here."""
        from .serialization import agent_from_dict

        return agent_from_dict(cls, data, policy=policy, approval_handler=approval_handler, llm=llm,
                               redactor=redactor, tools=tools)

    @classmethod
    def from_yaml(cls, text: str, **overrides: Any) -> Agent:
        from .serialization import load_yaml

        return cls.from_dict(load_yaml(text), **overrides)


def _decision(answer: ApprovalDecision | bool, request: ApprovalRequest) -> ApprovalDecision:
    if isinstance(answer, bool):
        return ApprovalDecision(approved=answer, request_id=request.request_id)
    if not isinstance(answer, ApprovalDecision):
        raise ApprovalDeniedError(
            f"approval handler returned {type(answer).__name__}; expected ApprovalDecision or bool"
        )
    if answer.request_id != request.request_id:
        raise ApprovalDeniedError(
            f"approval decision answers request {answer.request_id!r}, not {request.request_id!r}"
        )
    return answer
