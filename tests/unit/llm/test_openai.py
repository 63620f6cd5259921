"""The OpenAI-compatible client, through httpx's MockTransport."""

import json

import httpx
import pytest

from protolink.llm import Message, ToolCall
from protolink.llm.openai import ModelError, OpenAICompatibleModel

TOOLS = [{"name": "echo", "description": "Repeat", "parameters": {"type": "object"}}]


def model_answering(handler) -> OpenAICompatibleModel:
    return OpenAICompatibleModel("test-model", base_url="https://llm.test/v1", api_key=lambda: "k-123",
                                 transport=httpx.MockTransport(handler))


async def test_request_shape_and_tool_call_parsing():
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["url"] = str(request.url)
        seen["auth"] = request.headers["authorization"]
        seen["body"] = json.loads(request.content)
        return httpx.Response(200, json={"choices": [{"message": {"content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "echo", "arguments": "{\"text\": \"hi\"}"}}
        ]}}]})

    history = [Message("user", "say hi"),
               Message("assistant", "", tool_calls=(ToolCall("c0", "echo", {"text": "a"}),)),
               Message("tool", "{\"text\": \"a\"}", tool_call_id="c0", name="echo")]
    response = await model_answering(handler).complete(history, TOOLS)
    assert response.tool_calls == (ToolCall("call_1", "echo", {"text": "hi"}),)
    assert seen["url"] == "https://llm.test/v1/chat/completions"
    assert seen["auth"] == "Bearer k-123"
    assert seen["body"]["tools"][0] == {"type": "function", "function": TOOLS[0]}
    assert seen["body"]["messages"][1]["tool_calls"][0]["function"]["arguments"] == "{\"text\": \"a\"}"
    assert seen["body"]["messages"][2]["tool_call_id"] == "c0"


async def test_text_answer():
    def handler(request):
        return httpx.Response(200, json={"choices": [{"message": {"content": "done"}}]})

    response = await model_answering(handler).complete([Message("user", "x")], [])
    assert (response.text, response.tool_calls) == ("done", ())


@pytest.mark.parametrize("response", [
    httpx.Response(500, json={"error": "secret server detail"}),
    httpx.Response(302, headers={"location": "https://elsewhere.test/"}),
    httpx.Response(200, content=b"not json"),
    httpx.Response(200, json={"choices": []}),
    httpx.Response(200, json={"choices": [{"message": {"tool_calls": [{"id": "x", "function": {"name": "e", "arguments": "[1]"}}]}}]}),
])
async def test_failures_are_model_errors_without_server_text(response):
    with pytest.raises(ModelError) as raised:
        await model_answering(lambda request: response).complete([Message("user", "x")], [])
    assert "secret server detail" not in str(raised.value)


async def test_oversized_response_is_refused():
    model = OpenAICompatibleModel("m", base_url="https://llm.test/v1", max_response_bytes=100,
                                  transport=httpx.MockTransport(lambda r: httpx.Response(200, content=b"x" * 1000)))
    with pytest.raises(ModelError, match="exceeds 100 bytes"):
        await model.complete([Message("user", "x")], [])
