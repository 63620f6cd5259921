"""Shared by the calendar/email tool and service backend tests: recorded fixtures, an agent."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx

from protolink import (
    Agent,
    AgentCard,
    ApprovalDecision,
    ApprovalRequest,
    CapabilityPolicy,
    Tool,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "services"

SERVICE_POLICY = {
    "calendar.read": "allow",
    "email.read": "allow",
    "calendar.write": "require_approval",
    "email.write": "require_approval",
    "email.send": "require_approval",
}


def fixture(name: str) -> dict[str, Any]:
    """A recorded service payload from tests/fixtures/services."""
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


class Replay:
    """An httpx transport answering requests in order and recording them.

    Each answer is an ``httpx.Response`` or a callable receiving the request (for responses
    that must inspect it or misbehave).
    """

    def __init__(self, *answers: httpx.Response | Callable[[httpx.Request], Any]) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.transport = httpx.MockTransport(self._answer)

    async def _answer(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if not self.answers:
            raise AssertionError(f"unexpected request {request.method} {request.url}")
        answer = self.answers.pop(0)
        if callable(answer):
            answer = answer(request)
            if hasattr(answer, "__await__"):
                answer = await answer
        return answer


def ok(name: str, status: int = 200) -> httpx.Response:
    return httpx.Response(status, json=fixture(name))


class Approvals:
    """An approval handler that records requests and answers with a fixed decision."""

    def __init__(self, approve: bool = True) -> None:
        self.approve = approve
        self.requests: list[ApprovalRequest] = []

    async def __call__(self, request: ApprovalRequest, run: Any) -> ApprovalDecision:
        self.requests.append(request)
        return ApprovalDecision(approved=self.approve, request_id=request.request_id)


def service_agent(tools: Iterable[Tool], approvals: Approvals | None = None) -> Agent:
    """An agent with the spec's service policy: reads allowed, writes and sends approved."""
    agent = Agent(AgentCard(name="services"),
                  policy=CapabilityPolicy(SERVICE_POLICY, default_effect="deny"),
                  approval_handler=approvals or Approvals())
    for tool in tools:
        agent.add_tool(tool)
    return agent
