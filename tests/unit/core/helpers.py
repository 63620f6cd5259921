"""Small tools for exercising the Agent pipeline without any built-in tool."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from protolink import (
    Agent,
    AgentCard,
    Artifact,
    Preparation,
    PreparedTool,
    Tool,
    ToolContext,
)


class EchoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str
    times: int = 1


def echo_tool(capabilities: tuple[str, ...] = ("echo.use",)) -> Tool:
    async def handler(args: EchoArgs, context: ToolContext) -> dict[str, Any]:
        return {"text": args.text * args.times}

    return Tool(name="echo", description="Repeat text.", arguments=EchoArgs, handler=handler,
                capabilities=capabilities, tags=("test",))


def recording_prepared_tool(log: list[str], capabilities: tuple[str, ...] = ("files.write",)) -> PreparedTool:
    """A prepared tool that appends to ``log`` only when it really executes."""

    async def prepare(args: EchoArgs, context: ToolContext) -> Preparation:
        async def execute(ctx: ToolContext) -> str:
            await ctx.emit("record.written", text=args.text)
            log.append(args.text)
            return args.text

        return Preparation(
            execute=execute,
            capabilities=capabilities,
            artifacts=(Artifact("preview", "text to record", {"text": args.text}),),
        )

    return PreparedTool(name="record", description="Record text.", arguments=EchoArgs,
                        prepare=prepare, capabilities=capabilities)


def make_agent(**kwargs: Any) -> Agent:
    return Agent(AgentCard(name="test-agent", description="tests", url="runtime://test"), **kwargs)
