"""A model client for OpenAI-compatible chat-completions servers (``integrations`` extra)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx

from protolink.core.models import Message, ModelResponse, ToolCall
from protolink.errors import ProtoLinkError

ApiKey = str | Callable[[], str | Awaitable[str]] | None


class ModelError(ProtoLinkError, RuntimeError):
    """The model server failed or answered with something that is not a chat completion."""


class OpenAICompatibleModel:
    """Chat completions over HTTP: ``POST {base_url}/chat/completions`` with function tools.

    ``api_key`` is a string, a sync/async callback resolved per request, or None for servers
    without authentication. Responses are bounded by ``max_response_bytes``; redirects are
    not followed and nothing is retried.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str,
        api_key: ApiKey = None,
        timeout_seconds: float = 60.0,
        max_response_bytes: int = 4 * 1024 * 1024,
        transport: httpx.AsyncBaseTransport | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._timeout = timeout_seconds
        self._max_bytes = max_response_bytes
        self._transport = transport
        self._options = dict(options or {})

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> ModelResponse:
        body: dict[str, Any] = {"model": self.model, "messages": [_wire_message(m) for m in messages],
                                **self._options}
        if tools:
            body["tools"] = [{"type": "function", "function": tool} for tool in tools]
        headers = {"Content-Type": "application/json"}
        key = await self._resolve_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        async with httpx.AsyncClient(transport=self._transport, timeout=self._timeout,
                                     follow_redirects=False, trust_env=False) as client:
            try:
                async with client.stream("POST", f"{self.base_url}/chat/completions",
                                         json=body, headers=headers) as response:
                    payload = await _bounded_body(response, self._max_bytes)
            except httpx.HTTPError as error:
                raise ModelError(f"model request failed: {type(error).__name__}") from None
        if response.status_code != 200:
            raise ModelError(f"model server answered HTTP {response.status_code}")
        return _parse_completion(payload)

    async def _resolve_key(self) -> str | None:
        key = self._api_key() if callable(self._api_key) else self._api_key
        return await key if inspect.isawaitable(key) else key


async def _bounded_body(response: httpx.Response, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise ModelError(f"model response exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _wire_message(message: Message) -> dict[str, Any]:
    data: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        data["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        data["tool_call_id"] = message.tool_call_id
    return data


def _parse_completion(payload: bytes) -> ModelResponse:
    try:
        message = json.loads(payload)["choices"][0]["message"]
        calls = tuple(
            ToolCall(call["id"], call["function"]["name"], _arguments(call["function"].get("arguments")))
            for call in message.get("tool_calls") or ()
        )
        return ModelResponse(text=message.get("content") or "", tool_calls=calls)
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise ModelError(f"malformed chat completion: {type(error).__name__}: {error}") from None


def _arguments(raw: str | dict | None) -> dict[str, Any]:
    if raw is None or raw == "":
        return {}
    arguments = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(arguments, dict):
        raise ValueError("tool call arguments must be a JSON object")
    return arguments
