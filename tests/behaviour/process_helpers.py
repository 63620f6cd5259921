"""Shared pieces of the process, shell and git suites: an observed Agent and backend-side setup."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

from protolink import (
    Agent,
    AgentCard,
    ApprovalDecision,
    ApprovalRequest,
    CapabilityPolicy,
    Event,
)
from protolink.execution.process_types import ProcessResult, ProcessSpec
from protolink.tools.builtins.process import PROCESS_EXECUTE


@dataclass
class Observed:
    """An Agent whose approval requests and events are recorded."""

    agent: Agent
    requests: list[ApprovalRequest] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def of_type(self, type: str) -> list[Event]:
        return [event for event in self.events if event.type == type]

    def types(self) -> list[str]:
        return [event.type for event in self.events]


def observed_agent(*tools: Any, approve: bool = True, policy: CapabilityPolicy | None = None,
                   approval_delay: float = 0.0, **agent_options: Any) -> Observed:
    """An Agent requiring approval for process.execute (unless ``policy``), recording everything."""
    observed: Observed

    async def approval(request: ApprovalRequest, context: Any) -> ApprovalDecision:
        observed.requests.append(request)
        await asyncio.sleep(approval_delay)
        return ApprovalDecision(approved=approve, request_id=request.request_id)

    agent = Agent(
        AgentCard(name="commands", description="process tests", url="runtime://commands"),
        policy=policy or CapabilityPolicy({PROCESS_EXECUTE: "require_approval"}),
        approval_handler=approval,
        **agent_options,
    )
    observed = Observed(agent)
    agent.events.add_sink(observed.events.append)
    for tool in tools:
        agent.add_tool(tool)
    return observed


class Silent:
    """An emitter for setup commands whose events nobody reads."""

    async def emit(self, type: str, **data: Any) -> None:
        return None


async def sh(backend: Any, cwd: os.PathLike[str] | str, script: str) -> ProcessResult:
    """Run setup ``script`` with /bin/sh through the backend itself, so files belong to it."""
    spec = ProcessSpec(("/bin/sh", "-c", script), str(cwd), {"PATH": "/usr/bin:/bin"}, 60, 1 << 20)
    result = await backend.execute(spec, Silent())
    assert result.exit_code == 0, result
    return result
