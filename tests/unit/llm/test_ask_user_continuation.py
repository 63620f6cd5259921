"""In the inference loop, the user's answer enters history before the next model step."""

from __future__ import annotations

import json
from collections.abc import Sequence

from protolink import Agent, AgentCard, CapabilityPolicy
from protolink.llm import Message, ModelResponse, ScriptedModel, ToolCall
from protolink.tools import UserInputRequest, ask_user_tool


async def test_the_model_continues_from_the_users_answer():
    asked: list[UserInputRequest] = []

    async def user(request: UserInputRequest) -> str:
        asked.append(request)
        return "CSV"

    def continue_from_answer(history: Sequence[Message]) -> ModelResponse:
        tool_message = history[-1]
        assert tool_message.role == "tool" and tool_message.tool_call_id == "call-1"
        answer = json.loads(tool_message.content)
        return ModelResponse(text=f"Exporting as {answer['answer']} ({answer['status']}).")

    model = ScriptedModel([
        ModelResponse(tool_calls=(ToolCall("call-1", "ask_user", {"question": "Which format?",
                                                                  "options": ["JSON", "CSV"]}),)),
        continue_from_answer,
    ])
    agent = Agent(AgentCard(name="a", description="d", url="runtime://a"), llm=model,
                  policy=CapabilityPolicy({"user.interact": "allow"}, default_effect="deny"))
    agent.add_tool(ask_user_tool(user))

    result = await agent.run("Export my data")

    assert result.text == "Exporting as CSV (answered)."
    assert [message.role for message in result.messages] == ["user", "assistant", "tool", "assistant"]
    assert asked[0].question == "Which format?" and asked[0].run_id == result.context.run_id
    assert len(model.calls) == 2 and model.calls[1][-1].role == "tool"  # the answer came before step two
