"""Command execution through an Agent: approval with the exact preview, then a typed result.

Runs offline; no model or server is needed::

    python examples/command_agent.py

Every process.execute call requires approval. This demonstration's callback prints the exact
resolved command it is shown (argv, cwd, environment, limits, execution boundary) and
approves it; a real application presents the preview in its authenticated UI instead.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile

from protolink import Agent, AgentCard, ApprovalDecision, ApprovalRequest, CapabilityPolicy, RunContext
from protolink.tools.builtins import process_tool


async def show_and_approve(request: ApprovalRequest, run: RunContext) -> ApprovalDecision:
    print(f"approval requested for {request.action.tool} ({', '.join(request.capabilities)}):")
    for artifact in request.artifacts:
        print(json.dumps(artifact.content, indent=2))
    return ApprovalDecision(approved=True, request_id=request.request_id, approver="example")


async def main() -> None:
    agent = Agent(
        AgentCard(name="commands", description="Command execution", url="runtime://commands"),
        policy=CapabilityPolicy({"process.execute": "require_approval"}),
        approval_handler=show_and_approve,
    )
    agent.add_tool(process_tool())
    agent.events.add_sink(
        lambda event: print(f"  [{event.data['channel']}] {event.data['text']!r}")
        if event.type == "process.output" else None
    )
    with tempfile.TemporaryDirectory() as directory:
        result = await agent.call_tool(
            "execute_command",
            argv=[sys.executable, "-c", "print('hello')"],
            cwd=directory,
            env={},
            timeout_seconds=10,
            max_output_bytes=4096,
        )
    print(result.exit_code, repr(result.stdout), result.truncated)


if __name__ == "__main__":
    asyncio.run(main())
